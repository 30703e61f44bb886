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
import dataclasses

from planner.export.verdicts import JudgeUnavailable, Verdict, first_line, quiet

INT_FLAGS = ("tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size",
             "expert-model-parallel-size", "micro-batch-size", "global-batch-size", "num-virtual-stages-per-pipeline-rank",
             "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers", "recompute-num-layers", "num-layers",
             "hidden-size", "ffn-hidden-size", "num-attention-heads", "seq-length", "max-position-embeddings", "vocab-size",
             "kv-channels", "num-query-groups", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
             "moe-shared-expert-intermediate-size", "kv-lora-rank", "q-lora-rank", "qk-head-dim", "qk-pos-emb-head-dim",
             "v-head-dim")
STR_FLAGS = ("pipeline-model-parallel-layout", "recompute-granularity", "recompute-method", "normalization",
             "position-embedding-type", "data-parallel-sharding-strategy", "ckpt-format", "fp8-format", "moe-layer-freq",
             "moe-token-dispatcher-type")
BOOL_FLAGS = ("account-for-embedding-in-pipeline-split", "account-for-loss-in-pipeline-split", "sequence-parallel", "use-distributed-optimizer", "use-megatron-fsdp", "bf16", "swiglu",
              "group-query-attention", "untie-embeddings-and-output-weights", "disable-bias-linear", "moe-grouped-gemm",
              "add-qkv-bias", "qk-layernorm", "multi-latent-attention")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for flag in INT_FLAGS:
        parser.add_argument("--" + flag, type=int, default=None)
    parser.add_argument("--moe-expert-capacity-factor", type=float, default=None)
    for flag in STR_FLAGS:
        parser.add_argument("--" + flag, default=None)
    for flag in BOOL_FLAGS:
        parser.add_argument("--" + flag, action="store_true")
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
        context_parallel_size=a.context_parallel_size or 1, expert_model_parallel_size=a.expert_model_parallel_size or 1,
        sequence_parallel=a.sequence_parallel, pipeline_model_parallel_layout=a.pipeline_model_parallel_layout,
        account_for_embedding_in_pipeline_split=a.account_for_embedding_in_pipeline_split or None,
        account_for_loss_in_pipeline_split=a.account_for_loss_in_pipeline_split or None,
        num_layers_in_first_pipeline_stage=a.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=a.decoder_last_pipeline_num_layers,
        recompute_granularity=a.recompute_granularity, recompute_method=a.recompute_method,
        recompute_num_layers=a.recompute_num_layers, gated_linear_unit=a.swiglu, add_bias_linear=not a.disable_bias_linear,
        add_qkv_bias=a.add_qkv_bias, qk_layernorm=a.qk_layernorm, normalization=a.normalization or "LayerNorm",
        bf16=a.bf16, params_dtype=torch.bfloat16 if a.bf16 else torch.float32, fp8=a.fp8_format,
        pipeline_dtype=torch.bfloat16 if a.bf16 else torch.float32,  # arguments.py: args.pipeline_dtype = args.params_dtype
    )
    if a.num_experts:
        kw.update(num_moe_experts=a.num_experts, moe_router_topk=a.moe_router_topk, moe_ffn_hidden_size=a.moe_ffn_hidden_size,
                  moe_grouped_gemm=a.moe_grouped_gemm, moe_token_dispatcher_type=a.moe_token_dispatcher_type or "allgather",
                  moe_shared_expert_intermediate_size=a.moe_shared_expert_intermediate_size,
                  moe_expert_capacity_factor=a.moe_expert_capacity_factor)
        if a.moe_layer_freq:
            kw["moe_layer_freq"] = ast.literal_eval(a.moe_layer_freq) if a.moe_layer_freq.startswith("[") else int(a.moe_layer_freq)
    if a.multi_latent_attention:
        kw.update(multi_latent_attention=True, q_lora_rank=a.q_lora_rank, kv_lora_rank=a.kv_lora_rank,
                  qk_head_dim=a.qk_head_dim, qk_pos_emb_head_dim=a.qk_pos_emb_head_dim, v_head_dim=a.v_head_dim)
    return {key: value for key, value in kw.items() if value is not None}


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
        with quiet():
            config = config_class(**kwargs)
            ConstantNumMicroBatchesCalculator(a.global_batch_size, a.micro_batch_size, world // (tp * pp * cp), None, 0)
    except (AssertionError, ValueError, TypeError) as exc:
        return Verdict(False, f"{config_class.__name__}: {first_line(exc)}")
    return split_verdict(config, pp, config.virtual_pipeline_model_parallel_size or 1, stage_layers)
