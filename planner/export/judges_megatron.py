"""The megatron-core wheel as the judge of a Megatron export when Megatron-LM's training code is not at hand.

megatron-core ships no `megatron/training/arguments.py`, so the exported flags are read here the way
Megatron-LM's `core_transformer_config_from_args` maps them (flag `--x-y` -> field `x_y`, plus its renames:
--num-experts -> num_moe_experts, --swiglu -> gated_linear_unit, --disable-bias-linear -> add_bias_linear,
--decoder-first/last-pipeline-num-layers -> num_layers_in_first/last_pipeline_stage,
--num-virtual-stages-per-pipeline-rank -> virtual_pipeline_model_parallel_size) and handed to the wheel's own
`TransformerConfig` / `MLATransformerConfig` (whose __post_init__ checks heads vs TP, MoE vs SP, the pipeline
layout and split, recompute) and `ConstantNumMicroBatchesCalculator` (global batch vs micro batch x dp); then the
decoder layers Megatron builds per virtual stage (transformer_block.py get_num_layers_to_build, or the parsed
layout) against the plan's split. --account-for-embedding/loss-in-pipeline-split map to their fields by name.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses

from planner.export.verdicts import JudgeUnavailable, Verdict, first_line, quiet

INT_FLAGS = ("tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
             "expert-model-parallel-size", "micro-batch-size", "global-batch-size", "num-virtual-stages-per-pipeline-rank",
             "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "recompute-num-layers", "num-layers",
             "hidden-size", "ffn-hidden-size", "num-attention-heads", "seq-length", "max-position-embeddings", "vocab-size",
             "kv-channels", "num-query-groups", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
             "moe-shared-expert-intermediate-size", "kv-lora-rank", "q-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
             "v-head-dim", "rotary-base", "moe-router-num-groups", "moe-router-group-topk",
             "rotary-seq-len-interpolation-factor", "mtp-num-layers")
FLOAT_FLAGS = ("moe-expert-capacity-factor", "rotary-percent", "norm-epsilon", "moe-router-topk-scaling-factor",
               "rope-scaling-factor", "rotary-scaling-factor", "mscale", "mscale-all-dim")
STR_FLAGS = ("pipeline-model-parallel-layout", "recompute-granularity", "recompute-method", "normalization",
             "position-embedding-type", "data-parallel-sharding-strategy", "ckpt-format", "fp8-format", "moe-layer-freq",
             "moe-token-dispatcher-type", "softmax-type", "window-size", "window-attn-skip-freq", "moe-router-score-function",
             "no-rope-freq", "rope-type", "moe-flex-dispatcher-backend", "cp-comm-type", "fp8-recipe")
LIST_FLAGS = ("recompute-modules",)
BOOL_FLAGS = ("account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split", "sequence-parallel", "use-distributed-optimizer", "use-megatron-fsdp", "bf16", "swiglu",
              "group-query-attention", "untie-embeddings-and-output-weights", "disable-bias-linear", "moe-grouped-gemm",
              "add-qkv-bias", "qk-layernorm", "multi-latent-attention", "moe-shared-expert-gate", "moe-router-pre-softmax",
              "moe-router-enable-expert-bias", "overlap-moe-expert-parallel-comm", "moe-shared-expert-overlap",
              "use-rope-scaling")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag in INT_FLAGS:
        parser.add_argument("--" + flag, type=int, default=None)
    for flag in FLOAT_FLAGS:
        parser.add_argument("--" + flag, type=float, default=None)
    for flag in STR_FLAGS:
        parser.add_argument("--" + flag, default=None)
    for flag in BOOL_FLAGS:
        parser.add_argument("--" + flag, action="store_true")
    for flag in LIST_FLAGS:
        parser.add_argument("--" + flag, nargs="+", default=None)
    return parser


def _config_kwargs(a: argparse.Namespace) -> dict:
    """core_transformer_config_from_args's reading of the flags we export."""
    import torch

    kw = dict(
        num_layers=a.num_layers, hidden_size=a.hidden_size, ffn_hidden_size=a.ffn_hidden_size,
        num_attention_heads=a.num_attention_heads, kv_channels=a.kv_channels,
        num_query_groups=a.num_query_groups if a.group_query_attention else None,
        tensor_model_parallel_size=a.tensor_model_parallel_size, pipeline_model_parallel_size=a.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=a.num_virtual_stages_per_pipeline_rank,
        context_parallel_size=a.context_parallel_size or 1, cp_comm_type=a.cp_comm_type, expert_model_parallel_size=a.expert_model_parallel_size or 1,
        sequence_parallel=a.sequence_parallel, pipeline_model_parallel_layout=a.pipeline_model_parallel_layout,
        account_for_embedding_in_pipeline_split=a.account_for_embedding_in_pipeline_split or None,
        account_for_loss_in_pipeline_split=a.account_for_loss_in_pipeline_split or None,
        num_layers_in_first_pipeline_stage=a.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=a.decoder_last_pipeline_num_layers,
        recompute_granularity=a.recompute_granularity, recompute_method=a.recompute_method,
        recompute_num_layers=a.recompute_num_layers, recompute_modules=a.recompute_modules, gated_linear_unit=a.swiglu, add_bias_linear=not a.disable_bias_linear,
        add_qkv_bias=a.add_qkv_bias, qk_layernorm=a.qk_layernorm, normalization=a.normalization or "LayerNorm",
        bf16=a.bf16, params_dtype=torch.bfloat16 if a.bf16 else torch.float32, fp8=a.fp8_format,
        pipeline_dtype=torch.bfloat16 if a.bf16 else torch.float32,  # arguments.py: args.pipeline_dtype = args.params_dtype
        layernorm_epsilon=a.norm_epsilon, softmax_type=a.softmax_type,
        window_size=tuple(int(v) for v in a.window_size.strip("()").split(",")) if a.window_size else None,
        window_attn_skip_freq=ast.literal_eval(a.window_attn_skip_freq) if a.window_attn_skip_freq else None,
        no_rope_freq=ast.literal_eval(a.no_rope_freq) if a.no_rope_freq else None,
        mtp_num_layers=a.mtp_num_layers, fp8_recipe=a.fp8_recipe,
    )
    if a.num_experts:
        kw.update(num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                  moe_grouped_gemm=a.moe_grouped_gemm, moe_token_dispatcher_type=a.moe_token_dispatcher_type or "allgather",
                  moe_flex_dispatcher_backend=a.moe_flex_dispatcher_backend,
                  moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
                  moe_expert_capacity_factor=a.moe_expert_capacity_factor, moe_shared_expert_gate=a.moe_shared_expert_gate,
                  moe_router_score_function=a.moe_router_score_function, moe_router_pre_softmax=a.moe_router_pre_softmax,
                  moe_router_topk_scaling_factor=a.moe_router_topk_scaling_factor,
                  moe_router_num_groups=a.moe_router_num_groups, moe_router_group_topk=a.moe_router_group_topk,
                  moe_router_enable_expert_bias=a.moe_router_enable_expert_bias,
                  overlap_moe_expert_parallel_comm=a.overlap_moe_expert_parallel_comm,
                  moe_shared_expert_overlap=a.moe_shared_expert_overlap)
        if a.moe_layer_freq:
            kw["moe_layer_freq"] = ast.literal_eval(a.moe_layer_freq) if a.moe_layer_freq.startswith("[") else int(a.moe_layer_freq)
    if a.multi_latent_attention:
        kw.update(multi_latent_attention=True, q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank,
                  qk_head_dim=a.qk_head_dim, qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim,
                  rope_type=a.rope_type, rotary_scaling_factor=a.rotary_scaling_factor, mscale=a.mscale,
                  mscale_all_dim=a.mscale_all_dim)
    kept = {key: value for key, value in kw.items() if value is not None}
    if a.multi_latent_attention:  # arguments.py: --q-lora-rank defaults to None (full-rank Q), the dataclass to 512
        kept["q_lora_rank"] = a.q_lora_rank
    return kept


def megatron_stage_counts(config, pp: int, vpp: int) -> list[int]:
    """Decoder layers Megatron builds per virtual stage s = v*pp + r: the layout's own parsed table
    (PipelineParallelLayerLayout.layout[pp_rank][vp_stage]), else transformer_block.py get_num_layers_to_build."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        return [layout.layout[s % pp][s // pp].count(LayerType.decoder) for s in range(pp * vpp)]
    return [get_num_layers_to_build(config, vp_stage=s // pp if vpp > 1 else None, pp_rank=s % pp) for s in range(pp * vpp)]


def split_verdict(config, pp: int, vpp: int, stage_layers: list[int] | None) -> Verdict:
    """Whether Megatron builds the plan's decoder layers per virtual stage from the exported flags."""
    if stage_layers is None or pp == 1:
        return Verdict(True)
    try:
        with quiet():
            built = megatron_stage_counts(config, pp, vpp)
    except (AssertionError, ValueError) as exc:
        return Verdict(False, f"get_num_layers_to_build: {first_line(exc)}")
    if built != list(stage_layers):
        return Verdict(False, f"Megatron builds decoder layers per virtual stage {built}, the plan has {list(stage_layers)}")
    return Verdict(True)


def megatron_core_verdict(args: list[str], world: int, stage_layers: list[int] | None = None) -> Verdict:
    """TransformerConfig (or MLATransformerConfig) and the micro-batch calculator of the installed megatron-core;
    with `stage_layers`, the decoder layers per virtual stage Megatron builds must be the plan's (split_verdict)."""
    try:
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig
    except ImportError as exc:
        raise JudgeUnavailable(f"megatron-core is not importable: {exc}") from None
    try:
        a = _parser().parse_args(args)
    except (argparse.ArgumentError, SystemExit) as exc:
        return Verdict(False, f"flag not read by Megatron: {exc}")
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size or 1
    if world % (tp * pp * cp):
        return Verdict(False, f"world size {world} is not divisible by tp*pp*cp={tp * pp * cp}")
    config_class = MLATransformerConfig if a.multi_latent_attention else TransformerConfig
    kwargs = _config_kwargs(a)
    known = {f.name for f in dataclasses.fields(config_class)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        return Verdict(False, f"{config_class.__name__} has no fields {unknown}")
    try:
        with quiet(), _assumed_transformer_engine():
            config = config_class(**kwargs)
            ConstantNumMicroBatchesCalculator(a.global_batch_size, a.micro_batch_size, world // (tp * pp * cp), None, 0)
    except (AssertionError, ValueError, TypeError) as exc:
        return Verdict(False, f"{config_class.__name__}: {first_line(exc)}")
    return split_verdict(config, pp, config.virtual_pipeline_model_parallel_size or 1, stage_layers)


ASSUMED_TE_VERSION = "2.6.0"
"""The Transformer Engine the judge assumes where it is not installed (a CPU machine): TransformerConfig asks
is_te_min_version for fp8 features (layernorm / moe_act recompute under fp8 need >= 2.6.0dev0), which is None
without TE; the stack's own containers ship it (NGC PyTorch 25.x)."""


@contextlib.contextmanager
def _assumed_transformer_engine():
    """TransformerConfig's Transformer Engine version checks answered for ASSUMED_TE_VERSION when TE is absent."""
    from megatron.core.transformer import transformer_config

    if transformer_config.get_te_version() is not None:
        yield
        return
    from packaging.version import Version

    original = transformer_config.is_te_min_version
    transformer_config.is_te_min_version = lambda version, check_equality=True: (
        Version(ASSUMED_TE_VERSION) >= Version(version) if check_equality else Version(ASSUMED_TE_VERSION) > Version(version))
    try:
        yield
    finally:
        transformer_config.is_te_min_version = original


@contextlib.contextmanager
def one_rank_world():
    """A one-rank gloo world on an in-memory store (parallel_state needs a world to carve its groups from)."""
    import torch.distributed as tdist

    if tdist.is_initialized():
        tdist.destroy_process_group()
    tdist.init_process_group("gloo", store=tdist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        tdist.destroy_process_group()


SINGLE_DEVICE = dict(tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
                     expert_model_parallel_size=1, sequence_parallel=False, virtual_pipeline_model_parallel_size=None,
                     pipeline_model_parallel_layout=None, num_layers_in_first_pipeline_stage=None,
                     num_layers_in_last_pipeline_stage=None, recompute_granularity=None, recompute_method=None,
                     recompute_num_layers=None, moe_grouped_gemm=False, fp8=None, perform_initialization=False,
                     use_cpu_initialization=True, moe_token_dispatcher_type="allgather",
                     overlap_moe_expert_parallel_comm=False,  # schedule settings: need ep > 1 / the alltoall
                     moe_shared_expert_overlap=False)  # dispatcher, hold no parameter


def megatron_core_params(args: list[str]) -> int:
    """Parameters of the model the exported flags describe, built by megatron-core's own GPTModel on the meta device
    in a one-rank world (no parallel split, local module spec, SequentialMLP experts: the same parameters as
    GroupedMLP without its CUDA kernel). Counts unique parameters (a tied output layer shares the embedding)."""
    import torch
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_mtp_block_spec
    from megatron.core.transformer import multi_latent_attention as mla_module
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.transformer_config import MLATransformerConfig, TransformerConfig

    a = _parser().parse_args(args)
    config_class = MLATransformerConfig if a.multi_latent_attention else TransformerConfig
    config = config_class(**{**_config_kwargs(a), **SINGLE_DEVICE})
    current_device, core_init = torch.cuda.current_device, DotProductAttention.__init__

    def core_without_mla_channels(self, *args, k_channels=None, v_channels=None, **kwargs):
        core_init(self, *args, **kwargs)  # MLA's local spec passes TE's k/v_channels; the core holds no weights

    with quiet(), one_rank_world():
        parallel_state.initialize_model_parallel(1, 1)
        torch.cuda.current_device = lambda: "meta"  # the learnable softmax offset asks CUDA for its device
        DotProductAttention.__init__ = core_without_mla_channels
        # without Transformer Engine megatron-core leaves a MagicMock as TELinear and HAVE_TE True; MLA isinstance()s it
        have_te, mla_module.HAVE_TE = mla_module.HAVE_TE, isinstance(mla_module.TELinear, type)
        try:
            with torch.device("meta"):
                layer_spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
                mtp = get_gpt_mtp_block_spec(config, layer_spec, use_transformer_engine=False) if a.mtp_num_layers else None
                model = GPTModel(  # pretrain_gpt.py's model_provider, MTP block included where --mtp-num-layers says
                    config=config, transformer_layer_spec=layer_spec, mtp_block_spec=mtp,
                    vocab_size=a.vocab_size, max_sequence_length=a.max_position_embeddings,
                    position_embedding_type=a.position_embedding_type or "learned_absolute",
                    share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights,
                    rotary_percent=a.rotary_percent or 1.0, rotary_base=a.rotary_base or 10000)
            return sum(p.numel() for p in model.parameters())
        finally:
            torch.cuda.current_device, DotProductAttention.__init__ = current_device, core_init
            mla_module.HAVE_TE = have_te
            parallel_state.destroy_model_parallel()
