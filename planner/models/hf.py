"""HuggingFace `config.json` -> ModelSpec, for the decoder-only families the planner supports.

Supported model_type values: llama, mistral, mixtral, qwen2, qwen3, qwen3_moe, deepseek_v3, gpt2, gpt_neox, opt,
bloom. Field names and defaults follow the transformers configuration classes (LlamaConfig, GPT2Config, ...):
num_key_value_heads defaults to num_attention_heads, head_dim to hidden_size // num_attention_heads, GPT-2's
n_inner None means 4h, OPT's FFN width is ffn_dim, BLOOM's is always 4h, tie_word_embeddings defaults per family.

seq_len: the config only gives the longest supported context (max_position_embeddings, GPT-2 n_positions), not
the training length, so seq_len = min(that, 8192) (MAX_DEFAULT_SEQ_LEN); BLOOM has no such field and gets its
pre-training length 2048. A request can always override seq_len.

What is approximated (parameter counts stay within 0.01% of the published totals):
- deepseek_v3: the multi-token-prediction layers (num_nextn_predict_layers) and the router score-correction bias
  are not counted (the 671B main model excludes MTP); routing groups (n_group, topk_group) have no parameters.
- llama family `attention_bias`: counted as Q/K/V biases (the output-projection bias, h values, is left out).
- opt: the 2 offset rows of the learned position table are left out (2h values).
- ignored, as they hold no parameters: sliding_window (Mistral; attention FLOPs are then counted as full causal
  attention, an overestimate only for seq_len > sliding_window), rotary_pct and use_parallel_residual (NeoX),
  rope_scaling, dropout and initialisation settings.
Configurations the schema cannot express raise BadInputError instead of being approximated: OPT
word_embed_proj_dim != hidden_size, Qwen3-MoE mlp_only_layers other than the leading layers, DeepSeek
moe_layer_freq not dividing first_k_dense_replace (HF: MoE when index >= k and index % freq == 0; ours:
(index - k) % freq == 0, the same layers exactly when freq divides k).
"""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import BadInputError
from planner.io import format_validation_error, load_structured
from planner.schemas.model import MLASpec, MoESpec, ModelSpec

MAX_DEFAULT_SEQ_LEN = 8192
BLOOM_SEQ_LEN = 2048  # BLOOM pre-training sequence length (BigScience tr11 README); its config has no such field


class _Config:
    """A config dict plus where it came from, so that a missing field names the field and the file."""

    def __init__(self, data: dict[str, Any], source: str):
        self.data = data
        self.source = source

    def req(self, *keys: str) -> Any:
        """The first of `keys` present (aliases such as n_embd/hidden_size); BadInputError when none is."""
        for key in keys:
            if self.data.get(key) is not None:
                return self.data[key]
        raise BadInputError(
            f"{self.source}: missing field {keys[0]!r} in HuggingFace config (model_type={self.data.get('model_type')!r}): "
            f"add it to the config.json"
        )

    def get(self, key: str, default: Any = None) -> Any:
        value = self.data.get(key)
        return default if value is None else value


def _seq_len(cfg: _Config, key: str = "max_position_embeddings") -> int:
    return min(int(cfg.req(key)), MAX_DEFAULT_SEQ_LEN)


def _gated_activation(cfg: _Config) -> str:
    act = str(cfg.get("hidden_act", "silu"))
    if act in ("silu", "swish"):
        return "swiglu"
    if act.startswith("gelu"):
        return "geglu"
    raise BadInputError(f"{cfg.source}: hidden_act={act!r} is not supported for a gated FFN: use silu or gelu")


def _llama_like(cfg: _Config) -> dict[str, Any]:
    """Fields shared by llama, mistral, mixtral, qwen2, qwen3, qwen3_moe (RMSNorm, RoPE, gated FFN, GQA)."""
    heads = int(cfg.req("num_attention_heads"))
    fields: dict[str, Any] = dict(
        num_layers=cfg.req("num_hidden_layers"),
        hidden_size=cfg.req("hidden_size"),
        ffn_hidden_size=cfg.req("intermediate_size"),
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        vocab_size=cfg.req("vocab_size"),
        seq_len=_seq_len(cfg),
        activation=_gated_activation(cfg),
        norm="rmsnorm",
        position="rope",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
    )
    if cfg.get("head_dim") is not None:
        fields["head_dim"] = cfg.get("head_dim")
    if cfg.get("attention_bias", False):
        fields["qkv_bias"] = True
        if cfg.get("mlp_bias", False):
            fields["linear_bias"] = True
    return fields


def _llama(cfg: _Config) -> dict[str, Any]:
    return _llama_like(cfg)


def _qwen2(cfg: _Config) -> dict[str, Any]:
    """Qwen2 always has Q/K/V biases (modeling_qwen2: q_proj/k_proj/v_proj bias=True)."""
    return {**_llama_like(cfg), "qkv_bias": True}


def _qwen3(cfg: _Config) -> dict[str, Any]:
    """Qwen3: no QKV bias (unless attention_bias), per-head RMSNorm on q and k."""
    return {**_llama_like(cfg), "qk_norm": True}


def _mixtral(cfg: _Config) -> dict[str, Any]:
    moe = MoESpec(
        num_experts=cfg.req("num_local_experts"),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("intermediate_size"),
    )
    return {**_llama_like(cfg), "moe": moe}


def _qwen3_moe(cfg: _Config) -> dict[str, Any]:
    """Qwen3-MoE: layer i is sparse when i not in mlp_only_layers and (i + 1) % decoder_sparse_step == 0."""
    step = int(cfg.get("decoder_sparse_step", 1))
    dense_only = sorted(int(i) for i in cfg.get("mlp_only_layers", []))
    first_k = step - 1
    if dense_only:
        if step != 1 or dense_only != list(range(len(dense_only))):
            raise BadInputError(
                f"{cfg.source}: mlp_only_layers={dense_only} with decoder_sparse_step={step} cannot be expressed: "
                "only leading dense layers (mlp_only_layers = [0..k-1] with decoder_sparse_step 1) are supported"
            )
        first_k = len(dense_only)
    moe = MoESpec(
        num_experts=cfg.req("num_experts"),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"),
        first_k_dense=first_k,
        moe_every=step,
    )
    return {**_qwen3(cfg), "moe": moe}


def _deepseek_v3(cfg: _Config) -> dict[str, Any]:
    """DeepSeek-V3: MLA attention, leading dense layers, shared + routed experts (see module docstring)."""
    mla = MLASpec(
        q_lora_rank=cfg.get("q_lora_rank"),
        kv_lora_rank=cfg.req("kv_lora_rank"),
        qk_nope_head_dim=cfg.req("qk_nope_head_dim"),
        qk_rope_head_dim=cfg.req("qk_rope_head_dim"),
        v_head_dim=cfg.req("v_head_dim"),
    )
    first_k, freq = int(cfg.get("first_k_dense_replace", 0)), int(cfg.get("moe_layer_freq", 1))
    if freq > 1 and first_k % freq:
        raise BadInputError(
            f"{cfg.source}: moe_layer_freq={freq} does not divide first_k_dense_replace={first_k}: HF's MoE layers "
            "(index % moe_layer_freq == 0) cannot be expressed; write a model spec YAML instead"
        )
    moe = MoESpec(
        num_experts=cfg.req("n_routed_experts"),
        top_k=cfg.req("num_experts_per_tok"),
        expert_ffn_hidden_size=cfg.req("moe_intermediate_size"),
        num_shared_experts=cfg.get("n_shared_experts", 0),
        first_k_dense=first_k,
        moe_every=freq,
    )
    fields = _llama_like(cfg)
    fields.update(num_kv_heads=None, mla=mla, moe=moe)
    fields.pop("head_dim", None)
    return fields


def _gpt2(cfg: _Config) -> dict[str, Any]:
    """GPT-2: LayerNorm, biases everywhere, learned positions (n_positions), n_inner None = 4h, tied head."""
    hidden = int(cfg.req("n_embd", "hidden_size"))
    return dict(
        num_layers=cfg.req("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=cfg.get("n_inner", 4 * hidden),
        num_attention_heads=cfg.req("n_head", "num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=_seq_len(cfg, "n_positions"),
        activation="gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        linear_bias=True,
    )


def _gpt_neox(cfg: _Config) -> dict[str, Any]:
    """GPT-NeoX/Pythia: LayerNorm, biases, partial rotary (no parameters), untied embed_out by default."""
    return dict(
        num_layers=cfg.req("num_hidden_layers"),
        hidden_size=cfg.req("hidden_size"),
        ffn_hidden_size=cfg.req("intermediate_size"),
        num_attention_heads=cfg.req("num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=_seq_len(cfg),
        activation="gelu",
        norm="layernorm",
        position="rope",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        linear_bias=bool(cfg.get("attention_bias", True)),
    )


def _opt(cfg: _Config) -> dict[str, Any]:
    """OPT: ReLU FFN of width ffn_dim, learned positions, LayerNorm, biases, tied head."""
    hidden = int(cfg.req("hidden_size"))
    proj = cfg.get("word_embed_proj_dim", hidden)
    if int(proj) != hidden:
        raise BadInputError(
            f"{cfg.source}: word_embed_proj_dim={proj} differs from hidden_size={hidden} (OPT-350m projections): "
            "not expressible as a ModelSpec; write a spec YAML instead"
        )
    act = str(cfg.get("activation_function", "relu"))
    return dict(
        num_layers=cfg.req("num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=cfg.req("ffn_dim"),
        num_attention_heads=cfg.req("num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=_seq_len(cfg),
        activation="relu" if act == "relu" else "gelu",
        norm="layernorm",
        position="learned",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        linear_bias=bool(cfg.get("enable_bias", True)),
    )


def _bloom(cfg: _Config) -> dict[str, Any]:
    """BLOOM: ALiBi (no position parameters), LayerNorm right after the embedding, 4h GeLU FFN, tied head."""
    hidden = int(cfg.req("hidden_size", "n_embed"))
    return dict(
        num_layers=cfg.req("n_layer", "num_hidden_layers"),
        hidden_size=hidden,
        ffn_hidden_size=4 * hidden,
        num_attention_heads=cfg.req("n_head", "num_attention_heads"),
        vocab_size=cfg.req("vocab_size"),
        seq_len=min(int(cfg.get("seq_length", BLOOM_SEQ_LEN)), MAX_DEFAULT_SEQ_LEN),
        activation="gelu",
        norm="layernorm",
        position="alibi",
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)),
        linear_bias=True,
        embedding_norm=True,
    )


IMPORTERS: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _llama,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "opt": _opt,
    "bloom": _bloom,
}


def supported_model_types() -> list[str]:
    """model_type values spec_from_hf_config understands."""
    return sorted(IMPORTERS)


def _default_name(data: dict[str, Any], path: Path | None, model_type: str) -> str:
    named = data.get("_name_or_path")
    if isinstance(named, str) and named.strip():
        return named.strip().rstrip("/").split("/")[-1]
    if path is not None:
        return path.parent.name if path.name == "config.json" and path.parent.name else path.stem
    return model_type


def spec_from_hf_config(
    config: dict[str, Any] | str | Path, *, name: str | None = None, source: str | None = None
) -> ModelSpec:
    """Translate a HuggingFace config (a dict, or a path to config.json) into a ModelSpec.

    Raises BadInputError for an unknown model_type (listing the supported ones), a missing field (naming the field
    and the file) or values the schema rejects.
    """
    path = None if isinstance(config, dict) else Path(config)
    data = config if isinstance(config, dict) else load_structured(path)
    where = source or (str(path) if path is not None else "config")
    if not isinstance(data, dict):
        raise BadInputError(f"{where}: expected a JSON object (HuggingFace config), got {type(data).__name__}")
    model_type = data.get("model_type")
    if model_type not in IMPORTERS:
        raise BadInputError(
            f"{where}: model_type={model_type!r} is not supported: use one of {', '.join(supported_model_types())} "
            "or write a model spec YAML"
        )
    try:
        fields = IMPORTERS[model_type](_Config(data, where))
        fields["name"] = name or _default_name(data, path, model_type)
        fields["source"] = f"HuggingFace config.json ({model_type}): {where}"
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise BadInputError(format_validation_error(exc, where)) from None
    except (TypeError, ValueError) as exc:  # int() of a non-number, e.g. "hidden_size": "big"
        raise BadInputError(f"{where}: a numeric field of the HuggingFace config is not a number: {exc}") from None

