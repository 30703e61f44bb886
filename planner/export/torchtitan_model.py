"""The model half of a torchtitan 0.3 export: the plan's own model, never a stand-in.

torchtitan 0.3 picks a model by `--module <module> --config <config_registry function>`; ConfigManager
(torchtitan/config/manager.py `_load_config`) imports a fully qualified module name too, so the export can carry a
config module of its own. Three cases:

1. The plan's model is, field for field, one of torchtitan's registered flavors (BASE_CONFIGS: the architecture of our
   preset equals that of torchtitan's llama3_8b/70b/405b, deepseek_v3_671b): `--module <family> --config <function>`.
2. A dense Llama-lineage model torchtitan's llama3 family builds (RMSNorm pre-norms, SwiGLU, GQA with any head_dim,
   optional per-head q/k RMSNorm, RoPE, no biases, tied or untied embeddings): a generated module
   `planner_torchtitan_model.py` (written by the export script next to the launch) whose `planner_model()` returns
   llama3_8b's Trainer.Config with the model replaced by a Llama3Model.Config of the exact sizes, built with
   torchtitan's own builders (torchtitan/models/common/config_utils.py make_gqa_config, make_ffn_config;
   torchtitan/models/llama3/model.py Llama3TransformerBlock; common RMSNorm(eps), ComplexRoPE(theta), Embedding,
   Linear; Decoder.Config.enable_weight_tying), and the loss's vocabulary set to the model's.
3. An MoE or MLA model one of torchtitan's MoE families builds (qwen3: GQA + MoE; deepseek_v3: MLA + MoE; gpt_oss:
   sinks, biases, sliding windows): a generated module from that family's own builders
   (planner.export.torchtitan_moe).
4. Anything else (and the features of the torchtitan profile's unsupported_models): refused, naming what is
   missing; no stand-in is ever exported.

Module names are the 0.3 Decoder's: tok_embeddings, layers.<i>, norm, lm_head (stage FQNs name the model's real
layers: the generated model has exactly the plan's num_layers).
"""

from __future__ import annotations

from planner.export import rope_scaling
from planner.export.common import refuse
from planner.export.torchtitan_moe import family_gaps, moe_module
from planner.models import load_model
from planner.schemas.model import ModelSpec

TARGET = "torchtitan"
GENERATED_MODULE = "planner_torchtitan_model"
GENERATED_CONFIG = "planner_model"
# Our presets whose architecture is a torchtitan 0.3 flavor -> (module, config_registry function).
BASE_CONFIGS = {
    "llama3-8b": ("llama3", "llama3_8b"),
    "llama3-70b": ("llama3", "llama3_70b"),
    "llama3-405b": ("llama3", "llama3_405b"),
    "deepseek-v3": ("deepseek_v3", "deepseek_v3_671b"),
}
# Fields that describe the architecture (not the name, its source, the default training length or dropout).
NOT_ARCHITECTURE = {"name", "source", "seq_len", "dropout", "num_positions", "schema_version"}


def architecture(spec: ModelSpec) -> dict:
    """The spec's architecture fields (what two names of one model share)."""
    return {k: v for k, v in spec.model_dump().items() if k not in NOT_ARCHITECTURE}


def _core(spec: ModelSpec) -> dict:
    """Architecture fields without RoPE base, RoPE scaling and norm epsilon, which our presets leave unsaid."""
    return {k: v for k, v in architecture(spec).items() if k not in ("rope_theta", "norm_eps", "rope_scaling")}


def _same_as_preset(spec: ModelSpec) -> tuple[str, str] | None:
    """The registered flavor whose architecture (every field but name, source, default length, dropout, RoPE base and
    norm epsilon) the plan's model has, if any."""
    core = _core(spec)
    for preset, pair in BASE_CONFIGS.items():
        if _core(load_model(preset)) == core:
            return pair
    return None


def llama_family_gap(spec: ModelSpec) -> str | None:
    """What keeps torchtitan 0.3's llama3 family from building `spec` exactly, or None."""
    gaps = {
        "mixture-of-experts layers": spec.moe is not None,
        "multi-head latent attention": spec.mla is not None,
        f"{spec.norm} (the llama3 family has RMSNorm)": spec.norm != "rmsnorm",
        f"activation {spec.activation!r} (the llama3 family has SwiGLU)": spec.activation != "swiglu",
        f"position {spec.position!r} (the llama3 family has RoPE)": spec.position != "rope",
        "linear biases": spec.linear_bias or spec.qkv_bias or spec.out_bias or spec.mlp_bias,
        "q/k norms over whole projections": spec.qk_norm and spec.qk_norm_scope == "projection",
        f"{spec.norms_per_layer} norms per layer": spec.norms_per_layer != 2,
        "sliding-window or chunked attention layers": spec.layer_types is not None and set(spec.layer_types) != {"full"},
        "a gated attention output (Qwen3-Next)": spec.attention_output_gate,
        "q/k norms after RoPE (its qk_norm runs before RoPE)": spec.qk_norm_after_rope,
        "Granite's activation multipliers": spec.multipliers is not None,
        "attention sinks": spec.attention_sinks,
        "partial RoPE": spec.rotary_percent is not None and spec.rotary_percent < 1,
        "layers without RoPE (NoPE)": bool(spec.nope_layers),
        "parallel attention/MLP residual": spec.parallel_residual,
    }
    found = next((what for what, present in gaps.items() if present), None)
    return found or rope_scaling.torchtitan_gap(spec, complex_rope=True)


def model_choice(spec: ModelSpec, cp: int = 1) -> tuple[str, str, str | None]:
    """(module, config function, generated module text or None) for the plan's model (trained with context
    parallelism of `cp`); refuses what 0.3 cannot build."""
    pair = _same_as_preset(spec)
    if pair is not None:
        return pair[0], pair[1], None
    if spec.moe is not None or spec.mla is not None:
        family, gap = family_gaps(spec)
        if family is None:
            raise refuse(TARGET, f"torchtitan 0.3 has no model for {spec.name!r} with {gap} (it builds MoE as its qwen3 "
                                 "(GQA + MoE), deepseek_v3 (MLA + MoE) and gpt_oss (sinks, biases, windows) families)",
                         "train this model with another --framework")
        return GENERATED_MODULE, GENERATED_CONFIG, moe_module(spec, family, GENERATED_MODULE, cp)
    gap = llama_family_gap(spec)
    if gap is not None:
        raise refuse(TARGET, f"torchtitan 0.3 has no model for {spec.name!r} with {gap} (its llama3 family builds dense "
                             "RMSNorm/SwiGLU/RoPE decoders; MoE and MLA as its qwen3, deepseek_v3 and gpt_oss "
                             "families)", "train this model with another --framework")
    return GENERATED_MODULE, GENERATED_CONFIG, generated_module(spec)


def generated_module(spec: ModelSpec) -> str:
    """Python source of a torchtitan 0.3 config module building exactly `spec` (a dense Llama-lineage decoder)."""
    head_dim = spec.dim_per_head
    qk_norm = f"RMSNorm.Config(normalized_shape={head_dim}, eps=EPS)" if spec.qk_norm else "None"
    values = dict(DIM=spec.hidden_size, N_LAYERS=spec.num_layers, N_HEADS=spec.num_attention_heads,
                  N_KV_HEADS=spec.kv_heads, HEAD_DIM=head_dim, FFN_DIM=spec.ffn_hidden_size, VOCAB=spec.vocab_size,
                  MAX_SEQ_LEN=max(spec.seq_len, spec.num_positions or 0), THETA=float(spec.rope_theta or 10000.0),
                  EPS=float(spec.norm_eps or 1e-5), TIED=spec.tied_embeddings,
                  ROPE_SCALING=rope_scaling.torchtitan_fields(spec))
    constants = "\n".join(f"{key} = {value!r}" for key, value in values.items())
    return GENERATED_SOURCE.format(spec=spec, GENERATED_MODULE=GENERATED_MODULE, GENERATED_CONFIG=GENERATED_CONFIG,
                                   constants=constants, qk_norm=qk_norm)


# The module generated_module writes (str.format fields: spec, GENERATED_MODULE, GENERATED_CONFIG, constants, qk_norm).
GENERATED_SOURCE = '''"""torchtitan 0.3 config module written by llm-planner: the model {spec.name!r}, exactly.

Use: put this file on PYTHONPATH and run torchtitan with --module {GENERATED_MODULE} --config {GENERATED_CONFIG}.
Training settings (optimizer, data, checkpointing) are those of torchtitan's llama3_8b; override them as usual.
"""

import dataclasses
from functools import partial

import torch.nn as nn
from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
from torchtitan.models.common.config_utils import get_attention_config, make_ffn_config, make_gqa_config
from torchtitan.models.llama3 import config_registry as llama3_configs
from torchtitan.models.llama3 import model_registry
from torchtitan.models.llama3.model import Llama3Model, Llama3TransformerBlock

{constants}

_LINEAR_INIT = {{"weight": partial(nn.init.trunc_normal_, std=0.02), "bias": nn.init.zeros_}}
_NORM_INIT = {{"weight": nn.init.ones_}}


def _norm(width):
    return RMSNorm.Config(normalized_shape=width, eps=EPS, param_init=_NORM_INIT)


def model_config(attn_backend="flex"):
    rope = ComplexRoPE.Config(dim=HEAD_DIM, max_seq_len=MAX_SEQ_LEN, theta=THETA, **ROPE_SCALING)
    layers = [
        Llama3TransformerBlock.Config(
            attention_norm=_norm(DIM),
            ffn_norm=_norm(DIM),
            attention=make_gqa_config(
                dim=DIM, n_heads=N_HEADS, n_kv_heads=N_KV_HEADS, head_dim=HEAD_DIM, wqkv_param_init=_LINEAR_INIT,
                wo_param_init=_LINEAR_INIT, inner_attention=get_attention_config(attn_backend), rope=rope,
                qk_norm={qk_norm},
            ),
            feed_forward=make_ffn_config(dim=DIM, hidden_dim=FFN_DIM, w1_param_init=_LINEAR_INIT,
                                         w2w3_param_init=_LINEAR_INIT),
        )
        for _ in range(N_LAYERS)
    ]
    return Llama3Model.Config(
        dim=DIM, vocab_size=VOCAB,
        tok_embeddings=Embedding.Config(num_embeddings=VOCAB, embedding_dim=DIM,
                                        param_init={{"weight": partial(nn.init.normal_, std=1.0)}}),
        norm=_norm(DIM),
        lm_head=Linear.Config(in_features=DIM, out_features=VOCAB, param_init=_LINEAR_INIT),
        layers=layers,
        enable_weight_tying=TIED,
    )


def {GENERATED_CONFIG}():
    config = llama3_configs.llama3_8b()
    config.model_spec = dataclasses.replace(model_registry("8B"), flavor="{spec.name}", model=model_config())
    config.loss.loss_fn.global_vocab_size = VOCAB
    return config
'''
