"""Decoder, embedding and head costs where the host, not the GPU, can set the pace: the eager recipe (HuggingFace
modeling code under torch.autocast, planner.cost.eager) and the planner's own executor priced from its code
(planner.cost.executor): each phase max(device, host).
"""

from __future__ import annotations

import dataclasses

from planner.cost import autocast, compute, eager
from planner.cost import executor as executor_cost
from planner.cost.layer_terms import (Env, ModuleCost, autocast_cast_s, cp_times, ep_times, gemm_times,
                                      layer_params_per_gpu, tp_times)
from planner.models import counting


def is_eager(env: Env) -> bool:
    return env.precision == eager.RECIPE and not env.shape.fused_kernels

def eager_device_s(env: Env, ops: eager.OpCount, gemm_fwd_s: float, gemm_bwd_s: float, params: float) -> tuple[float, float]:
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
    dev_f, dev_b = eager_device_s(env, ops, g_fwd, g_bwd, params)
    skipped_bytes = ops.fwd_bytes - eager.recompute_bytes(spec, shape, ops)
    dev_r = dev_f - last_s - compute.memory_bound_time_s(skipped_bytes, device=env.device, cal=cal)
    rec_ops = ops.fwd_ops - eager.RECOMPUTE_SKIPPED_OPS
    rates = {"kernel_s": cal.eager_kernel_s, "host_op_s": cal.eager_host_op_s}
    bwd = eager.phase_s(dev_b, ops.bwd_ops, **rates)
    rec = eager.phase_s(dev_b + dev_r, ops.bwd_ops + rec_ops, **rates) - bwd
    return eager.phase_s(dev_f, ops.fwd_ops, **rates), bwd, rec, core

def eager_decoder_cost(env: Env) -> ModuleCost:
    """decoder_cost for the eager recipe (planner.cost.eager); activations as torch.autocast saves them."""
    fwd, bwd, rec, core = _eager_compute_s(env, layer_params_per_gpu(env.spec, env.shape, False))
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=2)
    cp_fwd, cp_bwd = cp_times(env, core)
    acts = autocast.decoder_activation_bytes(env.spec, env.shape)
    if env.executor is not None:
        acts = executor_cost.decoder_activation_bytes(env.spec, env.shape, env.executor, moe_layer=False, moe_loop=False)
    return ModuleCost(compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, cp_fwd_s=cp_fwd,
                      cp_bwd_s=cp_bwd, act_none=acts.none, act_selective=acts.selective, act_full=acts.full,
                      act_transient=acts.transient, recompute_compute_s=rec)

def executor_decoder_cost(env: Env, *, moe_layer: bool) -> ModuleCost:
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
    dev_f, dev_b = eager_device_s(env, ops, g_fwd, g_bwd, layer_params_per_gpu(spec, shape, moe_layer))
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

def eager_phases(env: Env, ops: eager.OpCount, gemm_fwd_s: float, gemm_bwd_s: float, params: float) -> tuple[float, float]:
    """(forward, backward) of an eager embedding or head: max(device, host) per phase (planner.cost.eager)."""
    dev_f, dev_b = eager_device_s(env, ops, gemm_fwd_s, gemm_bwd_s, params)
    rates = {"kernel_s": env.cal.eager_kernel_s, "host_op_s": env.cal.eager_host_op_s}
    return eager.phase_s(dev_f, ops.fwd_ops, **rates), eager.phase_s(dev_b, ops.bwd_ops, **rates)
