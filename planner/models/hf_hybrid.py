"""HuggingFace configs of hybrid stacks -> ModelSpec fields: Qwen3-Next (Gated DeltaNet linear attention beside gated
full attention) and Jamba (Mamba-1 layers beside attention). Read from transformers 5.x
(models/qwen3_next/{configuration,modeling}_qwen3_next.py, models/jamba/{configuration,modeling}_jamba.py).

Each layer's token mixer goes to ModelSpec.layer_types ("linear", "mamba" beside "full"); the mixer's sizes to
ModelSpec.linear_attention (GatedDeltaNetSpec) or ModelSpec.mamba (MambaSpec). Parameters are counted in
planner.models.counting (gated_deltanet_params, mamba_params), FLOPs, bytes and saved activations in
planner.cost.mixers.
"""

import math
from typing import Any

from planner.models.hf_config import NUM_EXPERTS, HFConfig
from planner.models.hf_modern import ATTENTION_BIAS, Family, family_fields, sparse_layout
from planner.schemas.model import GatedDeltaNetSpec, MambaSpec, MoESpec

QWEN3_NEXT_KINDS = {"linear_attention": "linear", "full_attention": "full"}


def _qwen3_next_layers(cfg: HFConfig, n: int) -> tuple[str, ...]:
    """layer_types, or configuration_qwen3_next's rule: layer i is full attention when (i + 1) % full_attention_interval
    == 0 (default 4), linear attention otherwise."""
    raw = cfg.data.get("layer_types")
    if raw is None:
        interval = int(cfg.get("full_attention_interval", default=4))
        raw = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    unknown = sorted({kind for kind in raw if kind not in QWEN3_NEXT_KINDS})
    if unknown or len(raw) != n:
        why = f"layer kinds {unknown} are not modelled" if unknown else f"{len(raw)} entries for {n} layers"
        raise cfg.refuse("layer_types", unknown or len(raw), why)
    return tuple(QWEN3_NEXT_KINDS[kind] for kind in raw)


def qwen3_next(cfg: HFConfig) -> dict[str, Any]:
    """Qwen3-Next (modeling_qwen3_next): Gated DeltaNet layers (Qwen3NextGatedDeltaNet) with a gated full-attention
    layer every full_attention_interval-th (Qwen3NextAttention: q_proj emits query and a sigmoid output gate, per-head
    q/k RMSNorms, partial RoPE 0.25); MoE FFNs where (i + 1) % decoder_sparse_step == 0 outside mlp_only_layers:
    routed experts of moe_intermediate_size and one shared expert of shared_expert_intermediate_size behind a
    sigmoid gate (Qwen3NextSparseMoeBlock). The (1 + weight) RMSNorm holds the same parameters as RMSNorm."""
    fields = family_fields(cfg, Family(bias_keys=ATTENTION_BIAS, fixed={"qk_norm": True, "attention_output_gate": True}))
    n = int(fields["num_layers"])
    fields["layer_types"] = _qwen3_next_layers(cfg, n)
    fields["linear_attention"] = GatedDeltaNetSpec(
        num_key_heads=cfg.req("linear_num_key_heads"), num_value_heads=cfg.req("linear_num_value_heads"),
        key_head_dim=cfg.req("linear_key_head_dim"), value_head_dim=cfg.req("linear_value_head_dim"),
        conv_kernel=cfg.req("linear_conv_kernel_dim"),
    )
    if int(cfg.get(*NUM_EXPERTS, default=0)) > 0:
        fields["moe"] = MoESpec(
            num_experts=cfg.req(*NUM_EXPERTS), top_k=cfg.req("num_experts_per_tok"),
            expert_ffn_hidden_size=cfg.req("moe_intermediate_size"), num_shared_experts=1,
            shared_expert_ffn_hidden_size=cfg.req("shared_expert_intermediate_size"), shared_expert_gate=True,
            normalize_topk=cfg.flag("norm_topk_prob"), **sparse_layout(cfg),
        )
    return fields


def jamba(cfg: HFConfig) -> dict[str, Any]:
    """Jamba (modeling_jamba): layer i is attention when i % attn_layer_period == attn_layer_offset, else a Mamba-1
    mixer (JambaMambaMixer); its FFN is MoE (num_experts of intermediate_size, softmax router without bias) when
    i % expert_layer_period == expert_layer_offset and num_experts > 1, else a SwiGLU MLP. No position encoding
    (JambaAttention applies no RoPE), no linear biases in attention and MLPs, untied by default."""
    fields = family_fields(cfg, Family())
    n = int(fields["num_layers"])
    period, offset = int(cfg.req("attn_layer_period")), int(cfg.req("attn_layer_offset"))
    if not 0 <= offset < period:
        raise cfg.refuse("attn_layer_offset", offset, f"it must be smaller than attn_layer_period={period}")
    fields["position"] = "none"
    fields["layer_types"] = tuple("full" if i % period == offset else "mamba" for i in range(n))
    h = int(fields["hidden_size"])
    dt_rank = cfg.get("mamba_dt_rank", default="auto")
    fields["mamba"] = MambaSpec(
        d_inner=int(cfg.req("mamba_expand")) * h, d_state=cfg.req("mamba_d_state"), d_conv=cfg.req("mamba_d_conv"),
        dt_rank=math.ceil(h / 16) if dt_rank == "auto" else int(dt_rank),
        conv_bias=cfg.flag("mamba_conv_bias"), proj_bias=cfg.flag("mamba_proj_bias"),
    )
    experts = int(cfg.req(*NUM_EXPERTS))
    e_period, e_offset = int(cfg.req("expert_layer_period")), int(cfg.req("expert_layer_offset"))
    if experts > 1:
        if not 0 <= e_offset < e_period:
            raise cfg.refuse("expert_layer_offset", e_offset, f"it must be smaller than expert_layer_period={e_period}")
        fields["moe"] = MoESpec(num_experts=experts, top_k=cfg.req("num_experts_per_tok"),
                                expert_ffn_hidden_size=fields["ffn_hidden_size"], first_k_dense=e_offset, moe_every=e_period)
    return fields


BUILDERS = {"qwen3_next": qwen3_next, "jamba": jamba}
DEFAULTS: dict[str, dict[str, Any]] = {  # configuration class defaults that change counts
    "qwen3_next": {"head_dim": 256, "num_key_value_heads": 2, "partial_rotary_factor": 0.25, "linear_conv_kernel_dim": 4,
                   "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_num_key_heads": 16,
                   "linear_num_value_heads": 32, "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
                   "num_experts_per_tok": 10, "num_experts": 512, "norm_topk_prob": True},
    "jamba": {"num_key_value_heads": 8, "num_experts": 16, "num_experts_per_tok": 2, "expert_layer_period": 2,
              "expert_layer_offset": 1, "attn_layer_period": 8, "attn_layer_offset": 4, "mamba_d_state": 16,
              "mamba_d_conv": 4, "mamba_expand": 2, "mamba_conv_bias": True, "max_position_embeddings": 262144},
}
