"""Architecture features of a ModelSpec that some stacks cannot build, by name (the `feature` of a framework profile's
`capabilities.unsupported_models`, planner.schemas.framework.ModelFeature). Pure predicates, no torch."""

from collections.abc import Callable

from planner.schemas.model import ModelSpec


def _partial_linear_bias(spec: ModelSpec) -> bool:
    """Biases on some linears but not all (a single add_bias_linear switch cannot say it): attention-output or MLP
    biases without the rest, router/expert biases without attention biases. QKV-only biases (Qwen2) are not partial."""
    if spec.linear_bias:
        return False
    moe = spec.moe
    any_bias = spec.out_bias or spec.mlp_bias or (moe is not None and (moe.expert_bias or moe.router_bias))
    dense_layers = spec.num_layers - spec.num_moe_layers
    all_bias = (spec.qkv_bias and spec.out_bias and (spec.mlp_bias or dense_layers == 0)
                and (moe is None or (moe.expert_bias and moe.router_bias and not moe.shared_ffn_hidden_size)))
    return any_bias and not all_bias


def _scaled(multipliers) -> bool:
    """Any Granite multiplier that changes the computation (1.0 and an unset attention multiplier do not)."""
    return (multipliers.embedding != 1 or multipliers.residual != 1 or multipliers.logits_scaling != 1
            or multipliers.attention is not None)


MODEL_FEATURES: dict[str, tuple[str, Callable[[ModelSpec], bool]]] = {
    "parallel_residual": ("parallel attention/FFN residual (GPT-NeoX, Falcon, Cohere)", lambda s: s.parallel_residual),
    "chunked_attention": ("chunked attention layers (Llama-4 attention_chunk_size)", lambda s: "chunked" in (s.layer_types or ())),
    "sliding_window_attention": ("sliding-window attention layers", lambda s: "sliding" in (s.layer_types or ())),
    "attention_sinks": ("attention sinks (gpt-oss)", lambda s: s.attention_sinks),
    "bias_free_layernorm": ("LayerNorm without bias (DBRX, Cohere)", lambda s: s.norm == "layernorm" and not s.norm_bias),
    "lm_head_bias": ("an LM-head bias (PhiMoE)", lambda s: s.lm_head_bias),
    "learned_expert_score_bias": ("a learned per-expert score bias with softmax scores (ERNIE-4.5)",
                                  lambda s: s.moe is not None and s.moe.expert_score_bias == "parameter"),
    "sigmoid_unnormalized_topk": ("sigmoid router scores without renormalised top-k",
                                  lambda s: s.moe is not None and s.moe.score_function == "sigmoid" and not s.moe.normalize_topk
                                  and s.moe.top_k > 1),
    "partial_linear_bias": ("biases on some linears but not all", _partial_linear_bias),
    "four_norms_per_layer": ("four norms per layer (Gemma2/3 pre and post norms)", lambda s: s.norms_per_layer == 4),
    "projection_qk_norm": ("q/k norms over the whole projections (OLMo2, OLMoE)",
                           lambda s: s.qk_norm and s.qk_norm_scope == "projection"),
    "geglu": ("a GeLU-gated FFN (geglu)", lambda s: s.activation == "geglu"),
    "alibi": ("ALiBi positions (BLOOM)", lambda s: s.position == "alibi"),
    "learned_positions": ("a learned position table (GPT-2/3, OPT)", lambda s: s.position == "learned"),
    "mla": ("multi-head latent attention (DeepSeek)", lambda s: s.mla is not None),
    "moe": ("mixture-of-experts layers", lambda s: s.moe is not None),
    "layernorm": ("LayerNorm (not RMSNorm)", lambda s: s.norm == "layernorm"),
    "plain_ffn": ("a plain (non-gated) FFN", lambda s: not s.gated),
    "shared_expert_gate": ("a shared-expert gate (Qwen2-MoE)", lambda s: s.moe is not None and s.moe.shared_expert_gate),
    "embedding_norm": ("a LayerNorm after the embedding (BLOOM)", lambda s: s.embedding_norm),
    "one_norm_per_layer": ("one norm per layer shared by attention and FFN (Falcon-7B, Cohere)", lambda s: s.norms_per_layer == 1),
    "linear_attention": ("Gated DeltaNet linear-attention layers (Qwen3-Next)", lambda s: "linear" in (s.layer_types or ())),
    "mamba_layers": ("Mamba-1 selective-scan layers (Jamba)", lambda s: "mamba" in (s.layer_types or ())),
    "attention_output_gate": ("a sigmoid-gated attention output (Qwen3-Next)", lambda s: s.attention_output_gate),
    "qk_norm_after_rope": ("q/k norms applied after RoPE (Hunyuan)", lambda s: s.qk_norm and s.qk_norm_after_rope),
    "activation_multipliers": ("Granite's embedding, residual and attention multipliers and logits scaling",
                               lambda s: s.multipliers is not None and _scaled(s.multipliers)),
    "no_position_encoding": ("no position encoding (Jamba)", lambda s: s.position == "none"),
    "multi_token_prediction": ("multi-token prediction modules (DeepSeek-V3 MTP, mtp_num_layers)", lambda s: s.mtp_num_layers > 0),
}


def has_feature(spec: ModelSpec, feature: str) -> bool:
    return MODEL_FEATURES[feature][1](spec)


def describe(feature: str) -> str:
    return MODEL_FEATURES[feature][0]
