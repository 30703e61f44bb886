"""Selective recompute by module, as Megatron-Core runs it (--recompute-granularity selective --recompute-modules):
what each named module's checkpoint drops from one decoder layer's saved activations and what its rerun costs in
the backward, one micro-batch on one GPU.

Megatron-Core (megatron/core/transformer/transformer_config.py, `recompute_modules`, default ["core_attn"]):
"moe_act", "layernorm" and "mla_up_proj" use output-discarding checkpointing (CheckpointWithoutOutput: the module's
output is freed after its consumer saved what it needs and is rebuilt in the backward), "core_attn", "mlp", "moe"
and "shared_experts" normal checkpointing (the module keeps only its input and reruns its forward). Per module:

- core_attn (attention.py `checkpoint_core_attention`): the attention core's saved scores (unfused softmax) or
  log-sum-exp (fused kernels) are dropped; the core's forward, with its context-parallel exchange, reruns. A fused
  kernel reruns too: Megatron warns the saving is small, not that the rerun is free.
- layernorm (transformer_layer.py `recompute_input_layernorm`, `recompute_pre_mlp_layernorm`): the two norms'
  outputs, which the QKV (or MLA down-projection) and FFN GEMMs save as inputs, are dropped; both norms rerun.
- mla_up_proj (multi_latent_attention.py): the up-projected Q, K, V are dropped for the compressed latents the
  up-projections take in; the up-projection GEMMs (and RoPE, memory-bound, not priced) rerun.
- mlp (transformer_layer.py `recompute_mlp`, dense layers only): the MLP's intermediates are dropped; fc1, the
  activation and fc2 rerun with the MLP's TP collectives.
- moe (moe_layer.py `moe_layer_recompute`): everything inside the MoE layer (router logits, expert input rows,
  routed and shared intermediates) is dropped; router, permutations, dispatch and combine, experts and shared
  experts rerun with their EP and TP communication.
- moe_act (moe/experts.py `activation_recompute`): the routed experts' activation output (fc2's input) is dropped
  and the activation reruns.
- shared_experts (moe/shared_experts.py): the shared experts' intermediates are dropped; they rerun.

Under the fp8 recipe a normally checkpointed module keeps its 16-bit input where its first GEMM kept an fp8 cast
(the checkpoint saves the tensor it was called with): 1 byte per element more.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import get_args

from planner.cost import compute, kernel_bytes, memory
from planner.cost.layer_terms import Env, gemm_times
from planner.models import counting
from planner.schemas.plan import RecomputeModule

MODULES: tuple[str, ...] = get_args(RecomputeModule)
"""Megatron-Core's recompute_modules names the cost prices (transformer_config.py allowed_modules, less the
Gated DeltaNet / DeltaProduct / hyper-connection ones), as the plan schema spells them."""

MODE_MODULES = {"attention_core": ("core_attn",), "norm_and_up_proj": ("layernorm", "mla_up_proj")}
"""The stack-wide selective modes (behaviour.memory.selective_recompute) that are module sets: Megatron's default
(Korthikanti et al. 2022) and DeepSeek-V3's (report Sec. 3.3.3: RMSNorm and the MLA up-projections)."""

MOE_MODULES = ("moe", "moe_act", "shared_experts")
"""The modules inside an MoE layer: "moe" reruns the whole layer, the others a part of it."""


@dataclass(frozen=True, kw_only=True)
class LayerParts:
    """The parts of one decoder layer's cost a module's recompute reads: its GEMMs, the attention core's forward
    (GEMM and memory-bound) seconds and saved bytes, its exposed CP, EP and FFN TP forward seconds. The FFN's
    saved and memory-bound bytes follow from the layer's kind (recompute)."""

    gemms: tuple[compute.Gemm, ...]
    moe_layer: bool
    core_s: float = 0.0
    core_bytes: float = 0.0
    cp_fwd_s: float = 0.0
    ep_fwd_s: float = 0.0
    tp_ffn_s: float = 0.0  # the FFN's exposed TP collectives, forward


def modules_of(env: Env) -> tuple[str, ...] | None:
    """The modules `selective` reruns: the candidate's own set, else the stack's mode where it is a module set;
    None where the stack's selective is not a module set (torchtitan's policies)."""
    return env.selective_modules or MODE_MODULES.get(env.selective_mode)


def _mem_s(env: Env, num_bytes: float) -> float:
    return compute.memory_bound_time_s(num_bytes, device=env.device, cal=env.cal)


def _gemms_s(env: Env, parts: LayerParts, names: tuple[str, ...]) -> float:
    return gemm_times(env, [g for g in parts.gemms if g.name in names])[0]


def _kept_input(env: Env) -> float:
    """The 16-bit input a normally checkpointed FFN keeps beyond the fp8 cast its fc1 would have saved."""
    shape = env.shape
    return (1.0 if shape.fp8_inputs else 0.0) * shape.tokens * env.spec.hidden_size / shape.sp_div


def _norms(env: Env) -> tuple[float, float]:
    spec, shape = env.spec, env.shape
    g = 1 if shape.fp8_inputs else 2
    region = shape.tokens * spec.hidden_size / shape.sp_div
    return _mem_s(env, 2 * kernel_bytes.norm_bytes(spec, shape.kernels) * region), 2 * g * region


def _mla_up_proj(env: Env, parts: LayerParts) -> tuple[float, float]:
    spec, shape = env.spec, env.shape
    if spec.mla is None:
        return 0.0, 0.0
    b, s, t = shape.microbatch_size, shape.seq_len / shape.cp, shape.tp
    mla, a, kv = spec.mla, spec.num_attention_heads, spec.kv_heads
    qk_d = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    dropped = 2 * s * b * (a * qk_d + kv * qk_d + kv * mla.v_head_dim) / t
    dropped -= 2 * s * b * ((mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim)
    return _gemms_s(env, parts, ("q_up", "kv_up")), dropped


def _module(env: Env, parts: LayerParts, name: str, ffn: memory.FfnSaved, mem: dict[str, float]) -> tuple[float, float]:
    """(rerun seconds, dropped bytes) of one module's recompute in this layer; (0, 0) where it has no such module.
    `ffn`, `mem`: the FFN's saved bytes by part (memory.ffn_saved_bytes) and forward memory-bound bytes by part
    (compute.ffn_elementwise_bytes)."""
    moe = parts.moe_layer
    if name == "core_attn":
        return parts.core_s + parts.cp_fwd_s, parts.core_bytes
    if name == "layernorm":
        return _norms(env)
    if name == "mla_up_proj":
        return _mla_up_proj(env, parts)
    if name == "mlp" and not moe:
        rerun = _gemms_s(env, parts, ("mlp",)) + _mem_s(env, mem["mlp"]) + parts.tp_ffn_s
        return rerun, ffn.mlp - _kept_input(env)
    if not moe or name == "mlp":
        return 0.0, 0.0
    if name == "moe":
        rerun = (_gemms_s(env, parts, ("router", "experts", "shared_experts")) + _mem_s(env, sum(mem.values()))
                 + parts.ep_fwd_s + parts.tp_ffn_s)
        return rerun, ffn.moe - _kept_input(env)
    if name == "moe_act":
        return _mem_s(env, mem["routed"]), ffn.routed_act_out
    return _gemms_s(env, parts, ("shared_experts",)) + _mem_s(env, mem["shared"]), ffn.shared  # shared_experts


def recompute(env: Env, parts: LayerParts, modules: tuple[str, ...], *, act_none: float, act_full: float) -> tuple[float, float]:
    """(selective recompute seconds, saved bytes) of one decoder layer with `modules` recomputed: the reruns
    summed, the drops taken from the no-recompute bytes (never below what a full recompute keeps). "moe" covers
    "moe_act" and "shared_experts" (the whole layer reruns), which then add nothing."""
    chosen = [m for m in modules if not ("moe" in modules and m in MOE_MODULES[1:])]
    spec, shape = env.spec, env.shape
    ffn = memory.ffn_saved_bytes(spec, shape, moe_layer=parts.moe_layer)
    mem = compute.ffn_elementwise_bytes(spec, shape, moe=counting.moe_params(spec) if parts.moe_layer else None)
    rerun = dropped = 0.0
    for name in chosen:
        seconds, num_bytes = _module(env, parts, name, ffn, mem)
        rerun, dropped = rerun + seconds, dropped + max(num_bytes, 0.0)
    return rerun, max(act_none - dropped, act_full)
