"""RoPE frequency scaling (ModelSpec.rope_scaling) in the exports: the flags or config fields each stack has for it,
and one clear line for what it lacks. No parameters change, but a job without the scaling trains other positions.

Megatron-LM core_v0.16.1 (megatron/training/arguments.py, megatron/core/models/common/embeddings/):
- llama3: --use-rope-scaling --rope-scaling-factor F. RotaryEmbedding passes only the factor to _apply_scaling,
  whose low_freq_factor=1, high_freq_factor=4, original_max_position_embeddings=8192 are fixed
  (rotary_pos_embedding.py): other values are warned.
- linear: --rotary-seq-len-interpolation-factor (an int: positions divided by it).
- yarn: for MLA, --rope-type yarn --rotary-scaling-factor F --mscale M --mscale-all-dim M' (_add_mla_args);
  original_max_position_embeddings, beta_fast and beta_slow are MLATransformerConfig fields without flags
  (defaults 4096, 32, 1: other values are warned). Without MLA there is no flag (--position-embedding-type offers
  learned_absolute, rope, mrope, relative, none; yarn_* are read from the config by gpt_model.py only): warned.
- dynamic (NTK): no flag: warned.
torchtitan 0.3 (torchtitan/models/common/rope.py RoPE.Config): scaling "llama" (scaling_factor, low_freq_factor,
high_freq_factor, original_max_position_embeddings; ComplexRoPE only, CosSinRoPE raises NotImplementedError) and
"yarn" (rope_factor, beta_fast, beta_slow, original_seq_len, truncate); linear and dynamic have none: refused.
"""

from __future__ import annotations

from planner.schemas.model import ModelSpec

MEGATRON_LLAMA3_FIXED = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
MEGATRON_YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def _differs(scaling, fixed: dict) -> list[str]:
    return [f"{key}={getattr(scaling, key)}" for key, value in fixed.items()
            if getattr(scaling, key) is not None and float(getattr(scaling, key)) != value]


def megatron_args(spec: ModelSpec, warnings: list[str]) -> list[str]:
    """Megatron-LM flags for the spec's RoPE scaling; what core_v0.16.1 cannot express goes to `warnings`."""
    scaling = spec.rope_scaling
    if scaling is None or spec.position != "rope":
        return []
    kind, factor = scaling.kind, scaling.factor
    if kind == "llama3":
        fixed = _differs(scaling, MEGATRON_LLAMA3_FIXED)
        if fixed:
            warnings.append(f"rope_scaling llama3 with {', '.join(fixed)}: Megatron's _apply_scaling fixes "
                            "low_freq_factor=1, high_freq_factor=4, original_max_position_embeddings=8192 "
                            "(rotary_pos_embedding.py): set them in your model provider")
        return ["--use-rope-scaling", "--rope-scaling-factor", repr(factor)]
    if kind == "linear" and float(factor).is_integer():
        return ["--rotary-seq-len-interpolation-factor", str(int(factor))]
    if kind == "yarn" and spec.mla is not None:
        fixed = _differs(scaling, MEGATRON_YARN_FIXED)
        if fixed:
            warnings.append(f"rope_scaling yarn with {', '.join(fixed)}: MLATransformerConfig has no flag for them "
                            "(defaults original_max_position_embeddings=4096, beta_fast=32, beta_slow=1)")
        args = ["--rope-type", "yarn", "--rotary-scaling-factor", repr(factor)]
        if scaling.mscale is not None:
            args += ["--mscale", repr(scaling.mscale)]
        if scaling.mscale_all_dim is not None:
            args += ["--mscale-all-dim", repr(scaling.mscale_all_dim)]
        return args
    where = {"yarn": "YaRN has flags for multi-latent attention only (--rope-type yarn with MLA; "
                     "--position-embedding-type has no 'yarn')",
             "linear": "--rotary-seq-len-interpolation-factor takes an integer",
             "dynamic": "Megatron-LM has no dynamic-NTK RoPE"}[kind]
    warnings.append(f"rope_scaling {kind} (factor {factor}) is not exported: {where} at core_v0.16.1; the job trains "
                    "unscaled RoPE unless your model provider sets it")
    return []


def torchtitan_gap(spec: ModelSpec, *, complex_rope: bool) -> str | None:
    """What torchtitan 0.3's RoPE cannot express of the spec's scaling, or None."""
    scaling = spec.rope_scaling
    if scaling is None:
        return None
    if scaling.kind in ("linear", "dynamic"):
        return f"RoPE scaling {scaling.kind!r} (torchtitan's RoPE.Config scales 'llama' and 'yarn' only)"
    if scaling.kind == "llama3" and not complex_rope:
        return "llama3 RoPE scaling in a family built with CosSinRoPE (it raises NotImplementedError for it)"
    return None


def torchtitan_fields(spec: ModelSpec) -> dict:
    """Extra fields of torchtitan's RoPE.Config for the spec's scaling ({} without), after torchtitan_gap."""
    scaling = spec.rope_scaling
    if scaling is None:
        return {}
    if scaling.kind == "llama3":
        fields = {"scaling": "llama", "scaling_factor": scaling.factor, "low_freq_factor": scaling.low_freq_factor,
                  "high_freq_factor": scaling.high_freq_factor,
                  "original_max_position_embeddings": scaling.original_max_position_embeddings}
    else:
        fields = {"scaling": "yarn", "rope_factor": scaling.factor, "beta_fast": scaling.beta_fast,
                  "beta_slow": scaling.beta_slow, "original_seq_len": scaling.original_max_position_embeddings,
                  "truncate": scaling.truncate}
    return {key: value for key, value in fields.items() if value is not None}
