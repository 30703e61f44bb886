"""HuggingFace configs of the Llama lineage -> ModelSpec fields, driven by one table (FAMILIES).

Every family here is a pre-norm decoder with RoPE, GQA and separate Q/K/V/O projections; what differs is listed
per model_type in FAMILIES, read from transformers 5.x (models/<type>/modeling_<type>.py, configuration_<type>.py):

- llama, granite: `attention_bias` puts a bias on q, k, v and o; `mlp_bias` on gate, up and down. Granite's
  embedding/attention/residual multipliers and logits_scaling scale activations, no parameters.
- mistral, mixtral, phi3: no biases. Phi-3 fuses qkv_proj and gate_up_proj: the same counts as split ones.
- qwen2: q, k, v always biased, o not (Qwen2Attention). qwen2_moe: the same, switched by `qkv_bias` (default
  true), plus a shared expert of width shared_expert_intermediate_size behind a sigmoid gate (Linear(h, 1)).
- qwen3, qwen3_moe: `attention_bias` on q, k, v and o; RMSNorm over head_dim on q and k.
- olmo2: `attention_bias` on q, k, v and o; RMSNorm over the whole q (a*d) and k (kv*d) projections; two
  post-norms per layer (post_attention_layernorm, post_feedforward_layernorm), no pre-norms.
- gemma2, gemma3_text: four norms per layer (input, post_attention, pre_feedforward, post_feedforward), tied
  embeddings and head_dim 256 by default, activation read from `hidden_activation`; gemma3 adds per-head q/k norms.
  The sqrt(h) embedding scale is a buffer; soft-capping, sliding windows and layer_types hold no parameters.
- starcoder2: LayerNorm, plain (non-gated) GeLU MLP c_fc/c_proj, `use_bias` on every linear, tied by default.
- deepseek_v3: MLA attention, leading dense layers, shared + routed experts (see deepseek_v3).
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from planner.errors import BadInputError
from planner.models.hf_config import GEMMA_ACT, HIDDEN_ACT, NUM_EXPERTS, HFConfig, activation, seq_len
from planner.schemas.model import MLASpec, MoESpec

ATTENTION_BIAS = {"attention_bias": ("qkv_bias", "out_bias")}
ATTENTION_MLP_BIAS = {**ATTENTION_BIAS, "mlp_bias": ("mlp_bias",)}
HEAD_QK_NORM = {"qk_norm": True}
GEMMA_DEFAULTS = {"tie_word_embeddings": True, "head_dim": 256, "num_key_value_heads": 4}


@dataclass(frozen=True)
class Family:
    """How one model_type departs from Llama: config switches, fixed spec fields, HF class defaults, MoE layout."""

    bias_keys: dict[str, tuple[str, ...]] = field(default_factory=dict)  # config key -> spec bias fields it turns on
    fixed: dict[str, Any] = field(default_factory=dict)  # spec fields set for every config of the family
    defaults: dict[str, Any] = field(default_factory=dict)  # configuration class defaults that change counts
    act_keys: tuple[str, ...] = HIDDEN_ACT
    gated: bool = True
    norm: str = "rmsnorm"
    moe: Callable[[HFConfig], MoESpec] | None = None


def sparse_layout(cfg: HFConfig) -> dict[str, int]:
    """Qwen-MoE layer i is sparse when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0
    (Qwen2MoeDecoderLayer, Qwen3MoeDecoderLayer) -> first_k_dense and moe_every."""
    step = int(cfg.get("decoder_sparse_step", default=1))
    dense_only = sorted(int(i) for i in cfg.get("mlp_only_layers", default=[]))
    if not dense_only:
        return {"first_k_dense": step - 1, "moe_every": step}
    if step != 1 or dense_only != list(range(len(dense_only))):
        raise BadInputError(
            f"{cfg.source}: mlp_only_layers={dense_only} with decoder_sparse_step={step} cannot be expressed: "
            "only leading dense layers (mlp_only_layers = [0..k-1] with decoder_sparse_step 1) are supported"
        )
    return {"first_k_dense": len(dense_only), "moe_every": 1}


def _mixtral_moe(cfg: HFConfig) -> MoESpec:
    return MoESpec(
        num_experts=cfg.req(*NUM_EXPERTS),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("intermediate_size"),
    )


def _qwen3_moe(cfg: HFConfig) -> MoESpec:
    return MoESpec(
        num_experts=cfg.req(*NUM_EXPERTS),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"),
        normalize_topk=cfg.flag("norm_topk_prob"),
        **sparse_layout(cfg),
    )


def _qwen2_moe(cfg: HFConfig) -> MoESpec:
    """One shared expert of shared_expert_intermediate_size, gated (Qwen2MoeSparseMoeBlock.shared_expert_gate)."""
    return MoESpec(
        num_experts=cfg.req(*NUM_EXPERTS),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"),
        num_shared_experts=1,
        shared_expert_ffn_hidden_size=cfg.req("shared_expert_intermediate_size"),
        shared_expert_gate=True,
        normalize_topk=cfg.flag("norm_topk_prob"),
        **sparse_layout(cfg),
    )


FAMILIES: dict[str, Family] = {
    "llama": Family(bias_keys=ATTENTION_MLP_BIAS),
    "granite": Family(bias_keys=ATTENTION_MLP_BIAS),
    "mistral": Family(defaults={"num_key_value_heads": 8}),
    "mixtral": Family(defaults={"num_key_value_heads": 8}, moe=_mixtral_moe),
    "phi3": Family(),
    "qwen2": Family(fixed={"qkv_bias": True}),
    "qwen2_moe": Family(
        bias_keys={"qkv_bias": ("qkv_bias",)}, defaults={"qkv_bias": True, "num_key_value_heads": 16}, moe=_qwen2_moe
    ),
    "qwen3": Family(bias_keys=ATTENTION_BIAS, fixed=HEAD_QK_NORM, defaults={"head_dim": 128}),
    "qwen3_moe": Family(bias_keys=ATTENTION_BIAS, fixed=HEAD_QK_NORM, defaults={"num_key_value_heads": 4}, moe=_qwen3_moe),
    "olmo2": Family(bias_keys=ATTENTION_BIAS, fixed={"qk_norm": True, "qk_norm_scope": "projection"}),
    "gemma2": Family(bias_keys=ATTENTION_BIAS, fixed={"norms_per_layer": 4}, defaults=GEMMA_DEFAULTS, act_keys=GEMMA_ACT),
    "gemma3_text": Family(
        bias_keys=ATTENTION_BIAS, fixed={"norms_per_layer": 4, **HEAD_QK_NORM}, defaults=GEMMA_DEFAULTS, act_keys=GEMMA_ACT
    ),
    "starcoder2": Family(
        bias_keys={"use_bias": ("linear_bias",)},
        defaults={"use_bias": True, "tie_word_embeddings": True, "num_key_value_heads": 2},
        gated=False,
        norm="layernorm",
    ),
}


def family_fields(cfg: HFConfig, family: Family) -> dict[str, Any]:
    """ModelSpec fields of a config of `family` (cfg already carries family.defaults)."""
    heads = int(cfg.req("num_attention_heads"))
    fields: dict[str, Any] = dict(
        num_layers=cfg.req("num_hidden_layers"),
        hidden_size=cfg.req("hidden_size"),
        ffn_hidden_size=cfg.req("intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", default=heads),
        vocab_size=cfg.req("vocab_size"),
        seq_len=seq_len(cfg),
        activation=activation(cfg, family.act_keys, gated=family.gated, default="silu" if family.gated else "gelu"),
        norm=family.norm,
        position="rope",
        tied_embeddings=cfg.flag("tie_word_embeddings"),
    )
    if cfg.get("head_dim") is not None:
        fields["head_dim"] = cfg.get("head_dim")
    for key, spec_fields in family.bias_keys.items():
        if cfg.flag(key):
            fields.update(dict.fromkeys(spec_fields, True))
    fields.update(family.fixed)
    if family.moe is not None:
        fields["moe"] = family.moe(cfg)
    return fields


DEEPSEEK_DEFAULT_Q_LORA_RANK = 1536
DEEPSEEK_V3_DEFAULTS = {"first_k_dense_replace": 3, "n_shared_experts": 1}  # configuration_deepseek_v3.py
DEEPSEEK_V3_EXPECTS = {"attention_bias": False}


def deepseek_mla(cfg: HFConfig) -> MLASpec:
    """DeepSeek-V2/V3 MLA sizes (q_lora_rank: explicit null = full-rank Q, as DeepSeek-V2-Lite; missing = 1536)."""
    return MLASpec(
        q_lora_rank=cfg.data["q_lora_rank"] if "q_lora_rank" in cfg.data else DEEPSEEK_DEFAULT_Q_LORA_RANK,
        kv_lora_rank=cfg.req("kv_lora_rank"),
        qk_nope_head_dim=cfg.req("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.req("qk_rope_head_dim"),
        v_head_dim=cfg.req("v_head_dim"),
    )


def router_fields(cfg: HFConfig, *, score: str) -> dict[str, Any]:
    """DeepSeek-style router settings (MoESpec fields): score function, renormalised top-k (norm_topk_prob),
    routed_scaling_factor, group-limited routing (n_group, topk_group) where it has more than one group."""
    groups, group_topk = cfg.get("n_group"), cfg.get("topk_group")
    fields: dict[str, Any] = dict(score_function=score, normalize_topk=cfg.flag("norm_topk_prob"))
    scale = float(cfg.get("routed_scaling_factor", default=1.0))
    if scale != 1.0:
        fields["topk_scaling_factor"] = scale
    if groups and int(groups) > 1:
        fields.update(num_groups=int(groups), group_topk=int(group_topk or groups))
    return fields


def deepseek_v3(cfg: HFConfig) -> dict[str, Any]:
    """DeepSeek-V3 (modeling_deepseek_v3): MLA, first_k_dense_replace dense layers, shared + routed experts.

    HF's DeepseekV3ForCausalLM builds no multi-token-prediction layers (num_nextn_predict_layers, 5.x also
    num_mtp_layers), as the 671B total excludes them; the router's e_score_correction_bias is a buffer. `head_dim`
    (written by 5.x as qk_rope_head_dim) is ignored: MLA head sizes come from the MLA keys. moe_layer_freq is read
    by DeepSeek's own modeling code (transformers 5.x ignores it; V3 has 1). attention_bias must be false
    (DEEPSEEK_V3_EXPECTS): MLA's biased projections are not modelled.
    """
    mla = deepseek_mla(cfg)
    first_k, freq = int(cfg.req("first_k_dense_replace")), int(cfg.get("moe_layer_freq", default=1))
    if freq > 1 and first_k % freq:
        raise cfg.refuse(
            "moe_layer_freq", freq,
            f"it does not divide first_k_dense_replace={first_k}, so DeepSeek's MoE layers "
            "(index % moe_layer_freq == 0) differ from ours",
        )
    moe = MoESpec(
        num_experts=cfg.req("n_routed_experts", "num_local_experts"),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"),
        num_shared_experts=cfg.req("n_shared_experts"),
        first_k_dense=first_k,
        moe_every=freq,
        expert_score_bias="buffer",
        **router_fields(cfg, score="sigmoid"),
    )
    fields = family_fields(cfg, Family())  # no bias switches: DeepseekV3MLP and the router have no biases
    fields.update(num_kv_heads=None, mla=mla, moe=moe)
    fields.pop("head_dim", None)
    return fields

