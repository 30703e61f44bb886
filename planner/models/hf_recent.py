"""HuggingFace configs of the 2025-26 model types -> ModelSpec fields (importers for planner.models.hf).

Read from transformers 5.x (models/<type>/configuration_<type>.py and modeling_<type>.py); each builder's docstring
names what departs from Llama. What they bring beyond the Llama lineage, and where the planner accounts for it:

- per-layer attention kinds (HF `layer_types`: full_attention, sliding_attention, chunked_attention) with
  `sliding_window` / `attention_chunk_size`: ModelSpec.layer_types; attention FLOPs and unfused score memory follow
  ModelSpec.attention_fraction (planner.cost.compute.attention_gemms). When a config.json leaves layer_types out,
  the configuration class's own rule (LAYER_RULES) derives it.
- attention sinks (gpt-oss: one learned logit per head), router and expert biases (gpt-oss), a per-expert score
  bias that is a parameter (ERNIE-4.5) or a buffer (GLM-4.5), bias-free LayerNorm and parallel attention/FFN
  (Cohere2), an LM-head bias (PhiMoE): ModelSpec / MoESpec fields, counted in planner.models.counting.
- MoE on alternate layers (Llama-4 interleave_moe_layer_step, ERNIE moe_layer_interval), MLA (DeepSeek-V2).

The hybrid stacks (Gated DeltaNet in qwen3_next, Mamba-1 in jamba) are read by planner.models.hf_hybrid.
Multimodal wrappers (llama4, mistral3) are planned as their language model (`text_config`): the vision tower and
projector are not part of the plan, which says so in the spec's source.
"""

from collections.abc import Callable
from typing import Any

from planner.errors import BadInputError
from planner.models.hf_config import NUM_EXPERTS, HFConfig
from planner.models.hf_modern import Family, deepseek_mla, family_fields, router_fields
from planner.schemas.model import MoESpec

KINDS = {"full_attention": "full", "sliding_attention": "sliding", "chunked_attention": "chunked"}

REFUSED: dict[str, str] = {}  # model_type -> the missing piece, refused in one line (none at present)


def _every(n: int, step: int, offset: int = 0) -> list[bool]:
    """True for layer i when (i + 1 + offset) % step != 0: the 'mostly sliding, every step-th full' rules."""
    return [bool((i + 1 + offset) % step) for i in range(n)]


def _pattern(cfg: HFConfig, default: int) -> int:
    value = cfg.data.get("sliding_window_pattern", default)
    if not isinstance(value, int) or value <= 0:
        raise cfg.refuse("sliding_window_pattern", value, "only an integer pattern (or an explicit layer_types) is read")
    return value


def _no_rope(cfg: HFConfig, n: int) -> list[int]:
    """Llama-4 / SmolLM3 no_rope_layers: 1 = the layer uses RoPE (configuration_llama4.py, default every 4th NoPE)."""
    given = cfg.data.get("no_rope_layers")
    if isinstance(given, list) and len(given) == n:
        return [int(v) for v in given]
    interval = int(cfg.get("no_rope_layer_interval", default=4))
    return [int((i + 1) % interval != 0) for i in range(n)]


# configuration_<type>.py __post_init__: layer_types when the config gives none (True = sliding / chunked)
LAYER_RULES: dict[str, Callable[[HFConfig, int], list[str]]] = {
    "gpt_oss": lambda cfg, n: ["sliding_attention" if s else "full_attention" for s in _every(n, 2)],
    "ministral": lambda cfg, n: ["sliding_attention" if cfg.get("sliding_window") else "full_attention"] * n,
    "cohere2": lambda cfg, n: ["sliding_attention" if s else "full_attention" for s in _every(n, _pattern(cfg, 4))],
    "exaone4": lambda cfg, n: (["sliding_attention" if s else "full_attention" for s in _every(n, _pattern(cfg, 4))]
                               if cfg.get("sliding_window") else ["full_attention"] * n),
    "smollm3": lambda cfg, n: ["sliding_attention" if cfg.flag("use_sliding_window") and cfg.get("sliding_window")
                               and not rope else "full_attention" for rope in _no_rope(cfg, n)],
    "llama4_text": lambda cfg, n: ["chunked_attention" if rope and cfg.get("attention_chunk_size") else "full_attention"
                                   for rope in _no_rope(cfg, n)],
}


def nope_fields(cfg: HFConfig, n: int) -> dict[str, Any]:
    """nope_layers: the layers no_rope_layers marks 0 (no RoPE), for the types whose configuration class has it."""
    if cfg.model_type not in ("smollm3", "llama4_text"):
        return {}
    skipped = tuple(i for i, rope in enumerate(_no_rope(cfg, n)) if not rope)
    return {"nope_layers": skipped} if skipped else {}


def layer_fields(cfg: HFConfig, n: int) -> dict[str, Any]:
    """layer_types, sliding_window and attention_chunk of the spec; refuses a kind the planner does not model."""
    raw = cfg.data.get("layer_types")
    if raw is None and cfg.model_type in LAYER_RULES:
        raw = LAYER_RULES[cfg.model_type](cfg, n)
    if raw is None:
        return {}
    unknown = sorted({kind for kind in raw if kind not in KINDS})
    if unknown or len(raw) != n:
        why = f"layer kinds {unknown} are not modelled" if unknown else f"{len(raw)} entries for {n} layers"
        raise cfg.refuse("layer_types", unknown or len(raw), why)
    kinds = tuple(KINDS[kind] for kind in raw)
    if set(kinds) == {"full"}:
        return {}
    fields: dict[str, Any] = {"layer_types": kinds}
    if "sliding" in kinds:
        fields["sliding_window"] = cfg.req("sliding_window")
    if "chunked" in kinds:
        fields["attention_chunk"] = cfg.req("attention_chunk_size")
    return fields


def _with_layers(fields: dict[str, Any], cfg: HFConfig) -> dict[str, Any]:
    n = int(fields["num_layers"])
    return {**fields, **layer_fields(cfg, n), **nope_fields(cfg, n)}


def ministral(cfg: HFConfig) -> dict[str, Any]:
    """Ministral (modeling_ministral): Mistral's layer, sliding window on every layer unless layer_types says otherwise."""
    return _with_layers(family_fields(cfg, Family()), cfg)


def smollm3(cfg: HFConfig) -> dict[str, Any]:
    """SmolLM3: Llama with NoPE every no_rope_layer_interval-th layer (no parameters), tied by default;
    attention_bias on q, k, v, o and mlp_bias as Llama."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias"), "mlp_bias": ("mlp_bias",)}))
    return _with_layers(fields, cfg)


def exaone4(cfg: HFConfig) -> dict[str, Any]:
    """EXAONE-4: OLMo2-style post-norms (post_attention / post_feedforward), RMSNorm over head_dim on q and k
    (Exaone4Attention.q_norm/k_norm), hybrid sliding/full attention."""
    return _with_layers(family_fields(cfg, Family(fixed={"qk_norm": True})), cfg)


def cohere2(cfg: HFConfig) -> dict[str, Any]:
    """Command-R7B / Command-A (modeling_cohere2): one bias-free LayerNorm per layer feeding attention and MLP in
    parallel (Cohere2DecoderLayer), tied embeddings, `attention_bias` on q, k, v, o; sliding/full hybrid."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")},
                                       fixed={"norms_per_layer": 1, "norm_bias": False, "parallel_residual": True},
                                       norm="layernorm"))
    return _with_layers(fields, cfg)


def _mixtral_like(cfg: HFConfig, **extra: Any) -> MoESpec:
    return MoESpec(num_experts=cfg.req(*NUM_EXPERTS), top_k=cfg.req("num_experts_per_tok"),
                   expert_ffn_hidden_size=cfg.req("intermediate_size"), **extra)


def olmoe(cfg: HFConfig) -> dict[str, Any]:
    """OLMoE: OLMo's q/k norms over the whole projections (OlmoeAttention), routed experts of intermediate_size,
    softmax router without renormalised top-k unless norm_topk_prob."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")},
                                       fixed={"qk_norm": True, "qk_norm_scope": "projection"}))
    fields["moe"] = _mixtral_like(cfg, normalize_topk=cfg.flag("norm_topk_prob"))
    return fields


def granitemoe(cfg: HFConfig) -> dict[str, Any]:
    """Granite-MoE: Granite's layer (multipliers hold no parameters) with Mixtral-style experts."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")}))
    fields["moe"] = _mixtral_like(cfg)
    return fields


def phimoe(cfg: HFConfig) -> dict[str, Any]:
    """Phi-3.5-MoE: LayerNorm with bias, attention_bias on q, k, v, o, an LM-head bias (lm_head_bias), Mixtral experts
    (the SparseMixer routing holds no parameters)."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")}, norm="layernorm"))
    fields.update(lm_head_bias=cfg.flag("lm_head_bias"), moe=_mixtral_like(cfg))
    return fields


def hunyuan_v1_moe(cfg: HFConfig) -> dict[str, Any]:
    """Hunyuan-A13B (modeling_hunyuan_v1_moe): RMSNorm over head_dim on q and k (query/key_layernorm) applied after
    RoPE (HunYuanMoEV1Attention.forward: apply_rotary_pos_emb, then query_layernorm), routed experts and
    one shared MLP all of intermediate_size (HunYuanMoEV1Experts, HunYuanMoEV1Moe.shared_mlp); per-layer expert
    counts or top-k (lists) are refused."""
    experts, top_k = cfg.req("num_experts", "num_local_experts"), cfg.req("moe_topk", "num_experts_per_tok")
    for key, value in (("num_experts", experts), ("moe_topk", top_k)):
        if isinstance(value, list):
            if len(set(value)) != 1:
                raise cfg.refuse(key, value, "per-layer values differ; one value for every layer is supported")
    experts = experts[0] if isinstance(experts, list) else experts
    top_k = top_k[0] if isinstance(top_k, list) else top_k
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")},
                                       fixed={"qk_norm": True, "qk_norm_after_rope": True}))
    width = cfg.req("intermediate_size")
    fields["moe"] = MoESpec(num_experts=experts, top_k=top_k, expert_ffn_hidden_size=width, num_shared_experts=1,
                            shared_expert_ffn_hidden_size=width)
    return fields


def gpt_oss(cfg: HFConfig) -> dict[str, Any]:
    """gpt-oss (modeling_gpt_oss): biased q, k, v, o; a learned sink logit per head; alternating sliding (128) and full
    attention; every layer MoE with a biased router and biased experts of intermediate_size (its clamped SwiGLU has
    SwiGLU's matmuls)."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")}))
    fields.update(attention_sinks=True, moe=_mixtral_like(cfg, router_bias=True, expert_bias=True))
    return _with_layers(fields, cfg)


def llama4_text(cfg: HFConfig) -> dict[str, Any]:
    """Llama-4 text model (modeling_llama4): dense layers of intermediate_size_mlp, MoE layers every
    interleave_moe_layer_step-th layer (moe_layers = range(step-1, n, step)) with routed experts and one shared
    expert of intermediate_size behind a sigmoid router; chunked attention on the RoPE layers, NoPE every 4th; the
    L2 q/k norm holds no parameters."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias", "out_bias")}))
    step = int(cfg.get("interleave_moe_layer_step", default=1))
    if cfg.data.get("moe_layers") is not None and list(cfg.data["moe_layers"]) != list(range(step - 1, int(fields["num_layers"]), step)):
        raise cfg.refuse("moe_layers", cfg.data["moe_layers"], "only every interleave_moe_layer_step-th layer is supported")
    width = cfg.req("intermediate_size")
    fields["ffn_hidden_size"] = cfg.req("intermediate_size_mlp")
    fields["moe"] = MoESpec(num_experts=cfg.req(*NUM_EXPERTS), top_k=cfg.req("num_experts_per_tok"), expert_ffn_hidden_size=width,
                            num_shared_experts=1, shared_expert_ffn_hidden_size=width, first_k_dense=step - 1, moe_every=step,
                            score_function="sigmoid")
    return _with_layers(fields, cfg)


def glm4_moe(cfg: HFConfig) -> dict[str, Any]:
    """GLM-4.5 (modeling_glm4_moe): attention_bias on q, k, v only, optional head q/k norms (use_qk_norm), partial
    RoPE; first_k_dense_replace dense layers, then routed experts and n_shared_experts * moe_intermediate_size shared
    ones behind a sigmoid, group-limited router with a score-correction buffer."""
    fields = family_fields(cfg, Family(bias_keys={"attention_bias": ("qkv_bias",), "use_qk_norm": ("qk_norm",)}))
    fields["moe"] = MoESpec(
        num_experts=cfg.req("n_routed_experts", *NUM_EXPERTS), top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"), num_shared_experts=cfg.get("n_shared_experts", default=1),
        first_k_dense=cfg.get("first_k_dense_replace", default=1), expert_score_bias="buffer", **router_fields(cfg, score="sigmoid"),
    )
    return fields


def deepseek_v2(cfg: HFConfig) -> dict[str, Any]:
    """DeepSeek-V2 (modeling_deepseek_v2): V3's MLA (attention_bias must be false), first_k_dense_replace dense layers
    (default 0), n_shared_experts (default 2) shared experts, a softmax router with group-limited greedy routing and
    no score-correction bias; mlp_bias on the dense and shared MLPs."""
    fields = family_fields(cfg, Family(bias_keys={"mlp_bias": ("mlp_bias",)}))
    fields.update(num_kv_heads=None, mla=deepseek_mla(cfg))
    fields.pop("head_dim", None)
    fields["moe"] = MoESpec(
        num_experts=cfg.req("n_routed_experts", *NUM_EXPERTS), top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"), num_shared_experts=cfg.get("n_shared_experts", default=2),
        first_k_dense=cfg.get("first_k_dense_replace", default=0), **router_fields(cfg, score="softmax"),
    )
    return fields


def ernie4_5_moe(cfg: HFConfig) -> dict[str, Any]:
    """ERNIE-4.5-MoE (modeling_ernie4_5_moe): MoE on layer i when (i + 1) % moe_layer_interval == 0 and
    moe_layer_start_index <= i <= moe_layer_end_index; moe_num_shared_experts * moe_intermediate_size shared experts;
    the per-expert score-correction bias is an nn.Parameter (Ernie4_5_MoeStatics), counted; tied by default."""
    fields = family_fields(cfg, Family())
    n = int(fields["num_layers"])
    step, start = int(cfg.get("moe_layer_interval", default=1)), int(cfg.get("moe_layer_start_index", default=1))
    end = int(cfg.get("moe_layer_end_index", default=n - 1))
    end = n - 1 if end < 0 else end
    moe_layers = [i for i in range(n) if (i + 1) % step == 0 and start <= i <= end]
    if not moe_layers or moe_layers[-1] + step < n:
        raise cfg.refuse("moe_layer_end_index", end, f"dense layers after the last MoE layer are not supported ({n} layers)")
    shared = int(cfg.get("moe_num_shared_experts", default=0))
    fields["moe"] = MoESpec(
        num_experts=cfg.req(*NUM_EXPERTS), top_k=cfg.req("num_experts_per_tok", "moe_k"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"), num_shared_experts=shared,
        first_k_dense=moe_layers[0], moe_every=step, expert_score_bias="parameter",
    )
    return fields


ERNIE_EXPECTS = {"use_bias": False}  # use_bias biases attention and dense MLPs but not the experts: not expressed


def dbrx(cfg: HFConfig) -> dict[str, Any]:
    """DBRX (modeling_dbrx): fused Wqkv and out_proj without bias, bias-free LayerNorms (norm_1, norm_2, norm_f), GQA
    from attn_config.kv_n_heads, every layer MoE with ffn_config.moe_num_experts GLU experts of ffn_hidden_size."""
    attn, ffn = cfg.data.get("attn_config") or {}, cfg.data.get("ffn_config") or {}
    flat = HFConfig({**cfg.data, **attn, **ffn}, cfg.source, cfg.defaults)
    heads = int(flat.req("n_heads", "num_attention_heads"))
    width = flat.req("ffn_hidden_size")
    return dict(
        num_layers=flat.req("n_layers", "num_hidden_layers"), hidden_size=flat.req("d_model", "hidden_size"),
        ffn_hidden_size=width, num_attention_heads=heads, num_kv_heads=flat.get("kv_n_heads", default=1),
        vocab_size=flat.req("vocab_size"), seq_len=min(int(flat.get("max_seq_len", default=2048)), 8192),
        activation="swiglu", norm="layernorm", norm_bias=False, position="rope",
        rope_theta=flat.get("rope_theta"), tied_embeddings=flat.flag("tie_word_embeddings"),
        moe=MoESpec(num_experts=flat.req("moe_num_experts"), top_k=flat.req("moe_top_k"), expert_ffn_hidden_size=width),
    )


BUILDERS: dict[str, Callable[[HFConfig], dict[str, Any]]] = {
    "ministral": ministral, "smollm3": smollm3, "exaone4": exaone4, "cohere2": cohere2, "olmoe": olmoe,
    "granitemoe": granitemoe, "phimoe": phimoe, "hunyuan_v1_moe": hunyuan_v1_moe, "gpt_oss": gpt_oss,
    "llama4_text": llama4_text, "glm4_moe": glm4_moe, "deepseek_v2": deepseek_v2, "ernie4_5_moe": ernie4_5_moe, "dbrx": dbrx,
}
DEFAULTS: dict[str, dict[str, Any]] = {  # configuration class defaults that change counts
    "smollm3": {"tie_word_embeddings": True}, "cohere2": {"tie_word_embeddings": True},
    "exaone4": {"num_key_value_heads": 32},
    "ministral": {"num_key_value_heads": 8}, "gpt_oss": {"head_dim": 64, "num_key_value_heads": 8, "attention_bias": True},
    "llama4_text": {"head_dim": 128, "num_key_value_heads": 8, "intermediate_size_mlp": 16384},
    "olmoe": {"num_key_value_heads": 16}, "granitemoe": {"num_key_value_heads": 32},
    "phimoe": {"num_key_value_heads": 8}, "hunyuan_v1_moe": {"num_key_value_heads": 32},
    "glm4_moe": {"num_key_value_heads": 8}, "deepseek_v2": {"num_key_value_heads": 32},
    "ernie4_5_moe": {"num_key_value_heads": 4, "tie_word_embeddings": True},
}
EXPECTS: dict[str, dict[str, Any]] = {"ernie4_5_moe": ERNIE_EXPECTS, "deepseek_v2": {"attention_bias": False}}
WRAPPERS = {"llama4": "llama4_text", "mistral3": "ministral"}  # multimodal configs: their text_config is planned


def text_config(data: dict[str, Any], where: str) -> dict[str, Any]:
    """The language model's config of a multimodal wrapper (llama4, mistral3), with its model_type."""
    inner = data.get("text_config")
    if not isinstance(inner, dict):
        raise BadInputError(f"{where}: model_type={data.get('model_type')!r} needs a 'text_config' object (the language "
                            "model's config): add it, or pass the text model's config.json")
    inner = dict(inner)
    inner.setdefault("model_type", WRAPPERS[data["model_type"]])
    if inner["model_type"] == "mistral":  # Mistral-Small-3.x: a plain Mistral text model
        inner["model_type"] = "ministral" if inner.get("layer_types") or inner.get("sliding_window") else "mistral"
    return inner
