"""`planner profile --hf`: profile the HuggingFace implementation itself (AutoModelForCausalLM.from_config,
random weights), one layer per type, at one TP rank's shape.

The model is built with num_hidden_layers=1 (never whole) and heads, kv heads, intermediate size and vocab
divided by tp (head_dim kept), then its parts are measured with the same machinery as `planner.nn` layers:
`embed_tokens` (embedding), `layers[0]` with the rotary (cos, sin) computed once outside the timed region
(decoder), and `norm` + `lm_head` + fp32 cross-entropy as in HF's ForCausalLMLoss (head). Attention runs
with attn_implementation="sdpa" and no mask (causal), as HF training does.

Limits: HF computes attention in a function, not a module, so selective recompute is not measured (its
extra time is 0 and its saved bytes equal the no-recompute bytes; the entry's message says so); routed-
expert (MoE) layers of HF models are not profiled with --hf (the decoder types are dense only).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from planner.errors import BadInputError
from planner.profiling.measure import profile_model
from planner.profiling.measure_layers import CrossEntropy, LayerCase, OpSpec
from planner.profiling.options import ProfileOptions
from planner.schemas.model import ModelSpec
from planner.schemas.profile import Profile

SELECTIVE_NOTE = "--hf: selective recompute not measured (HF attention is a function, not a module)"


def _transformers():
    try:
        import transformers
    except ModuleNotFoundError:
        raise BadInputError("--hf needs the transformers package: pip install 'llm-planner[hf]' (or transformers)") from None
    return transformers


def hf_config_dict(model_ref: str, spec: ModelSpec) -> dict:
    """The HF config of `model_ref` (a config.json), or a Llama config written from a Llama-shaped spec."""
    path = Path(model_ref)
    if path.is_file():
        data = json.loads(path.read_text(encoding="utf-8")) if path.suffix == ".json" else None
        if isinstance(data, dict) and "model_type" in data:
            return data
    llama_shaped = (spec.moe is None and spec.mla is None and spec.activation == "swiglu" and spec.norm == "rmsnorm"
                    and spec.position == "rope" and not spec.qk_norm and spec.norms_per_layer == 2
                    and spec.has_qkv_bias == spec.has_out_bias)  # LlamaConfig.attention_bias: q, k, v and o together
    if not llama_shaped:
        raise BadInputError(f"--hf with model {model_ref!r}: only Llama-shaped specs (swiglu, rmsnorm, rope, dense) map to an HF "
                            "config; pass the model's HuggingFace config.json instead")
    return {"model_type": "llama", "hidden_size": spec.hidden_size, "intermediate_size": spec.ffn_hidden_size,
            "num_hidden_layers": spec.num_layers, "num_attention_heads": spec.num_attention_heads,
            "num_key_value_heads": spec.kv_heads, "head_dim": spec.dim_per_head, "vocab_size": spec.vocab_size,
            "max_position_embeddings": spec.seq_len, "tie_word_embeddings": spec.tied_embeddings,
            "attention_bias": spec.has_qkv_bias, "mlp_bias": spec.has_mlp_bias, "rms_norm_eps": 1e-5}


def _rank_config(data: dict, *, tp: int, seq_len: int):
    """A one-layer HF config at one TP rank's shape."""
    transformers = _transformers()
    heads = data["num_attention_heads"]
    head_dim = data.get("head_dim") or data["hidden_size"] // heads
    kv = data.get("num_key_value_heads") or heads
    local = {**data, "num_hidden_layers": 1, "num_attention_heads": heads // tp, "num_key_value_heads": kv // tp,
             "head_dim": head_dim, "vocab_size": -(-data["vocab_size"] // tp), "use_cache": False,
             "max_position_embeddings": max(seq_len, data.get("max_position_embeddings") or seq_len)}
    if "intermediate_size" in data:
        local["intermediate_size"] = data["intermediate_size"] // tp
    model_type = local.pop("model_type")
    try:
        return transformers.AutoConfig.for_model(model_type, **local)
    except (ValueError, KeyError) as exc:
        raise BadInputError(f"--hf: transformers cannot build model_type={model_type!r}: {exc}") from None


class _HfHead(nn.Module):
    def __init__(self, norm: nn.Module, lm_head: nn.Module):
        super().__init__()
        self.norm, self.lm_head, self.loss = norm, lm_head, CrossEntropy()

    def forward(self, h: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return self.loss(self.lm_head(self.norm(h)).float(), targets)


def _first(output):
    return output[0] if isinstance(output, (tuple, list)) else output


def make_builder(config: dict):
    """A Builder (see measure.Builder) of HF layers from `config`."""

    def build(spec: ModelSpec, layer_type: str, *, tp: int, ep: int, microbatch_size: int, seq_len: int,
              device: torch.device, param_dtype: torch.dtype) -> LayerCase:
        transformers = _transformers()
        if layer_type == "moe_decoder":
            raise BadInputError("--hf profiles dense layers only: drop --hf for MoE models (planner.nn has EP MoE layers)")
        cfg = _rank_config(config, tp=tp, seq_len=seq_len)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=param_dtype)
        core = model.model
        shape, hidden = (microbatch_size, seq_len), (microbatch_size, seq_len, cfg.hidden_size)
        vocab = cfg.vocab_size
        if layer_type == "embedding":
            emb = core.embed_tokens
            return LayerCase("embedding", emb, lambda: (torch.randint(0, vocab, shape, device=device),),
                             lambda inputs: (emb(*inputs),), (OpSpec("embedding", ("",)),))
        if layer_type == "head":
            head = _HfHead(core.norm, model.lm_head)
            return LayerCase("head", head, lambda: (torch.randn(hidden, device=device, dtype=param_dtype, requires_grad=True),
                                                    torch.randint(0, vocab, shape, device=device)),
                             lambda inputs: (head(*inputs),),
                             (OpSpec("final_norm", ("norm",)), OpSpec("lm_head", ("lm_head",)), OpSpec("loss", ("loss",))))
        layer = core.layers[0]
        positions = torch.arange(seq_len, device=device)[None].expand(microbatch_size, -1)
        with torch.no_grad():
            cos, sin = core.rotary_emb(torch.zeros(1, device=device, dtype=param_dtype), positions)
        ops = (OpSpec("norm_attn", ("input_layernorm",)),
               OpSpec("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
               OpSpec("attn_out", ("self_attn.o_proj",)), OpSpec("norm_mlp", ("post_attention_layernorm",)),
               OpSpec("mlp_up", ("mlp.gate_proj", "mlp.up_proj")), OpSpec("mlp_down", ("mlp.down_proj",)))
        return LayerCase(
            "decoder", layer, lambda: (torch.randn(hidden, device=device, dtype=param_dtype, requires_grad=True),),
            lambda inputs: (_first(layer(inputs[0], position_embeddings=(cos, sin), position_ids=positions)),),
            ops, constants=(cos, sin), note=SELECTIVE_NOTE,
        )

    return build


def profile_hf_model(spec: ModelSpec, opts: ProfileOptions, *, model_ref: str, command: str = "", on_entry=None,
                     progress=None) -> Profile:
    """`profile_model` on the HuggingFace layers of `model_ref`."""
    config = hf_config_dict(model_ref, spec)
    _transformers()
    result = profile_model(spec, opts, command=command, on_entry=on_entry, progress=progress, build=make_builder(config))
    return result
