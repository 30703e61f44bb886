"""The model half of a Megatron-LM export: every architecture flag the plan's model needs, or a refusal naming
what Megatron-Core cannot build (so the job never trains a different model than the plan's, silently).

Flag names are those of Megatron-LM core_v0.16.1 and core_v0.19.0: megatron/training/arguments.py
(`_add_network_size_args`: --rotary-base (int), --rotary-percent, --window-size, --window-attn-skip-freq;
`_add_moe_args`: --num-experts, --moe-layer-freq, MLA sizes) and the TransformerConfig fields that
arguments.py turns into flags through ArgumentGroupFactory (megatron/core/transformer/transformer_config.py:
layernorm_epsilon -> --norm-epsilon, softmax_type -> --softmax-type, qk_layernorm, add_qkv_bias,
moe_router_score_function, moe_router_topk_scaling_factor, moe_router_num_groups, moe_router_group_topk,
moe_router_pre_softmax, moe_router_enable_expert_bias, moe_shared_expert_intermediate_size, moe_shared_expert_gate).

Refused before any flag is written, by the megatron-core profile's `unsupported_models` (planner/data/frameworks/megatron-core.yaml,
each with its source; planner.frameworks.model_refusal, also at plan and estimate time): parallel attention/MLP residuals (GPT-NeoX, Falcon, Cohere);
chunked attention (Llama-4 attention_chunk_size: no TransformerConfig field); bias-free LayerNorm (DBRX, Cohere:
TENorm/FusedLayerNorm always carry a bias); an LM-head bias (PhiMoE: the output layer has none); a learned per-expert
score bias with softmax scores (ERNIE-4.5: moe_router_enable_expert_bias is a buffer and needs sigmoid, ValueError
in TransformerConfig.__post_init__); sigmoid scores without renormalised top-k for top_k > 1 (the sigmoid router
always renormalises, moe_utils.topk_routing_with_score_function); biases on some linears but not all
(add_bias_linear is one switch: qkv, proj, fc1, fc2, experts and the router, moe/router.py); Gemma's four norms per
layer; q/k norms over whole projections (OLMo2/OLMoE; qk_layernorm is per head); a GeLU-gated FFN (no --geglu).
Each of these changes the parameter count, which the acceptance judge compares (planner.export.judges).
Warned, not refused (same shapes): an activation with no flag (ReLU: set activation_func in the model provider).
"""

from __future__ import annotations

from planner.export import rope_scaling
from planner.schemas.model import ModelSpec


def _all_biased(spec: ModelSpec) -> bool:
    """Every linear Megatron biases under add_bias_linear has a bias in the model (gpt-oss: all MoE layers)."""
    if spec.linear_bias:
        return True
    dense_layers = spec.num_layers - spec.num_moe_layers
    mlp_ok = spec.mlp_bias or dense_layers == 0
    moe_ok = spec.moe is None or (spec.moe.expert_bias and spec.moe.router_bias and not spec.moe.shared_ffn_hidden_size)
    return spec.qkv_bias and spec.out_bias and mlp_ok and moe_ok


def _attention_args(spec: ModelSpec) -> list[str]:
    args: list[str] = []
    if spec.head_dim is not None:
        args += ["--kv-channels", str(spec.head_dim)]
    if spec.kv_heads != spec.num_attention_heads and spec.mla is None:
        args += ["--group-query-attention", "--num-query-groups", str(spec.kv_heads)]
    if spec.qkv_bias and not spec.linear_bias and not _all_biased(spec):
        args.append("--add-qkv-bias")
    if spec.qk_norm or spec.mla is not None:
        # MLA: --qk-layernorm builds the latent RMSNorms DeepSeek has (q_a_layernorm, kv_a_layernorm): the MLA branch of
        # gpt_layer_specs.py puts q_layernorm/kv_layernorm behind qk_layernorm
        args.append("--qk-layernorm")
    if spec.attention_sinks:  # gpt-oss: a learned per-head offset in the softmax denominator
        args += ["--softmax-type", "learnable"]
    if "sliding" in (spec.layer_types or ()):
        # TE window_size (left, right) attends to keys [i - left, i + right]: HF's window of w keys is (w - 1, 0);
        # --window-attn-skip-freq lists 1 for a sliding layer, 0 for a full one (transformer_config.py)
        pattern = ",".join("1" if kind == "sliding" else "0" for kind in spec.layer_types)
        args += ["--window-size", f"{spec.sliding_window - 1},0", "--window-attn-skip-freq", f"[{pattern}]"]
    return args


def _position_args(spec: ModelSpec, warnings: list[str]) -> list[str]:
    kinds = {"rope": "rope", "learned": "learned_absolute", "none": "none"}  # no ALiBi: refused
    args = ["--position-embedding-type", kinds[spec.position]]
    if spec.position == "rope" and spec.rope_theta is not None:
        theta = round(spec.rope_theta)
        if theta != spec.rope_theta:
            warnings.append(f"rope_theta={spec.rope_theta} rounded to --rotary-base {theta} (an int in arguments.py)")
        args += ["--rotary-base", str(theta)]
    if spec.position == "rope" and spec.rotary_percent is not None:
        args += ["--rotary-percent", repr(spec.rotary_percent)]
    if spec.position == "rope" and spec.nope_layers:  # 1 = no RoPE on that layer (arguments.py no_rope_freq_type)
        skipped = set(spec.nope_layers)
        args += ["--no-rope-freq", "[" + ",".join("1" if i in skipped else "0" for i in range(spec.num_layers)) + "]"]
    return args + rope_scaling.megatron_args(spec, warnings)


def _moe_args(spec: ModelSpec, dispatcher: str | None = None) -> list[str]:
    """MoE flags; `dispatcher`: the one the plan's cost priced (Parallelism.moe_dispatcher; alltoall when the plan
    has none, ep 1): flex runs the DeepEP backend (transformer_config.py moe_flex_dispatcher_backend 'deepep')."""
    moe = spec.moe
    if moe is None:
        return []
    pattern = [1 if spec.is_moe_layer(i) else 0 for i in range(spec.num_layers)]
    args = ["--num-experts", str(moe.num_experts), "--moe-router-topk", str(moe.top_k),
            "--moe-ffn-hidden-size", str(moe.expert_ffn_hidden_size), "--moe-grouped-gemm",
            "--moe-token-dispatcher-type", dispatcher or "alltoall"]
    if dispatcher == "flex":
        args += ["--moe-flex-dispatcher-backend", "deepep"]
    if any(value == 0 for value in pattern):
        args += ["--moe-layer-freq", "[" + ",".join(map(str, pattern)) + "]"]
    if moe.shared_ffn_hidden_size:
        args += ["--moe-shared-expert-intermediate-size", str(moe.shared_ffn_hidden_size)]
    if moe.shared_expert_gate:
        args.append("--moe-shared-expert-gate")
    if moe.capacity_factor is not None:
        args += ["--moe-expert-capacity-factor", str(moe.capacity_factor)]
    if moe.score_function == "sigmoid":
        args += ["--moe-router-score-function", "sigmoid"]
    elif not moe.normalize_topk:  # softmax over all experts, then top-k (Qwen2-MoE, OLMoE, DeepSeek-V2)
        args.append("--moe-router-pre-softmax")
    if moe.topk_scaling_factor is not None:
        args += ["--moe-router-topk-scaling-factor", repr(moe.topk_scaling_factor)]
    if moe.num_groups is not None:
        args += ["--moe-router-num-groups", str(moe.num_groups), "--moe-router-group-topk", str(moe.group_topk)]
    if moe.expert_score_bias == "buffer":
        args.append("--moe-router-enable-expert-bias")
    return args


def _mla_args(spec: ModelSpec) -> list[str]:
    mla = spec.mla
    if mla is None:
        return []
    args = ["--multi-latent-attention", "--kv-lora-rank", str(mla.kv_lora_rank), "--qk-head-dim", str(mla.qk_nope_head_dim),
            "--qk-pos-emb-head-dim", str(mla.qk_rope_head_dim), "--v-head-dim", str(mla.v_head_dim)]
    if mla.q_lora_rank is not None:
        args += ["--q-lora-rank", str(mla.q_lora_rank)]
    return args


def model_arguments(spec: ModelSpec, seq_len: int, warnings: list[str], moe_dispatcher: str | None = None) -> list[str]:
    """The model flags of `pretrain_gpt.py` for `spec` (what Megatron-Core cannot build was refused before, by the
    profile's unsupported_models: planner.frameworks.model_refusal); `moe_dispatcher`: the plan's (_moe_args)."""
    args = ["--num-layers", str(spec.num_layers), "--hidden-size", str(spec.hidden_size),
            "--ffn-hidden-size", str(spec.ffn_hidden_size), "--num-attention-heads", str(spec.num_attention_heads),
            "--seq-length", str(seq_len), "--max-position-embeddings", str(max(seq_len, spec.position_rows)),
            "--vocab-size", str(spec.vocab_size)]
    args += _attention_args(spec)
    if spec.activation == "swiglu":
        args.append("--swiglu")
    elif spec.activation != "gelu":
        warnings.append(f"activation {spec.activation!r} has no Megatron flag: set it in your model provider")
    if spec.norm == "rmsnorm":
        args += ["--normalization", "RMSNorm"]
    if spec.norm_eps is not None:
        args += ["--norm-epsilon", repr(spec.norm_eps)]
    args += _position_args(spec, warnings)
    if not spec.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if not _all_biased(spec):
        args.append("--disable-bias-linear")
    if spec.mtp_num_layers:  # MTP modules on the last pipeline stage (megatron/core/transformer/multi_token_prediction.py)
        args += ["--mtp-num-layers", str(spec.mtp_num_layers)]
    return args + _moe_args(spec, moe_dispatcher) + _mla_args(spec)
