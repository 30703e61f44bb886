"""The model a published run trained and the numbers its source states (benchmarks/published_runs.py, its rules
`architecture`, `precision` and `sequence length`): the ModelSpec, the precision (negation, fp8 implied by a
throughput above the bf16 peak), the TFLOP/s a stated throughput implies, the sequence length and global batch,
and the bytes per parameter of NeMo's performance recipe (rule `nemo_performance_recipe`).
"""

from __future__ import annotations

import re

from published_hardware import device_of

from planner.models import list_presets, load_preset
from planner.schemas.model import MLASpec, MoESpec, ModelSpec

GPT_VOCAB = 51200


def activation_of(text: str | None) -> str:
    """The activation named by the run: gated (`*glu`: SwiGLU, GeGLU), ReLU variants (squared ReLU too), else GeLU
    (FastGELU, unsaid: the GPT-3 convention)."""
    t = (text or "gelu").lower().replace("-", "").replace(" ", "")
    if "glu" in t:
        return "geglu" if "geglu" in t else "swiglu"
    return "relu" if "relu" in t else "gelu"


def _moe_spec(moe: dict) -> MoESpec:
    """The run's MoE block, whatever spelling of the usual fields it uses: experts, top-k, expert width, shared
    experts (and their own width where stated), leading dense layers, MoE every n-th layer, the capacity factor
    (unsaid or 0: dropless), and node- or group-limited routing (DeepSeek-V3 Sec. 2.1.2: each token reaches at most
    M nodes; HF n_group / topk_group)."""
    def pick(*keys, default=None):
        return next((moe[k] for k in keys if moe.get(k) is not None), default)

    experts = pick("num_routed_experts", "num_experts", "experts")
    fields = dict(num_experts=experts, top_k=pick("top_k", "topk", "experts_per_token", default=2),
                  expert_ffn_hidden_size=pick("expert_ffn_hidden", "expert_ffn_hidden_size", "ffn_hidden"),
                  num_shared_experts=pick("shared_experts", "num_shared_experts", default=0),
                  first_k_dense=pick("dense_layers_first", "first_k_dense", default=0))
    shared_ffn = pick("shared_expert_ffn_hidden", "shared_ffn_hidden", "shared_expert_intermediate_size")
    if shared_ffn:
        fields["shared_expert_ffn_hidden_size"] = int(shared_ffn)
        fields["num_shared_experts"] = fields["num_shared_experts"] or 1
    every = pick("moe_every", "moe_layer_freq", "moe_layer_interval", "expert_interval")
    if isinstance(every, int) and every > 1:
        fields["moe_every"] = every
    capacity = pick("capacity_factor", "moe_capacity_factor", "expert_capacity_factor")
    if isinstance(capacity, (int, float)) and capacity > 0:
        fields["capacity_factor"] = float(capacity)
    groups, group_topk = pick("num_groups", "n_group"), pick("group_topk", "topk_group", "node_limited_routing_max_nodes")
    if group_topk and not groups and moe.get("node_limited_routing_max_nodes"):
        groups = pick("num_nodes_spanned", "ep_nodes")  # M nodes of how many: only where the source says
    if groups and group_topk and int(group_topk) < int(groups) and experts and experts % int(groups) == 0:
        fields.update(num_groups=int(groups), group_topk=int(group_topk))
    return MoESpec(**fields)


def model_spec(run: dict, off: tuple[str, ...] = ()) -> ModelSpec:
    m = run["model"]
    activation = activation_of(m.get("activation"))
    gated = activation in ("swiglu", "geglu")
    position = (m.get("position") or "learned").lower()
    position = "rope" if gated or "rot" in position or "rope" in position else "alibi" if "alibi" in position else "learned"
    ffn = m.get("ffn_hidden")
    if ffn is None and m.get("moe") and m["moe"].get("expert_ffn_hidden"):
        ffn = m["moe"]["expert_ffn_hidden"]
    fields = dict(
        name=run["id"], num_layers=m["num_layers"], hidden_size=m["hidden"], num_attention_heads=m["num_heads"],
        ffn_hidden_size=ffn or 4 * m["hidden"], num_kv_heads=m.get("num_kv_heads"),
        vocab_size=m.get("vocab") or GPT_VOCAB, seq_len=seq_len_of(run), activation=activation,
        norm="rmsnorm" if gated else "layernorm", position=position, tied_embeddings=bool(m.get("tied_embeddings")),
        dropout=False if gated else None,  # Llama convention: no dropout; GPT-3-style: the stack's default
    )
    fields.update(named_architecture(run, off))
    stated_head_dim = next((m[k] for k in HEAD_DIM_FIELDS if isinstance(m.get(k), int) and m[k] > 0), None)
    if stated_head_dim:
        fields["head_dim"] = stated_head_dim
    elif m["hidden"] % m["num_heads"] and "head_dim" not in fields:
        fields["head_dim"] = m["hidden"] // m["num_heads"]
    if m.get("moe"):
        fields["moe"] = _moe_spec(m["moe"])
    if m.get("mla"):
        keys = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        fields["mla"] = MLASpec(**{k: m["mla"].get(k) for k in keys})
    fields["mtp_num_layers"] = mtp_of(run, off)
    return ModelSpec(**fields)


MTP_FIELDS = ("mtp_num_layers", "mtp_depth", "mtp_layers", "num_nextn_predict_layers", "num_mtp_layers")
MTP_TEXT = re.compile(r"(?:\bmtp|multi[- ]token prediction)\b[^.;,)]{0,20}?\b(?:depth|layers?|modules?)\D{0,3}(\d+)"
                      r"|(\d+)[- ](?:layer |module |depth )?(?:mtp|multi[- ]token prediction)\b"
                      r"|mtp[_-]num[_-]layers[\s=:]+(\d+)")
NEGATED_MTP = re.compile(r"\b(?:not|no|without|disabled?|off)\b[\w\s-]{0,20}?(?:mtp|multi[- ]token prediction)"
                         r"|(?:mtp|multi[- ]token prediction)[\w\s-]{0,12}?\b(?:disabled|off|not used)\b")


def mtp_of(run: dict, off: tuple[str, ...] = ()) -> int:
    """Multi-token prediction modules the run trained (ModelSpec.mtp_num_layers): a numeric model field under one of
    its usual names (Megatron --mtp-num-layers, DeepSeek's "MTP depth", HF num_nextn_predict_layers), else a depth
    stated in the model's or training's text ("MTP depth 1", "1 MTP layer"), not negated; else, for a NeMo run of
    DeepSeek-V3, its performance recipe's one MTP layer (rule nemo_performance_recipe: Megatron-Bridge's DeepSeek-V3
    perf recipes lay the pipeline out as "Et|(tt|)*30mL", an "m" that Megatron builds only with mtp_num_layers 1);
    else 0. A bare mention of MTP without a depth says nothing about how many modules ran, so it reads as none.
    With the rule mtp_depth_stated `off`, 0."""
    if "mtp_depth_stated" in off:
        return 0
    m = run["model"]
    for key in MTP_FIELDS:
        if isinstance(m.get(key), int) and not isinstance(m.get(key), bool):
            return int(m[key])
    text = " ".join(str(part) for part in (m.get("family"), m.get("notes"), run["training"].get("notes"),
                                            run["training"].get("mtp")) if part).lower()
    if NEGATED_MTP.search(text):
        return 0
    found = MTP_TEXT.search(text)
    if found:
        return int(next(group for group in found.groups() if group))
    deepseek_v3 = re.search(r"deepseek[- ]?v3", str(m.get("family") or "").lower()) and m.get("num_layers") == 61
    return 1 if runs_nemo_recipe(run, off) and deepseek_v3 else 0


NEMO_FRAMEWORK = re.compile(r"nemo|megatron[- ]bridge")


def runs_nemo_recipe(run: dict, off: tuple[str, ...] = ()) -> bool:
    """Rule nemo_performance_recipe: a run whose framework text names NeMo or Megatron-Bridge (NeMo's Megatron-Core
    trainer since NeMo 25.09, whose perf_recipes are NeMo's scripts/performance recipes: Megatron-Bridge
    src/megatron/bridge/perf_recipes/_common.py `_perf_precision`, the same as scripts/performance/utils/precision.py)
    ran NeMo's performance recipe (its bytes per parameter, published_runs.recipe_bytes_of; DeepSeek-V3's MTP layer,
    mtp_of); False with the rule off."""
    return bool(NEMO_FRAMEWORK.search((run["training"].get("framework") or "").lower())) and "nemo_performance_recipe" not in off


NEMO_RECIPE_BYTES = {"bf16": (2.0, 2.0, 12.0, 2.0, 2.0), "fp8": (2.0, 2.0, 12.0, 2.0, 1.0)}
"""Bytes per parameter (weights, gradients, optimizer, gradient reduction, weight gather) of NeMo's performance
recipes on Megatron-Core: 16-bit gradient buffers reduced in 16 bits for every precision
(NVIDIA/NeMo scripts/performance/helpers.py set_precision_configs: `recipe.trainer.plugins.grad_reduce_in_fp32 =
False`, for fp8 only before the 25.07 refactor ab020f6, for every dtype since; Megatron-Core then keeps the DDP
buffer in the parameter dtype, distributed_data_parallel.py grad_dtype; NeMo 1.x's Apex DistributedFusedAdam
synced gradients in the parameter dtype too); fp32 master weights and Adam moments in the distributed optimizer
(12); under fp8 the parameters themselves are fp8 with their fp8 transpose (1 + 1) and gathered in fp8 (1)
(nemo/collections/llm/recipes/precision/mixed_precision.py bf16_with_fp8_mixed: fp8_param_gather = True). Megatron-Bridge's
perf recipes set the same (src/megatron/bridge/perf_recipes/_common.py _perf_precision: grad_reduce_in_fp32 = False;
training/mixed_precision.py bf16_with_fp8_*: fp8_param_gather = True)."""


def recipe_bytes_of(run: dict, precision: str, off: tuple[str, ...] = ()) -> tuple[float, ...] | None:
    """The bytes-per-parameter recipe a run is priced with where its stack's launch sets one the profile does not:
    a run whose framework text names NeMo or Megatron-Bridge (runs_nemo_recipe) ran NeMo's performance recipe of its
    precision (NEMO_RECIPE_BYTES); None (the profile's recipe) otherwise or with the rule `off`."""
    return NEMO_RECIPE_BYTES.get(precision) if runs_nemo_recipe(run, off) else None


NEGATED_FP8 = re.compile(r"\b(?:not|no|without|non)\b[\w\s-]{0,30}?fp8")


NAMED_PRECISION = re.compile(r"fp8|bf16|bfloat16|fp16|float16|half|fp32|float32|tf32|mixed")


def precision_of(run: dict) -> str:
    """fp8 where the text says so (not negated), or where a text naming no precision states a throughput above
    the bf16 peak; else bf16: every stack here runs its own 16-bit mixed precision (fp32 master weights in the
    optimizer, 16-bit GEMMs and gathers); amp-bf16 is the planner's HuggingFace-eager recipe, whose per-parameter
    cast cache FSDP's mixed precision does not keep (fp16 runs at the bf16 tensor-core rate)."""
    text = (run["training"].get("precision") or "").lower()
    if "fp8" in text:
        return "bf16" if NEGATED_FP8.search(text) else "fp8"
    if not NAMED_PRECISION.search(text) and implied_tflops(run) > device_of(run).peak_bf16_tflops:
        return "fp8"
    return "bf16"


def implied_tflops(run: dict) -> float:
    """The TFLOP/s per GPU a run's stated throughput implies: the stated TFLOP/s, else 6 x active parameters x
    tokens/s per GPU (the least a training step computes per token); 0 when neither is stated."""
    res, gpus = run["results"], run["parallel"].get("num_gpus") or 1
    if res.get("tflops_per_gpu"):
        return float(res["tflops_per_gpu"])
    per_gpu = res.get("tokens_per_s_per_gpu") or (res["tokens_per_s"] / gpus if res.get("tokens_per_s") else 0)
    if not per_gpu or seq_len_of(run) is None:
        return 0.0
    from planner.models import counting

    return 6 * counting.active_params(model_spec(run)) * per_gpu / 1e12


def named_preset(run: dict) -> ModelSpec | None:
    """The shipped preset (planner/models/presets/<name>.yaml) whose name, letters and digits only, the run's model
    text contains (its name, family and stated size), e.g. "Qwen3 30B-A3B" -> qwen3-30b-a3b; None where none does."""
    m = run["model"]
    text = re.sub(r"[^a-z0-9]", "", " ".join(str(m.get(k) or "") for k in ("name", "family")).lower()
                  + (f"{m['params_b']:g}b" if m.get("params_b") else ""))
    for name in list_presets():
        if re.sub(r"[^a-z0-9]", "", name) in text:
            return load_preset(name)
    return None


HEAD_DIM_FIELDS = ("head_dim", "kv_channels", "head_size")  # HF / Megatron (--kv-channels) / NeoX spellings
NAMED_ARCHITECTURE_FIELDS = ("head_dim", "qk_norm", "qk_norm_scope", "qkv_bias", "out_bias", "layer_types",
                             "sliding_window", "attention_sinks")


def named_architecture(run: dict, off: tuple[str, ...] = ()) -> dict:
    """Rule named_model_architecture: what the run format has no field for, or a source leaves unsaid, about the
    attention of a model it names (the head width where it is not hidden / heads, as in Qwen3 and gpt-oss; q/k
    norms; attention biases; sliding-window layers; attention sinks) is that model's own: its shipped preset's
    (each preset is its HF config.json, tests/unit/test_models_presets.py), where the preset has the run's stated
    depth, width and heads (a different shape is another model of the name). {} otherwise or with the rule off; a
    stated head width still wins (model_spec)."""
    m = run["model"]
    preset = None if "named_model_architecture" in off else named_preset(run)
    if preset is None or (preset.num_layers, preset.hidden_size, preset.num_attention_heads) != (
            m.get("num_layers"), m.get("hidden"), m.get("num_heads")):
        return {}
    return {k: getattr(preset, k) for k in NAMED_ARCHITECTURE_FIELDS if getattr(preset, k) != ModelSpec.model_fields[k].default}


def seq_len_of(run: dict) -> int | None:
    """The stated sequence length, else the named model's default (named_preset: its seq_len is the model's
    pre-training length), else None."""
    if run["model"].get("seq_len"):
        return int(run["model"]["seq_len"])
    preset = named_preset(run)
    return int(preset.seq_len) if preset is not None else None


def global_batch(run: dict) -> int:
    train = run["training"]
    if train.get("global_batch_seqs"):
        return int(train["global_batch_seqs"])
    tokens, dp = train.get("global_batch_tokens"), run["parallel"].get("dp") or 1
    if isinstance(tokens, str):  # e.g. "2M tokens", a rounded figure: binary millions, to a multiple of dp
        tokens = float(re.findall(r"[\d.]+", tokens)[0]) * 2**20
        return max(dp, round(tokens / seq_len_of(run) / dp) * dp)
    return max(1, round(tokens / seq_len_of(run)))
