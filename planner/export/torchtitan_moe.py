"""torchtitan 0.3 config modules for MoE and MLA models: the plan's exact model, built with the family's own builders.

torchtitan 0.3 builds mixture-of-experts decoders in three families (site-packages torchtitan/models/, 0.3.0 wheel):
- qwen3 (qwen3/__init__.py _build_qwen3_moe_layers, qwen3/model.py Qwen3TransformerBlock): GQA attention
  (common/config_utils.py make_gqa_config, optional per-head q/k RMSNorm), per layer either a dense FeedForward or
  an MoE (make_moe_config: make_router_config + make_routed_experts_config, optional shared experts as one
  FeedForward). Qwen3-MoE, Mixtral-style models and any GQA decoder with such layers fit it.
- deepseek_v3 (deepseek_v3/__init__.py build_mla_moe_layers): multi-head latent attention (make_mla_attention_config:
  q_lora_rank 0 = full Q projection), the first n_dense_layers dense, the rest MoE with shared experts of
  moe_hidden_dim * num_shared_experts.
- gpt_oss (gpt_oss/__init__.py _make_gptoss_attn_config, _make_gptoss_experts_config, GptOssMoE): biased QKV and
  output projections, attention sinks, sliding-window layers, biased router and experts (GptOssGroupedExperts).

Each generated module returns the family's registered Trainer.Config with the model replaced by one of the plan's
sizes and the loss vocabulary set to the model's. What a family's builders cannot express is refused, naming it.
RoPE has the spec's theta and its scaling (ModelSpec.rope_scaling: yarn as gpt-oss and DeepSeek-V3 use it) as
RoPE.Config fields (planner.export.rope_scaling; no parameters depend on them). Load balancing is each family's own: auxiliary-loss-free expert bias (common/moe.py MoE,
load_balance_coeff=1e-3, a buffer as HF's e_score_correction_bias is); HF's auxiliary losses (Mixtral, Qwen3-MoE
router_aux_loss_coef) are a training recipe torchtitan's families replace with it, so no parameter differs.
"""

from __future__ import annotations

from planner.export import rope_scaling
from planner.schemas.model import ModelSpec

GENERATED_CONFIG = "planner_model"
# family -> (registered Trainer.Config function the training settings come from, its model_registry flavor)
FAMILY_BASE = {"qwen3": ("qwen3_30b_a3b", "30B-A3B"), "deepseek_v3": ("deepseek_v3_16b", "16B"),
               "gpt_oss": ("gpt_oss_20b", "20b")}


def _common_gaps(spec: ModelSpec) -> dict[str, bool]:
    return {
        f"{spec.norm} (torchtitan's decoders have RMSNorm)": spec.norm != "rmsnorm",
        f"activation {spec.activation!r} (torchtitan's FFNs and experts are SwiGLU)": spec.activation != "swiglu",
        f"position {spec.position!r} (torchtitan's models use RoPE)": spec.position != "rope",
        f"{spec.norms_per_layer} norms per layer": spec.norms_per_layer != 2,
        "partial RoPE": spec.rotary_percent is not None and spec.rotary_percent < 1,
        "layers without RoPE (NoPE)": bool(spec.nope_layers),
        "parallel attention/MLP residual": spec.parallel_residual,
        "an LM-head bias": spec.lm_head_bias,
        "a gated shared expert": spec.moe is not None and spec.moe.shared_expert_gate,
        "expert capacity (torchtitan's MoE is dropless)": spec.moe is not None and spec.moe.capacity_factor is not None,
        "a learned expert-score bias parameter": spec.moe is not None and spec.moe.expert_score_bias == "parameter",
        "chunked attention layers": spec.layer_types is not None and "chunked" in spec.layer_types,
        "a gated attention output (Qwen3-Next)": spec.attention_output_gate,
        "q/k norms after RoPE (its qk_norm runs before RoPE)": spec.qk_norm_after_rope,
        "Granite's activation multipliers": spec.multipliers is not None,
        "RoPE scaling 'linear' or 'dynamic' (torchtitan's RoPE scales 'llama' and 'yarn' only)":
            spec.rope_scaling is not None and spec.rope_scaling.kind in ("linear", "dynamic"),
        "llama3 RoPE scaling (the qwen3 and gpt_oss families' CosSinRoPE raises NotImplementedError for it)":
            spec.rope_scaling is not None and spec.rope_scaling.kind == "llama3" and spec.mla is None,
    }


def family_gaps(spec: ModelSpec) -> tuple[str | None, str | None]:
    """(family that builds `spec`, None) or (None, what keeps every family from building it)."""
    first = next((what for what, present in _common_gaps(spec).items() if present), None)
    if first is not None:
        return None, first
    moe = spec.moe
    if spec.mla is not None:
        gaps = {"MLA without MoE layers (deepseek_v3 builds MLA with MoE)": moe is None,
                "linear biases": spec.linear_bias or spec.qkv_bias or spec.out_bias or spec.mlp_bias,
                "q/k norms": spec.qk_norm, "attention sinks": spec.attention_sinks,
                "sliding-window layers": spec.layer_types is not None and set(spec.layer_types) != {"full"},
                "MoE on every n-th layer (deepseek_v3 has leading dense layers, then MoE)": moe is not None and moe.moe_every != 1,
                "shared experts of their own width": moe is not None and moe.shared_expert_ffn_hidden_size not in
                (None, moe.expert_ffn_hidden_size * moe.num_shared_experts),
                "router or expert biases": moe is not None and (moe.router_bias or moe.expert_bias)}
        return _first("deepseek_v3", gaps)
    if spec.attention_sinks or (moe is not None and (moe.router_bias or moe.expert_bias)):
        gaps = {"attention sinks only with MoE (gpt_oss)": moe is None,
                "attention without biased QKV and output (gpt_oss has both)": not (spec.qkv_bias and spec.out_bias),
                "MLP biases outside the experts": spec.mlp_bias or spec.linear_bias,
                "no attention sinks (gpt_oss has them)": not spec.attention_sinks,
                "router and experts not both biased (gpt_oss biases both)": moe is not None and not (moe.router_bias and moe.expert_bias),
                "q/k norms": spec.qk_norm, "shared experts": moe is not None and moe.num_shared_experts > 0,
                "dense FFN layers": moe is not None and (moe.first_k_dense > 0 or moe.moe_every != 1),
                "chunked attention": spec.layer_types is not None and "chunked" in spec.layer_types}
        return _first("gpt_oss", gaps)
    gaps = {"no MoE layers": moe is None,
            "linear biases": spec.linear_bias or spec.qkv_bias or spec.out_bias or spec.mlp_bias,
            "q/k norms over whole projections": spec.qk_norm and spec.qk_norm_scope == "projection",
            "sliding-window layers": spec.layer_types is not None and set(spec.layer_types) != {"full"}}
    return _first("qwen3", gaps)


def _first(family: str, gaps: dict[str, bool]) -> tuple[str | None, str | None]:
    missing = next((what for what, present in gaps.items() if present), None)
    return (None, f"{missing} (torchtitan's {family} family is the nearest)") if missing else (family, None)


def _constants(spec: ModelSpec, **extra) -> str:
    values = dict(DIM=spec.hidden_size, N_LAYERS=spec.num_layers, N_HEADS=spec.num_attention_heads,
                  VOCAB=spec.vocab_size, MAX_SEQ_LEN=max(spec.seq_len, spec.num_positions or 0),
                  THETA=float(spec.rope_theta or 10000.0), EPS=float(spec.norm_eps or 1e-5), TIED=spec.tied_embeddings,
                  ROPE_SCALING=rope_scaling.torchtitan_fields(spec), **extra)
    return "\n".join(f"{key} = {value!r}" for key, value in values.items())


def _moe_constants(spec: ModelSpec) -> dict:
    moe = spec.moe
    assert moe is not None
    return dict(NUM_EXPERTS=moe.num_experts, TOP_K=moe.top_k, EXPERT_DIM=moe.expert_ffn_hidden_size,
                SHARED_DIM=(moe.shared_expert_ffn_hidden_size or moe.expert_ffn_hidden_size * moe.num_shared_experts),
                SCORE_FUNC=moe.score_function, ROUTE_NORM=moe.normalize_topk,
                ROUTE_SCALE=float(moe.topk_scaling_factor or 1.0), GROUPS=moe.num_groups, GROUP_TOPK=moe.group_topk,
                MOE_LAYERS=tuple(i for i in range(spec.num_layers) if spec.is_moe_layer(i)))


_HEAD = '''"""torchtitan 0.3 config module written by llm-planner: the model {name!r}, exactly ({family} family builders).

Use: put this file on PYTHONPATH and run torchtitan with --module {module} --config {config}.
Training settings (optimizer, data, checkpointing) are those of torchtitan's {base}; override them as usual.
RoPE: the model's theta and scaling (ROPE_SCALING: RoPE.Config fields).
"""

import dataclasses

from torchtitan.models.common import Embedding, Linear, RMSNorm
from torchtitan.models.{family} import config_registry as family_configs
from torchtitan.models.{family} import model_registry

{constants}


def _with_eps(node, seen=None):
    """Every RMSNorm.Config in the model config gets the model's epsilon (the family's builders fix their own)."""
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, RMSNorm.Config):
        node.eps = EPS
    elif isinstance(node, (list, tuple)):
        for item in node:
            _with_eps(item, seen)
    elif dataclasses.is_dataclass(node):
        for field in dataclasses.fields(node):
            _with_eps(getattr(node, field.name), seen)


def _decoder(model_class, layers, embedding_init, head_init):
    config = model_class.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM, param_init=embedding_init),
        norm=RMSNorm.Config(normalized_shape=DIM, eps=EPS),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=head_init),
        layers=layers,
        enable_weight_tying=TIED,
    )
    _with_eps(config)
    return config


def {config}():
    config = family_configs.{base}()
    config.model_spec = dataclasses.replace(model_registry("{flavor}"), flavor="{name}", model=model_config())
    config.loss.loss_fn.global_vocab_size = VOCAB
    return config
'''

_QWEN3 = '''
from torchtitan.models.common import CosSinRoPE
from torchtitan.models.common.config_utils import (get_attention_config, make_ffn_config, make_gqa_config,
                                                   make_moe_config, make_routed_experts_config, make_router_config)
from torchtitan.models.qwen3 import _EMBEDDING_INIT, _LINEAR_INIT, _moe_experts_init, _residual_output_init
from torchtitan.models.qwen3.model import Qwen3Model, Qwen3TransformerBlock


def _norm(width):
    return RMSNorm.Config(normalized_shape=width, eps=EPS)


def model_config(attn_backend=ATTN_BACKEND, moe_comm_backend="standard"):
    rope = CosSinRoPE.Config(dim=HEAD_DIM, max_seq_len=MAX_SEQ_LEN, theta=THETA, **ROPE_SCALING)
    output_init, experts_init = _residual_output_init(N_LAYERS), _moe_experts_init(N_LAYERS)
    layers = []
    for layer_id in range(N_LAYERS):
        moe = feed_forward = None
        if layer_id in MOE_LAYERS:
            moe = make_moe_config(
                num_experts=NUM_EXPERTS,
                router=make_router_config(dim=DIM, num_experts=NUM_EXPERTS, gate_param_init=_LINEAR_INIT, top_k=TOP_K,
                                          score_func=SCORE_FUNC, route_norm=ROUTE_NORM, route_scale=ROUTE_SCALE,
                                          num_expert_groups=GROUPS, num_limited_groups=GROUP_TOPK),
                routed_experts=make_routed_experts_config(dim=DIM, hidden_dim=EXPERT_DIM, num_experts=NUM_EXPERTS,
                                                          top_k=TOP_K, param_init=experts_init,
                                                          comm_backend=moe_comm_backend),
                shared_experts=make_ffn_config(dim=DIM, hidden_dim=SHARED_DIM, w1_param_init=_LINEAR_INIT,
                                               w2w3_param_init=output_init) if SHARED_DIM else None,
            )
        else:
            feed_forward = make_ffn_config(dim=DIM, hidden_dim=FFN_DIM, w1_param_init=_LINEAR_INIT,
                                           w2w3_param_init=_LINEAR_INIT)
        layers.append(Qwen3TransformerBlock.Config(
            attention_norm=_norm(DIM), ffn_norm=_norm(DIM),
            attention=make_gqa_config(dim=DIM, n_heads=N_HEADS, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                                      wqkv_param_init=_LINEAR_INIT, wo_param_init=output_init,
                                      inner_attention=get_attention_config(attn_backend), fuse_qkv=True, rope=rope,
                                      qk_norm=_norm(HEAD_DIM) if QK_NORM else None),
            moe=moe, feed_forward=feed_forward,
        ))
    return _decoder(Qwen3Model, layers, _EMBEDDING_INIT, _LINEAR_INIT)
'''

_DEEPSEEK = '''
from torchtitan.models.common import ComplexRoPE
from torchtitan.models.deepseek_v3 import (_EMBEDDING_INIT, _build_dsv3_layers, _output_linear_init)
from torchtitan.models.deepseek_v3.model import DeepSeekV3Model


def model_config(attn_backend=ATTN_BACKEND, moe_comm_backend="standard"):
    assert MOE_LAYERS == tuple(range(N_DENSE, N_LAYERS)), "deepseek_v3 builds leading dense layers, then MoE"
    layers = _build_dsv3_layers(
        n_layers=N_LAYERS, n_dense_layers=N_DENSE, dim=DIM, n_heads=N_HEADS, q_lora_rank=Q_LORA_RANK,
        kv_lora_rank=KV_LORA_RANK, qk_nope_head_dim=QK_NOPE_DIM, qk_rope_head_dim=QK_ROPE_DIM, v_head_dim=V_DIM,
        mscale=1.0, dense_hidden_dim=FFN_DIM, moe_hidden_dim=EXPERT_DIM, num_experts=NUM_EXPERTS,
        num_shared_experts=N_SHARED, router_top_k=TOP_K, router_score_func=SCORE_FUNC,
        router_num_expert_groups=GROUPS, router_num_limited_groups=GROUP_TOPK, router_route_scale=ROUTE_SCALE,
        router_route_norm=ROUTE_NORM, attn_backend=attn_backend, moe_comm_backend=moe_comm_backend,
        non_blocking_capacity_factor=None,
        rope=ComplexRoPE.Config(dim=QK_ROPE_DIM, max_seq_len=MAX_SEQ_LEN, theta=THETA, **ROPE_SCALING),
    )
    config = _decoder(DeepSeekV3Model, layers, _EMBEDDING_INIT, _output_linear_init(DIM))
    config.mtp_layers = []
    return config
'''

_GPT_OSS = '''
from torchtitan.models.common import CosSinRoPE
from torchtitan.models.common.moe import TokenChoiceTopKRouter
from torchtitan.models.gpt_oss import (_EMBEDDING_INIT, _depth_init, _make_gptoss_attn_config,
                                       _make_gptoss_experts_config, _output_linear_init)
from torchtitan.models.gpt_oss.model import GptOssModel, GptOssTransformerBlock
from torchtitan.models.gpt_oss.moe import GptOssMoE


def model_config(attn_backend=ATTN_BACKEND, moe_comm_backend="standard"):
    rope = CosSinRoPE.Config(dim=HEAD_DIM, max_seq_len=MAX_SEQ_LEN, theta=THETA, **ROPE_SCALING)
    layers = []
    for layer_id in range(N_LAYERS):
        attention = _make_gptoss_attn_config(dim=DIM, layer_id=layer_id, attn_backend=attn_backend, n_heads=N_HEADS,
                                             n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM,
                                             sliding_window_size=WINDOWS[layer_id], fuse_qkv=True, rope=rope)
        moe = GptOssMoE.Config(
            num_experts=NUM_EXPERTS, load_balance_coeff=1e-3,
            routed_experts=_make_gptoss_experts_config(dim=DIM, hidden_dim=EXPERT_DIM, num_experts=NUM_EXPERTS,
                                                       layer_id=layer_id, top_k=TOP_K, moe_comm_backend=moe_comm_backend),
            router=TokenChoiceTopKRouter.Config(
                num_experts=NUM_EXPERTS, score_func=SCORE_FUNC, route_norm=ROUTE_NORM, top_k=TOP_K,
                gate=Linear.Config(in_features=DIM, out_features=NUM_EXPERTS, bias=True, param_init=_depth_init(layer_id))),
        )
        layers.append(GptOssTransformerBlock.Config(attention=attention, attention_norm=RMSNorm.Config(normalized_shape=DIM),
                                                    ffn_norm=RMSNorm.Config(normalized_shape=DIM), moe=moe))
    return _decoder(GptOssModel, layers, _EMBEDDING_INIT, _output_linear_init(DIM))
'''


def moe_module(spec: ModelSpec, family: str, module_name: str, cp: int = 1) -> str:
    """Python source of a torchtitan 0.3 config module building exactly `spec` with `family`'s builders. Attention is
    FlexAttention, except gpt_oss's own varlen default without context parallelism (torchtitan 0.3
    distributed/context_parallel/api.py apply_cp_to_forward: "Variable-length attention CP is not yet supported")."""
    extra = _moe_constants(spec)
    extra["ATTN_BACKEND"] = "varlen" if family == "gpt_oss" and cp == 1 else "flex"
    if family == "qwen3":
        extra.update(N_KV_HEADS=spec.kv_heads, HEAD_DIM=spec.dim_per_head, FFN_DIM=spec.ffn_hidden_size,
                     QK_NORM=spec.qk_norm)
        body = _QWEN3
    elif family == "deepseek_v3":
        mla = spec.mla
        assert mla is not None and spec.moe is not None
        extra.update(FFN_DIM=spec.ffn_hidden_size, N_DENSE=spec.moe.first_k_dense, N_SHARED=spec.moe.num_shared_experts,
                     Q_LORA_RANK=mla.q_lora_rank or 0, KV_LORA_RANK=mla.kv_lora_rank, QK_NOPE_DIM=mla.qk_nope_head_dim,
                     QK_ROPE_DIM=mla.qk_rope_head_dim, V_DIM=mla.v_head_dim)
        body = _DEEPSEEK
    else:
        kinds = spec.layer_types or ("full",) * spec.num_layers
        extra.update(N_KV_HEADS=spec.kv_heads, HEAD_DIM=spec.dim_per_head,
                     WINDOWS=tuple(spec.sliding_window if kind == "sliding" else None for kind in kinds))
        body = _GPT_OSS
    base, flavor = FAMILY_BASE[family]
    head = _HEAD.format(name=spec.name, family=family, module=module_name, config=GENERATED_CONFIG, base=base,
                        flavor=flavor, constants=_constants(spec, **extra))
    return head + body
