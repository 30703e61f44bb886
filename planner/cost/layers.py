"""Per-layer cost arrays of one candidate: the analytic terms (compute, memory-bound operators, exposed TP, EP and
CP communication, memory) for every module of the executor model: tok_embeddings, layers.0..n-1, output.

A decoder layer's cost depends only on its type (dense or MoE), so each type is costed once and broadcast.
Measured profiles replace the compute times of the layer types they cover (see `apply_profile`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from planner.cost import autocast, comm, compute, context_parallel, eager, memory, moe_comm, sac
from planner.cost import executor as executor_cost
from planner.cost.calibration import DeviceCalibration
from planner.cost.compression import FP8_DISPATCH_BYTES
from planner.cost.compute import Shape
from planner.models import counting
from planner.schemas.model import ModelSpec
from planner.schemas.topology import DeviceSpec
from planner.topology.groups import GroupLink


@dataclass(frozen=True, kw_only=True)
class Links:
    """The link each parallel axis's process groups see (planner.topology.placement.axis_link)."""

    tp: GroupLink
    cp: GroupLink
    ep: GroupLink
    dp: GroupLink  # gradient reduction of dense parameters: the dp x cp ranks
    expert_dp: GroupLink  # gradient reduction of routed experts: dp x cp / ep ranks
    pp: GroupLink
    dp_replicate: GroupLink | None = None  # HSDP: the all-reduce of the gradient shard across replicas (dp, expert_dp
    # are then the shard groups); None without HSDP


@dataclass(frozen=True, kw_only=True)
class Env:
    """Everything a layer's cost depends on besides its type."""

    spec: ModelSpec
    device: DeviceSpec
    cal: DeviceCalibration
    precision: str
    shape: Shape
    links: Links
    tp_overlap: str
    stack_tp_overlap: bool = False  # the stack overlaps TP collectives with GEMMs (behaviour.overlap.tp_comm)
    moe_overlap: bool = False  # the stack overlaps MoE all-to-all with compute (behaviour.overlap.moe_all_to_all)
    selective_mode: str = "attention_core"  # what the stack's selective recompute reruns (behaviour.memory)
    moe_hierarchical: bool = False  # MoE dispatch sends a token once per destination node (behaviour.overlap)
    executor: executor_cost.Dtypes | None = None  # the planner's executor, priced from its code (planner.cost.executor)
    moe_loop: bool = False  # routed experts as a per-expert Python loop (behaviour.executor.moe_expert_impl)
    moe_dispatch_fp8: bool = False  # dispatch-direction all-to-alls in fp8 (compression fp8-dispatch)
    moe_allgather: bool = False  # the stack's all-gather dispatcher is among its choices (moe_comm)
    moe_shared_overlap: bool = False  # shared experts compute during the dispatch (moe_comm)
    cp_flavours: tuple[str, ...] = ("p2p",)  # the stack's context-parallel flavours (context_parallel)


@dataclass(frozen=True, kw_only=True)
class ModuleCost:
    """One module, one micro-batch, this GPU. Times in seconds, bytes of activations."""

    compute_fwd_s: float
    compute_bwd_s: float
    tp_fwd_s: float = 0.0
    tp_bwd_s: float = 0.0
    ep_fwd_s: float = 0.0
    ep_bwd_s: float = 0.0
    cp_fwd_s: float = 0.0
    cp_bwd_s: float = 0.0
    selective_s: float = 0.0  # attention core forward again (selective recompute)
    act_none: float = 0.0
    act_selective: float = 0.0
    act_full: float = 0.0
    act_transient: float = 0.0  # gradients in flight during this module's backward (memory.backward_transient_bytes)
    recompute_compute_s: float | None = None  # compute a full recompute adds, when it is not one more forward
    moe_dispatcher: str | None = None  # the token dispatcher an MoE layer is priced with (moe_comm.choose)
    cp_flavour: str | None = None  # the context-parallel flavour a decoder layer is priced with (cp_choice)

    @property
    def full_recompute_s(self) -> float:
        """A second forward, communication included (Megatron's full recompute reruns the TP collectives); the
        eager recipe's recompute is costed inside its host-bound backward (planner.cost.eager)."""
        compute_s = self.compute_fwd_s if self.recompute_compute_s is None else self.recompute_compute_s
        return compute_s + self.tp_fwd_s + self.ep_fwd_s + self.cp_fwd_s


def gemm_times(env: Env, gemms: list[compute.Gemm]) -> tuple[float, float, float]:
    """(forward, backward, attention-core forward) seconds of a list of matmuls."""
    peak = compute.gemm_peak_tflops(env.device, env.precision, env.cal)
    attn_peak = env.device.peak_bf16_tflops if env.precision == "fp8" else peak
    flash = env.shape.flash_attention
    fwd = bwd = core = 0.0
    for gemm in gemms:
        t = compute.gemm_time_s(gemm, peak_tflops=attn_peak if gemm.attention_core else peak, cal=env.cal, flash=flash)
        fwd += t
        bwd += t * (compute.FLASH_BACKWARD_FACTOR if gemm.attention_core and flash else gemm.backward_factor)
        if gemm.attention_core:
            core += t
    return fwd, bwd, core


def tp_times(env: Env, fwd_compute_s: float, bwd_compute_s: float, collectives: int,
              gemm_s: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """`collectives` all-reduces (or all-gather + reduce-scatter pairs with SP: the same bytes) of T*h bf16 in each
    direction; exposed unless Domino overlaps them (comm.domino_exposed_s) or the stack overlaps them with the
    adjacent GEMMs (`gemm_s`: forward and backward GEMM seconds of the module, attention core excluded;
    comm.chunked_overlap_exposed_s)."""
    if env.shape.tp <= 1:
        return 0.0, 0.0
    size = env.shape.tokens * env.spec.hidden_size * compute.ACT_BYTES
    one = comm.ring_all_reduce_s(size, group=env.links.tp)
    fwd, bwd = collectives * one, collectives * one
    if env.tp_overlap == "domino":
        return comm.domino_exposed_s(fwd, fwd_compute_s), comm.domino_exposed_s(bwd, bwd_compute_s)
    if env.stack_tp_overlap and env.shape.sp:
        return (comm.chunked_overlap_exposed_s(fwd, gemm_s[0], chunks=env.shape.tp),
                comm.chunked_overlap_exposed_s(bwd, gemm_s[1], chunks=env.shape.tp))
    return fwd, bwd


def cp_times(env: Env, core_fwd_s: float) -> tuple[float, float]:
    """Exposed context-parallel communication of one layer: this rank's K and V (2*b*(s/cp)*kv*d/t bf16) and Q
    (b*(s/cp)*a*d/t) moved by the fastest flavour the stack runs (planner.cost.context_parallel: ring p2p beside
    the blockwise attention, all-gather of K/V, all-to-all by heads)."""
    return cp_choice(env, core_fwd_s)[1:]


def cp_choice(env: Env, core_fwd_s: float) -> tuple[str | None, float, float]:
    """(flavour by the profile's spelling, exposed forward s, exposed backward s) of cp_times
    (context_parallel.choose); (None, 0, 0) for cp 1."""
    shape, spec = env.shape, env.spec
    if shape.cp <= 1:
        return None, 0.0, 0.0
    kv_bytes = 2 * shape.tokens * spec.kv_heads * spec.dim_per_head * compute.ACT_BYTES / shape.tp
    q_bytes = shape.tokens * spec.num_attention_heads * spec.dim_per_head * compute.ACT_BYTES / shape.tp
    core_bwd = core_fwd_s * (compute.FLASH_BACKWARD_FACTOR if shape.flash_attention else 2.0)
    return context_parallel.choose(env.cp_flavours, q_bytes=q_bytes, kv_bytes=kv_bytes, cp=shape.cp,
                                   heads=spec.num_attention_heads, kv_heads=spec.kv_heads, group=env.links.cp,
                                   core_fwd_s=core_fwd_s, core_bwd_s=core_bwd)


def _norm_up_selective(env: Env, gemms: list[compute.Gemm], base_bytes: float) -> tuple[float, float]:
    """(recompute seconds, saved bytes) of a selective recompute of the norms and the MLA up-projections (DeepSeek-V3
    report Sec. 3.3.3; Megatron-Core --recompute-modules layernorm mla_up_proj): the norms' saved inputs and the
    up-projected Q, K, V are dropped for the compressed latents (q_lora + kv_lora + rope per token), and the
    backward reruns both norms (memory-bound) and the up-projection GEMMs."""
    spec, shape = env.spec, env.shape
    b, s, t, h = shape.microbatch_size, shape.seq_len / shape.cp, shape.tp, spec.hidden_size
    k = shape.kernels
    saved_norm = k.saved_rmsnorm if spec.norm == "rmsnorm" else k.saved_layernorm
    dropped = 2 * saved_norm * s * b * h / shape.sp_div
    rerun = compute.memory_bound_time_s(2 * compute.norm_bytes(spec, k) * shape.tokens * h / shape.sp_div,
                                        device=env.device, cal=env.cal)
    if spec.mla is not None:
        mla, a, kv = spec.mla, spec.num_attention_heads, spec.kv_heads
        qk_d = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        dropped += 2 * s * b * (a * qk_d + kv * qk_d + kv * mla.v_head_dim) / t
        dropped -= 2 * s * b * ((mla.q_lora_rank or 0) + mla.kv_lora_rank + mla.qk_rope_head_dim)
        up = [g for g in gemms if g.name in ("q_up", "kv_up")]
        rerun += gemm_times(env, up)[0]
    return rerun, max(base_bytes - dropped, 0.0)


def ep_times(env: Env) -> tuple[float, float]:
    """Two collectives each way per MoE layer (dispatch and combine; Lepikhin et al. 2021, GShard Sec. 2.2), the
    fastest dispatcher the stack runs for the slowest EP rank's load (moe_comm.dispatch_s). With fp8 dispatch one of
    the two each way moves fp8 values and their scales (planner.cost.compression.FP8_DISPATCH_BYTES per element:
    DeepSeek-V3 Sec. 3.3.2)."""
    return min(ep_options(env).values(), key=sum, default=(0.0, 0.0))


def ep_options(env: Env) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of a layer's dispatch + combine by each dispatcher the stack runs (ep_times)."""
    cfg = env.spec.moe
    if env.shape.ep <= 1 or cfg is None:
        return {}
    kwargs = dict(group=env.links.ep, hierarchical=env.moe_hierarchical, allgather=env.moe_allgather)
    bf16 = moe_comm.dispatch_options(env.shape.tokens, cfg, env.spec.hidden_size, **kwargs)
    dispatch = (moe_comm.dispatch_options(env.shape.tokens, cfg, env.spec.hidden_size, value_bytes=FP8_DISPATCH_BYTES,
                                          **kwargs) if env.moe_dispatch_fp8 else bf16)
    return {name: (bf16[name] + dispatch[name],) * 2 for name in bf16}


def _layer_params_per_gpu(spec: ModelSpec, shape: Shape, moe_layer: bool) -> float:
    """Parameters of one decoder layer of the type held by one GPU (matrices split by tp, routed experts by ep too)."""
    base = counting.layer_norm_params(spec) + counting.attention_params(spec) / shape.tp
    if not moe_layer:
        return base + counting.mlp_params(spec, spec.ffn_hidden_size) / shape.tp
    moe = counting.moe_params(spec)
    return base + moe.router + moe.shared / shape.tp + moe.num_experts * moe.per_expert / (shape.ep * shape.tp)


def autocast_cast_s(env: Env, params: float) -> tuple[float, float]:
    """Weight casts torch.autocast adds per micro-batch (memory.AUTOCAST_CAST_BYTES), as HBM streaming time."""
    precision = "amp-bf16" if env.executor is not None and env.executor.autocast else env.precision
    fwd_bytes, bwd_bytes = memory.AUTOCAST_CAST_BYTES.get(precision, (0.0, 0.0))
    return (compute.memory_bound_time_s(params * fwd_bytes, device=env.device, cal=env.cal),
            compute.memory_bound_time_s(params * bwd_bytes, device=env.device, cal=env.cal))


def _is_eager(env: Env) -> bool:
    return env.precision == eager.RECIPE and not env.shape.fused_kernels


def _eager_device_s(env: Env, ops: eager.OpCount, gemm_fwd_s: float, gemm_bwd_s: float, params: float) -> tuple[float, float]:
    """(forward, backward) device seconds of an eager module: GEMMs, counted memory-bound bytes, weight casts."""
    cast_fwd, cast_bwd = autocast_cast_s(env, params)
    return (gemm_fwd_s + compute.memory_bound_time_s(ops.fwd_bytes, device=env.device, cal=env.cal) + cast_fwd,
            gemm_bwd_s + compute.memory_bound_time_s(ops.bwd_bytes, device=env.device, cal=env.cal) + cast_bwd)


def _eager_compute_s(env: Env, params: float) -> tuple[float, float, float, float]:
    """(forward, backward, recompute extra, attention core forward) compute seconds of an eager dense decoder
    layer: GEMMs as HF issues them (separate q, k, v and MLP input projections), each phase max(device, host)
    (planner.cost.eager). A checkpointed layer reruns its forward inside the backward, less the last linear's
    GEMM and the closing residual add (torch.utils.checkpoint's early stop)."""
    spec, shape, cal = env.spec, env.shape, env.cal
    calls = {"qkv": 3, "mlp": 3 if spec.gated else 2}
    gemms = [dataclasses.replace(g, calls=calls.get(g.name, g.calls))
             for g in compute.attention_gemms(spec, shape) + compute.mlp_gemms(spec, shape, moe=None)]
    g_fwd, g_bwd, core = gemm_times(env, gemms)
    mlp_flops = next(g.flops for g in gemms if g.name == "mlp")
    last = compute.Gemm("down", mlp_flops / (3 if spec.gated else 2))
    last_s = compute.gemm_time_s(last, peak_tflops=compute.gemm_peak_tflops(env.device, env.precision, cal), cal=cal, flash=False)
    ops = eager.decoder_ops(spec, shape)
    dev_f, dev_b = _eager_device_s(env, ops, g_fwd, g_bwd, params)
    skipped_bytes = ops.fwd_bytes - eager.recompute_bytes(spec, shape, ops)
    dev_r = dev_f - last_s - compute.memory_bound_time_s(skipped_bytes, device=env.device, cal=cal)
    rec_ops = ops.fwd_ops - eager.RECOMPUTE_SKIPPED_OPS
    rates = {"kernel_s": cal.eager_kernel_s, "host_op_s": cal.eager_host_op_s}
    bwd = eager.phase_s(dev_b, ops.bwd_ops, **rates)
    rec = eager.phase_s(dev_b + dev_r, ops.bwd_ops + rec_ops, **rates) - bwd
    return eager.phase_s(dev_f, ops.fwd_ops, **rates), bwd, rec, core


def decoder_cost(env: Env, *, moe_layer: bool) -> ModuleCost:
    """Costs of one decoder layer (dense or MoE) for one micro-batch on one GPU."""
    spec, shape = env.spec, env.shape
    if env.executor is not None and env.executor.compute == 2 and spec.mla is None and shape.flash_attention:
        return _executor_decoder_cost(env, moe_layer=moe_layer)
    if _is_eager(env) and eager.supported(spec, shape, moe_layer=moe_layer):
        return _eager_decoder_cost(env)
    moe = counting.moe_params(spec) if moe_layer else None
    gemms = compute.attention_gemms(spec, shape) + compute.mlp_gemms(spec, shape, moe=moe)
    g_fwd, g_bwd, core = gemm_times(env, gemms)
    core_bytes, rest_bytes = compute.layer_elementwise_bytes(spec, shape, moe=moe)
    core_mem = compute.memory_bound_time_s(core_bytes, device=env.device, cal=env.cal)
    rest_mem = compute.memory_bound_time_s(rest_bytes, device=env.device, cal=env.cal)
    cast_fwd, cast_bwd = autocast_cast_s(env, _layer_params_per_gpu(spec, shape, moe_layer))
    fwd = g_fwd + core_mem + rest_mem + cast_fwd
    bwd = g_bwd + 2 * (core_mem + rest_mem) + cast_bwd
    core_bwd = core * (compute.FLASH_BACKWARD_FACTOR if shape.flash_attention else 2.0)
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=2, gemm_s=(g_fwd - core, g_bwd - core_bwd))
    dispatcher, ep_fwd, ep_bwd = None, 0.0, 0.0
    if moe_layer:  # the dispatcher least exposed under the stack's overlap (moe_comm.choose)
        shared_fwd, shared_bwd, _ = gemm_times(env, [g for g in gemms if g.name == "shared_experts"])
        dispatcher, ep_fwd, ep_bwd = moe_comm.choose(ep_options(env), layer_s=(fwd, bwd), shared_s=(shared_fwd, shared_bwd),
                                                     batch_overlap=env.moe_overlap, shared_overlap=env.moe_shared_overlap)
    cp_fwd, cp_bwd = cp_times(env, core)
    if env.executor is not None:
        acts = executor_cost.decoder_activation_bytes(spec, shape, env.executor, moe_layer=moe_layer, moe_loop=env.moe_loop)
    elif env.precision == autocast.RECIPE and not moe_layer:
        acts = autocast.decoder_activation_bytes(spec, shape)
    else:
        acts = memory.decoder_activation_bytes(spec, shape, moe_layer=moe_layer)
    selective, act_selective = (0.0 if shape.flash_attention else core + core_mem), acts.selective
    if env.selective_mode == "half_forward":  # torchtitan: every other layer, or every other matmul and pointwise ops
        selective = (fwd + tp_fwd + ep_fwd + cp_fwd) / 2
        act_selective = (acts.none + acts.full) / 2
    elif env.selective_mode == "norm_and_up_proj":
        selective, act_selective = _norm_up_selective(env, gemms, acts.selective)
    elif env.selective_mode == "op_sac":  # torchtitan's per-op policy as it runs (planner.cost.sac)
        per_gemm = {g.name: gemm_times(env, [g])[0] for g in gemms}
        selective = sac.recompute_s(spec, shape, moe_layer=moe_layer, gemm_fwd_s=per_gemm, elementwise_s=rest_mem,
                                    tp_fwd_s=tp_fwd, cp_fwd_s=cp_fwd)
        act_selective = min(acts.none, sac.saved_bytes(spec, shape, moe_layer=moe_layer))
    return ModuleCost(
        compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, ep_fwd_s=ep_fwd, ep_bwd_s=ep_bwd,
        cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd, selective_s=selective,
        act_none=acts.none, act_selective=act_selective, act_full=acts.full, act_transient=acts.transient,
        moe_dispatcher=dispatcher, cp_flavour=cp_choice(env, core)[0],
    )


def _eager_decoder_cost(env: Env) -> ModuleCost:
    """decoder_cost for the eager recipe (planner.cost.eager); activations as torch.autocast saves them."""
    fwd, bwd, rec, core = _eager_compute_s(env, _layer_params_per_gpu(env.spec, env.shape, False))
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=2)
    cp_fwd, cp_bwd = cp_times(env, core)
    acts = autocast.decoder_activation_bytes(env.spec, env.shape)
    if env.executor is not None:
        acts = executor_cost.decoder_activation_bytes(env.spec, env.shape, env.executor, moe_layer=False, moe_loop=False)
    return ModuleCost(compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, cp_fwd_s=cp_fwd,
                      cp_bwd_s=cp_bwd, act_none=acts.none, act_selective=acts.selective, act_full=acts.full,
                      act_transient=acts.transient, recompute_compute_s=rec)


def _executor_decoder_cost(env: Env, *, moe_layer: bool) -> ModuleCost:
    """decoder_cost for the planner's executor under autocast, from its code (planner.cost.executor): its GEMMs as it
    issues them (separate q, k, v and MLP input projections; MoE experts one GEMM per expert and matrix when
    moe_expert_impl is loop), its operators and bytes, each phase max(device, host) (planner.cost.eager); an MoE
    block's forward drains the queue at its host syncs (executor.MOE_HOST_SYNCS), so its segments add."""
    spec, shape, recipe = env.spec, env.shape, env.executor
    moe = counting.moe_params(spec) if moe_layer else None
    weights = 3 if spec.gated else 2
    calls = {"qkv": 3, "mlp": weights, "experts": weights * max(1, spec.moe.num_experts // shape.ep) if moe_layer else 1}
    if moe_layer and not env.moe_loop:
        calls["experts"] = 2 * max(1, spec.moe.num_experts // shape.ep)
    gemms = [dataclasses.replace(g, calls=calls.get(g.name, g.calls))
             for g in compute.attention_gemms(spec, shape) + compute.mlp_gemms(spec, shape, moe=moe)]
    g_fwd, g_bwd, core = gemm_times(env, gemms)
    attn = executor_cost.attention_ops(spec, shape, recipe)
    ffn = executor_cost.mlp_ops(spec, shape, recipe)
    if moe_layer:
        ffn = executor_cost.moe_block_ops(spec, shape, recipe)
        if env.moe_loop:
            ffn = ffn + executor_cost.moe_expert_loop_ops(spec, shape, recipe)
        else:
            ffn = ffn + executor_cost.moe_grouped_layout_ops(spec, shape, recipe)
    ops = attn + ffn
    dev_f, dev_b = _eager_device_s(env, ops, g_fwd, g_bwd, _layer_params_per_gpu(spec, shape, moe_layer))
    rates = {"kernel_s": env.cal.eager_kernel_s, "host_op_s": env.cal.eager_host_op_s}
    fwd = eager.phase_s(dev_f, ops.fwd_ops, **rates)
    if moe_layer:  # segments separated by host syncs do not overlap (both expert implementations sync)
        fwd += executor_cost.MOE_HOST_SYNCS * (rates["kernel_s"] + rates["host_op_s"])
    bwd = eager.phase_s(dev_b, ops.bwd_ops, **rates)
    rec = eager.phase_s(dev_b + dev_f, ops.bwd_ops + ops.fwd_ops, **rates) - bwd
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=2)
    ep_fwd, ep_bwd = ep_times(env) if moe_layer else (0.0, 0.0)
    cp_fwd, cp_bwd = cp_times(env, core)
    acts = executor_cost.decoder_activation_bytes(spec, shape, recipe, moe_layer=moe_layer, moe_loop=env.moe_loop)
    return ModuleCost(compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, ep_fwd_s=ep_fwd,
                      ep_bwd_s=ep_bwd, cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd, selective_s=core + rates["host_op_s"],
                      act_none=acts.none, act_selective=acts.selective, act_full=acts.full,
                      act_transient=acts.transient, recompute_compute_s=rec)


def _eager_phases(env: Env, ops: eager.OpCount, gemm_fwd_s: float, gemm_bwd_s: float, params: float) -> tuple[float, float]:
    """(forward, backward) of an eager embedding or head: max(device, host) per phase (planner.cost.eager)."""
    dev_f, dev_b = _eager_device_s(env, ops, gemm_fwd_s, gemm_bwd_s, params)
    rates = {"kernel_s": env.cal.eager_kernel_s, "host_op_s": env.cal.eager_host_op_s}
    return eager.phase_s(dev_f, ops.fwd_ops, **rates), eager.phase_s(dev_b, ops.bwd_ops, **rates)


def embedding_cost(env: Env) -> ModuleCost:
    """Token embedding: a memory-bound gather forward, a scatter-add backward (twice the bytes); with tp the
    vocabulary-parallel lookup all-reduces its output (reduce-scatter with SP) in forward only."""
    num_bytes = compute.embedding_elementwise_bytes(env.spec, env.shape)
    fwd = compute.memory_bound_time_s(num_bytes, device=env.device, cal=env.cal)
    bwd = 2 * fwd
    if env.executor is not None and env.executor.compute == 2:
        fwd, bwd = _eager_phases(env, executor_cost.embedding_ops(env.spec, env.shape, env.executor), 0.0, 0.0, 0.0)
    elif _is_eager(env):
        fwd, bwd = _eager_phases(env, eager.embedding_ops(env.spec, env.shape), 0.0, 0.0, 0.0)
    tp_fwd, _ = tp_times(env, fwd, bwd, collectives=1)
    act = memory.embedding_activation_bytes(env.spec, env.shape)
    return ModuleCost(compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, act_none=act, act_selective=act, act_full=act)


def head_cost(env: Env) -> ModuleCost:
    """Final norm, LM head and cross-entropy. TP: with SP the head all-gathers its input in forward and
    reduce-scatters the input gradient in backward; without SP only backward all-reduces the input gradient."""
    g_fwd, g_bwd, _ = gemm_times(env, compute.head_gemms(env.spec, env.shape))
    mem = compute.memory_bound_time_s(compute.head_elementwise_bytes(env.spec, env.shape), device=env.device, cal=env.cal)
    fwd, bwd = g_fwd + mem, g_bwd + 2 * mem
    lm_head = env.spec.vocab_size * env.spec.hidden_size / env.shape.tp
    if env.executor is not None and env.executor.compute == 2:
        fwd, bwd = _eager_phases(env, executor_cost.head_ops(env.spec, env.shape, env.executor), g_fwd, g_bwd, lm_head)
    elif _is_eager(env):
        fwd, bwd = _eager_phases(env, eager.head_ops(env.spec, env.shape), g_fwd, g_bwd, lm_head)
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=1)
    if not env.shape.sp:
        tp_fwd = 0.0
    if env.executor is not None:
        act = executor_cost.head_activation_bytes(env.spec, env.shape, env.executor)
    elif env.precision == autocast.RECIPE:
        act = autocast.head_activation_bytes(env.spec, env.shape)
    else:
        act = memory.head_activation_bytes(env.spec, env.shape)
    return ModuleCost(compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, act_none=act, act_selective=act, act_full=act)


def expert_shard_ep(*, ep: int, dp: int, cp: int) -> int:
    """The ep by which routed experts are split, with expert TP = tp: ep itself when it divides dp*cp; under MoE
    parallel folding (ep = dp*cp*k, the expert mesh ep x etp with etp = tp/k over the same ranks, Megatron-Core
    parallel_state.py) each GPU holds E/ep experts at 1/etp width = E/(dp*cp*tp) of the experts, i.e. dp*cp."""
    return math.gcd(ep, dp * cp)


def module_params(spec: ModelSpec, *, tp: int, ep: int, tied_copy: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per module (embedding, decoder layers, head): (dense, expert) parameters held by one GPU.

    Matrices are split by tp; norms, the router and MLA's down-projections are replicated (counted whole);
    routed experts are split by ep and tp. With tied embeddings and pp > 1 the last stage keeps its own copy of
    the embedding matrix for the LM head (Megatron-LM), `tied_copy`.
    """
    n = spec.num_layers
    dense, expert = np.zeros(n + 2), np.zeros(n + 2)
    dense[0] = counting.embedding_params(spec) / tp
    norm, layer_norms = counting.norm_params(spec), counting.layer_norm_params(spec)
    mixer = {kind: counting.mixer_params(spec, kind) / tp for kind in spec.mixers}  # attention, GDN, Mamba
    head = counting.head_params(spec) - norm
    if spec.tied_embeddings and tied_copy:
        head = spec.vocab_size * spec.hidden_size
    dense[n + 1] = norm + head / tp
    moe = counting.moe_params(spec) if spec.moe is not None else None
    for index in range(n):
        attn = mixer[spec.mixer(index)]
        if moe is not None and spec.is_moe_layer(index):
            dense[index + 1] = layer_norms + attn + moe.router + moe.shared / tp
            expert[index + 1] = moe.num_experts * moe.per_expert / (ep * tp)
        else:
            dense[index + 1] = layer_norms + attn + counting.mlp_params(spec, spec.ffn_hidden_size) / tp
    return dense, expert
