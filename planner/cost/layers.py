"""Per-layer cost arrays of one candidate: the analytic terms (compute, memory-bound operators, exposed TP, EP and
CP communication, memory) for every module of the executor model: tok_embeddings, layers.0..n-1, output. The
terms themselves and the records (Env, Links, ModuleCost) are planner.cost.layer_terms'; the eager recipe and the
planner's executor are planner.cost.eager_layers'.

A decoder layer's cost depends only on its type (dense or MoE), so each type is costed once and broadcast.
Measured profiles replace the compute times of the layer types they cover (see `apply_profile`).
"""

from __future__ import annotations

import math

import numpy as np

from planner.cost import autocast, compute, eager, fp8_recipe, memory, moe_comm, sac, selective
from planner.cost import moe_layer as moe_layer_terms
from planner.cost import executor as executor_cost
from planner.cost.eager_layers import eager_decoder_cost, eager_phases, executor_decoder_cost, is_eager
from planner.cost.layer_terms import (Env, ModuleCost, autocast_cast_s, cp_choice, cp_times, ep_options, gemm_times,
                                      layer_params_per_gpu, tp_times)
from planner.models import counting
from planner.schemas.model import ModelSpec


def decoder_cost(env: Env, *, moe_layer: bool) -> ModuleCost:
    """Costs of one decoder layer (dense or MoE) for one micro-batch on one GPU."""
    spec, shape = env.spec, env.shape
    if env.executor is not None and env.executor.compute == 2 and spec.mla is None and shape.flash_attention:
        return executor_decoder_cost(env, moe_layer=moe_layer)
    if is_eager(env) and eager.supported(spec, shape, moe_layer=moe_layer):
        return eager_decoder_cost(env)
    moe = counting.moe_params(spec) if moe_layer else None
    gemms = compute.attention_gemms(spec, shape) + compute.mlp_gemms(spec, shape, moe=moe)
    g_fwd, g_bwd, core = gemm_times(env, gemms)
    core_bytes, rest_bytes = compute.layer_elementwise_bytes(spec, shape, moe=moe)
    core_mem = compute.memory_bound_time_s(core_bytes, device=env.device, cal=env.cal)
    rest_mem = compute.memory_bound_time_s(rest_bytes, device=env.device, cal=env.cal)
    cast_fwd, cast_bwd = autocast_cast_s(env, layer_params_per_gpu(spec, shape, moe_layer))
    if env.precision == "fp8" and env.fp8_casts:  # the fp8 recipe's activation and gradient casts (fp8_recipe.FP8_CAST_BYTES_PER_ELEMENT)
        fp8_fwd, fp8_bwd = fp8_recipe.cast_bytes(gemms)
        cast_fwd += compute.memory_bound_time_s(fp8_fwd, device=env.device, cal=env.cal)
        cast_bwd += compute.memory_bound_time_s(fp8_bwd, device=env.device, cal=env.cal)
    fwd = g_fwd + core_mem + rest_mem + cast_fwd
    bwd = g_bwd + 2 * (core_mem + rest_mem) + cast_bwd
    core_bwd = core * (compute.FLASH_BACKWARD_FACTOR if shape.flash_attention else 2.0)
    pairs = 1 + moe_layer_terms.ffn_tp_collectives(spec, shape, moe_layer=moe_layer)  # attention's pair + the FFN's
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=pairs, gemm_s=(g_fwd - core, g_bwd - core_bwd))
    dispatcher, ep_fwd, ep_bwd = None, 0.0, 0.0
    if moe_layer:  # the dispatcher least exposed under the stack's overlap (moe_comm.choose)
        shared_fwd, shared_bwd, _ = gemm_times(env, [g for g in gemms if g.name == "shared_experts"])
        dispatcher, ep_fwd, ep_bwd = moe_comm.choose(ep_options(env), layer_s=(fwd, bwd), shared_s=(shared_fwd, shared_bwd),
                                                     batch_overlap=env.moe_overlap, shared_overlap=env.moe_shared_overlap,
                                                     unhidden=moe_layer_terms.unhidden_s(env, env.moe_count_exchange))
    cp_fwd, cp_bwd = cp_times(env, core)
    if env.executor is not None:
        acts = executor_cost.decoder_activation_bytes(spec, shape, env.executor, moe_layer=moe_layer, moe_loop=env.moe_loop)
    elif env.precision == autocast.RECIPE and not moe_layer:
        acts = autocast.decoder_activation_bytes(spec, shape)
    else:
        acts = memory.decoder_activation_bytes(spec, shape, moe_layer=moe_layer)
    modules = selective.modules_of(env)
    if modules is not None:  # Megatron-Core's --recompute-modules (planner.cost.selective)
        parts = selective.LayerParts(gemms=tuple(gemms), moe_layer=moe_layer, core_s=core + core_mem,
                                     core_bytes=acts.none - acts.selective, cp_fwd_s=cp_fwd, ep_fwd_s=ep_fwd,
                                     tp_ffn_s=tp_fwd * (pairs - 1) / pairs)
        rerun, act_selective = selective.recompute(env, parts, modules, act_none=acts.none, act_full=acts.full)
    elif env.selective_mode == "half_forward":  # torchtitan: every other layer, or every other matmul and pointwise ops
        rerun = (fwd + tp_fwd + ep_fwd + cp_fwd) / 2
        act_selective = (acts.none + acts.full) / 2
    elif env.selective_mode == "op_sac":  # torchtitan's per-op policy as it runs (planner.cost.sac)
        per_gemm = {g.name: gemm_times(env, [g])[0] for g in gemms}
        rerun = sac.recompute_s(spec, shape, moe_layer=moe_layer, gemm_fwd_s=per_gemm, elementwise_s=rest_mem,
                                tp_fwd_s=tp_fwd, cp_fwd_s=cp_fwd)
        act_selective = min(acts.none, sac.saved_bytes(spec, shape, moe_layer=moe_layer))
    else:
        raise ValueError(f"selective_mode={env.selective_mode!r} is not priced")
    return ModuleCost(
        compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, ep_fwd_s=ep_fwd, ep_bwd_s=ep_bwd,
        cp_fwd_s=cp_fwd, cp_bwd_s=cp_bwd, selective_s=rerun,
        act_none=acts.none, act_selective=act_selective, act_full=acts.full, act_transient=acts.transient,
        moe_dispatcher=dispatcher, cp_flavour=cp_choice(env, core)[0],
    )


def embedding_cost(env: Env) -> ModuleCost:
    """Token embedding: a memory-bound gather forward, a scatter-add backward (twice the bytes); with tp the
    vocabulary-parallel lookup all-reduces its output (reduce-scatter with SP) in forward only."""
    num_bytes = compute.embedding_elementwise_bytes(env.spec, env.shape)
    fwd = compute.memory_bound_time_s(num_bytes, device=env.device, cal=env.cal)
    bwd = 2 * fwd
    if env.executor is not None and env.executor.compute == 2:
        fwd, bwd = eager_phases(env, executor_cost.embedding_ops(env.spec, env.shape, env.executor), 0.0, 0.0, 0.0)
    elif is_eager(env):
        fwd, bwd = eager_phases(env, eager.embedding_ops(env.spec, env.shape), 0.0, 0.0, 0.0)
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
        fwd, bwd = eager_phases(env, executor_cost.head_ops(env.spec, env.shape, env.executor), g_fwd, g_bwd, lm_head)
    elif is_eager(env):
        fwd, bwd = eager_phases(env, eager.head_ops(env.spec, env.shape), g_fwd, g_bwd, lm_head)
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
    if spec.mtp_num_layers:  # each MTP module on the last stage (planner.cost.mtp): norms, eh_proj, one layer
        k, last, h = spec.mtp_num_layers, counting.mtp_layer_index(spec) + 1, spec.hidden_size  # the layer it repeats
        dense[n + 1] += k * (counting.MTP_NORMS * counting.norm_params(spec) + 2 * h * h / tp + dense[last])
        expert[n + 1] += k * expert[last]
        if tied_copy and not spec.tied_embeddings:  # the last stage's own embedding table, tied to the first's
            dense[n + 1] += counting.embedding_params(spec) / tp
    return dense, expert
