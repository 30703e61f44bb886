"""HuggingFace `config.json` -> ModelSpec, for the decoder-only families the planner supports (IMPORTERS).

Supported model_type values: llama, mistral, mixtral, phi3, granite, qwen2, qwen2_moe, qwen3, qwen3_moe, olmo2,
gemma2, gemma3_text, starcoder2, deepseek_v3 (planner.models.hf_modern, one table of how each departs from Llama),
gpt2, gpt_neox, opt, bloom, falcon (planner.models.hf_classic), and the 2025-26 types gpt_oss, llama4 / llama4_text,
glm4_moe, deepseek_v2, ernie4_5_moe, mistral3 / ministral, olmoe, dbrx, granitemoe, cohere2, smollm3, exaone4,
hunyuan_v1_moe, phimoe (planner.models.hf_recent; llama4 and mistral3 are planned as their text_config's language
model), and the hybrid stacks qwen3_next (Gated DeltaNet linear attention) and jamba (Mamba-1 layers)
(planner.models.hf_hybrid). Field names, key spellings of transformers
4.x and 5.x, and defaults follow the transformers configuration classes (planner.models.hf_config). Parameter
counts equal transformers 5.x's `sum(p.numel() for p in model.parameters())` exactly for every supported type
(tests/unit/test_models_hf_parity.py builds each on the meta device).

seq_len: the config only gives the longest supported context (max_position_embeddings, GPT-2 n_positions), not
the training length, so seq_len = min(that, 8192) (MAX_DEFAULT_SEQ_LEN); BLOOM has no such field and gets its
pre-training length 2048. A request can always override seq_len. Learned position tables keep their configured
size (num_positions), whatever the seq_len.

Recorded without parameters, for the exports (a job must set them): RoPE base (rope_theta, 5.x rope_parameters),
partial rotary (NeoX rotary_pct, GLM partial_rotary_factor), norm epsilon, parallel residual (NeoX, Falcon, Cohere)
(architecture_fields). Per-layer attention kinds (layer_types: sliding / chunked windows) are read for the 2025-26
types and priced (ModelSpec.attention_fraction); for gemma2/gemma3_text/mistral they are still ignored (attention
counted as full causal, an overestimate only for seq_len > sliding_window). RoPE scaling (rope_scaling / 5.x
rope_parameters rope_type linear, dynamic, yarn, llama3) and Granite's multipliers are recorded for the exports
(ModelSpec.rope_scaling, ModelSpec.multipliers). Ignored: soft-capping (Gemma2) and initialisation settings. Dropout is kept as
one flag (ModelSpec.dropout: any probability > 0; None when the config names none).
Configurations the schema cannot express raise BadInputError naming the key, its value and the fix: OPT
word_embed_proj_dim != hidden_size or without its final LayerNorm, Qwen-MoE mlp_only_layers other than the
leading layers, DeepSeek moe_layer_freq not dividing first_k_dense_replace or attention_bias, GPT-2 cross-attention.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from planner.errors import BadInputError
from planner.io import format_validation_error, load_structured
from planner.models import hf_classic, hf_hybrid, hf_modern, hf_recent
from planner.models.hf_config import MAX_DEFAULT_SEQ_LEN, HFConfig
from planner.schemas.model import ModelSpec

__all__ = ["IMPORTERS", "MAX_DEFAULT_SEQ_LEN", "spec_from_hf_config", "supported_model_types"]


@dataclass(frozen=True)
class Importer:
    """Builds ModelSpec fields from an HFConfig carrying `defaults`, after refusing values outside `expects`."""

    build: Callable[[HFConfig], dict[str, Any]]
    defaults: Mapping[str, Any] = field(default_factory=dict)
    expects: Mapping[str, Any] = field(default_factory=dict)


IMPORTERS: dict[str, Importer] = {
    **{
        model_type: Importer(partial(hf_modern.family_fields, family=family), family.defaults)
        for model_type, family in hf_modern.FAMILIES.items()
    },
    "deepseek_v3": Importer(hf_modern.deepseek_v3, hf_modern.DEEPSEEK_V3_DEFAULTS, hf_modern.DEEPSEEK_V3_EXPECTS),
    "gpt2": Importer(hf_classic.gpt2, expects=hf_classic.GPT2_EXPECTS),
    "gpt_neox": Importer(hf_classic.gpt_neox),
    "opt": Importer(hf_classic.opt, expects=hf_classic.OPT_EXPECTS),
    "bloom": Importer(hf_classic.bloom),
    "falcon": Importer(hf_classic.falcon, hf_classic.FALCON_DEFAULTS),
    **{
        model_type: Importer(build, hf_recent.DEFAULTS.get(model_type, {}), hf_recent.EXPECTS.get(model_type, {}))
        for model_type, build in hf_recent.BUILDERS.items()
    },
    **{
        model_type: Importer(build, hf_hybrid.DEFAULTS.get(model_type, {}))
        for model_type, build in hf_hybrid.BUILDERS.items()
    },
}

ROPE_THETA = ("rope_theta", "rotary_emb_base")  # NeoX spells it rotary_emb_base
ROTARY_FRACTION = ("partial_rotary_factor", "rotary_pct")  # NeoX rotary_pct; Phi-3 / GLM partial_rotary_factor
NORM_EPS = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon", "norm_epsilon")


def architecture_fields(cfg: HFConfig, fields: dict[str, Any]) -> dict[str, Any]:
    """RoPE base and rotated fraction, and norm epsilon: no parameters, but a job that trains this model must set them
    (Megatron --rotary-base, --rotary-percent, --norm-epsilon). transformers 5.x nests the RoPE settings in
    rope_parameters (modeling_rope_utils); 4.x wrote them at the top level."""
    rope = cfg.data.get("rope_parameters") if isinstance(cfg.data.get("rope_parameters"), dict) else {}
    extra: dict[str, Any] = {}
    if fields.get("position", "rope") == "rope":
        theta = rope.get("rope_theta") or cfg.get(*ROPE_THETA)
        fraction = rope.get("partial_rotary_factor") or cfg.get(*ROTARY_FRACTION)
        if theta is not None and "rope_theta" not in fields:
            extra["rope_theta"] = float(theta)
        if fraction is not None and float(fraction) < 1:
            extra["rotary_percent"] = float(fraction)
    eps = cfg.get(*NORM_EPS)
    if eps is not None:
        extra["norm_eps"] = float(eps)
    scaling = rope_scaling_of(cfg, rope) if fields.get("position", "rope") == "rope" else None
    if scaling is not None:
        extra["rope_scaling"] = scaling
    if cfg.model_type in GRANITE_TYPES:
        extra["multipliers"] = {"embedding": float(cfg.get("embedding_multiplier", default=1.0)),
                                "residual": float(cfg.get("residual_multiplier", default=1.0)),
                                "attention": cfg.get("attention_multiplier"),
                                "logits_scaling": float(cfg.get("logits_scaling", default=1.0))}
    return {**extra, **fields}


GRANITE_TYPES = ("granite", "granitemoe")  # configuration_granite.py: embedding/residual/attention multipliers, logits_scaling
ROPE_SCALING_KEYS = {"original_max_position_embeddings": "original_max_position_embeddings",
                     "low_freq_factor": "low_freq_factor", "high_freq_factor": "high_freq_factor",
                     "beta_fast": "beta_fast", "beta_slow": "beta_slow", "mscale": "mscale",
                     "mscale_all_dim": "mscale_all_dim", "truncate": "truncate"}


def rope_scaling_of(cfg: HFConfig, rope: dict[str, Any]) -> dict[str, Any] | None:
    """RoPE frequency scaling: 4.x `rope_scaling` {type|rope_type, factor, ...}, 5.x `rope_parameters` {rope_type,
    factor, ...} (modeling_rope_utils ROPE_INIT_FUNCTIONS); None for the default (unscaled) RoPE. A kind the planner
    does not record (longrope, su, mrope...) is refused with the key named."""
    raw = cfg.data.get("rope_scaling") if isinstance(cfg.data.get("rope_scaling"), dict) else rope
    kind = raw.get("rope_type") or raw.get("type")
    if kind in (None, "default"):
        return None
    if kind not in ("linear", "dynamic", "yarn", "llama3"):
        raise cfg.refuse("rope_scaling", kind, "only linear, dynamic, yarn and llama3 RoPE scaling are recorded")
    fields = {ours: raw[theirs] for theirs, ours in ROPE_SCALING_KEYS.items() if raw.get(theirs) is not None}
    return {"kind": kind, "factor": float(raw.get("factor", 1.0)), **fields}


DROPOUT_KEYS = ("attention_dropout", "hidden_dropout", "resid_pdrop", "attn_pdrop", "embd_pdrop", "dropout",
                "activation_dropout", "hidden_dropout_prob", "attention_probs_dropout_prob", "ffn_dropout")


def dropout_of(data: dict[str, Any]) -> bool | None:
    """Whether the config trains with dropout: True when any dropout probability it sets is > 0, False when it
    sets them and all are 0 (Llama, Mixtral, BLOOM, NeoX), None when it names none (the framework's default)."""
    values = [data.get(k) for k in DROPOUT_KEYS]
    probabilities = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return None if not probabilities else any(p > 0 for p in probabilities)


def supported_model_types() -> list[str]:
    """model_type values spec_from_hf_config understands (multimodal wrappers planned as their text model included)."""
    return sorted([*IMPORTERS, *hf_recent.WRAPPERS])


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
    and the file), a value the schema cannot express (naming the key and value) or values the schema rejects.
    """
    path = None if isinstance(config, dict) else Path(config)
    data = config if isinstance(config, dict) else load_structured(path)
    where = source or (str(path) if path is not None else "config")
    if not isinstance(data, dict):
        raise BadInputError(f"{where}: expected a JSON object (HuggingFace config), got {type(data).__name__}")
    model_type = data.get("model_type")
    wrapper = model_type if model_type in hf_recent.WRAPPERS else None
    if wrapper is not None:
        data = hf_recent.text_config(data, where)
        model_type = data["model_type"]
    if model_type in hf_recent.REFUSED:
        raise BadInputError(f"{where}: model_type={model_type!r} is not supported: {hf_recent.REFUSED[model_type]}")
    if model_type not in IMPORTERS:
        raise BadInputError(
            f"{where}: model_type={model_type!r} is not supported: use one of {', '.join(supported_model_types())} "
            "or write a model spec YAML"
        )
    importer = IMPORTERS[model_type]
    try:
        cfg = HFConfig(data, where, importer.defaults)
        cfg.require_values(importer.expects)
        fields = architecture_fields(cfg, importer.build(cfg))
        fields["dropout"] = dropout_of(data)
        fields["name"] = name or _default_name(data, path, model_type)
        fields["source"] = f"HuggingFace config.json ({model_type}): {where}"
        if wrapper is not None:
            fields["source"] += f" (the language model of {wrapper}: its text_config; vision tower and projector not planned)"
        return ModelSpec.model_validate(fields)
    except ValidationError as exc:
        raise BadInputError(format_validation_error(exc, where)) from None
    except (TypeError, ValueError) as exc:  # int() of a non-number, e.g. "hidden_size": "big"
        raise BadInputError(f"{where}: a numeric field of the HuggingFace config is not a number: {exc}") from None
