"""Cost of one decoder layer whose token mixer is Gated DeltaNet or Mamba (ModelSpec.mixer "linear" / "mamba"), for
one micro-batch on one GPU: planner.cost.layers.decoder_cost with the attention terms replaced by the mixer's
(planner.cost.mixers, with the formulas and sources). The FFN or MoE half, the norms and residuals, the TP and EP
collectives are those of any decoder layer. What differs from attention:

- no RoPE and no attention core: selective recompute of the attention core has nothing to drop in these layers, so
  its recompute time is 0 and its saved bytes are the no-recompute bytes; the FFN's and the norms' modules
  (planner.cost.selective) drop and rerun as in any layer; a stack whose selective mode reruns half the forward
  (torchtitan) keeps its rule;
- activations and HBM traffic linear in the sequence length (no s x s scores, no KV growing with s);
- the chunked delta rule recomputes its chunk states in backward: those Hv*dk*dv per chunk are held while the
  layer's backward runs (the transient term, beside the FFN's gradients in flight);
- no context parallelism (planner.cost.mixers.tp_cp_reasons refuses cp > 1).
"""

from __future__ import annotations

import dataclasses

from planner.cost import compute, memory, mixers, moe_comm
from planner.cost import selective as selective_modules
from planner.cost import moe_layer as moe_layer_terms
from planner.cost.layer_terms import Env, ModuleCost, autocast_cast_s, ep_options, gemm_times, tp_times
from planner.models import counting


def _params_per_gpu(env: Env, moe_layer: bool, mixer: str) -> float:
    spec, shape = env.spec, env.shape
    base = counting.layer_norm_params(spec) + counting.mixer_params(spec, mixer) / shape.tp
    if not moe_layer:
        return base + counting.mlp_params(spec, spec.ffn_hidden_size) / shape.tp
    moe = counting.moe_params(spec)
    return base + moe.router + moe.shared / shape.tp + moe.num_experts * moe.per_expert / (shape.ep * shape.tp)


def activations(env: Env, *, moe_layer: bool, mixer: str) -> memory.LayerActivations:
    """Saved bytes: the layer's norms, inputs and FFN as for attention (memory.decoder_activation_bytes) less
    attention's Q, K, V, out-projection input and core, plus the mixer's own (mixers.mixer_activation_bytes)."""
    spec, shape = env.spec, env.shape
    layer = memory.decoder_activation_bytes(spec, shape, moe_layer=moe_layer)
    g = 1 if shape.fp8_inputs else 2
    saved = (layer.selective - memory.attention_saved_bytes(spec, shape) / shape.tp
             + mixers.mixer_activation_bytes(spec, shape, mixer, gemm_input_bytes=g))
    transient = memory.backward_transient_bytes(spec, dataclasses.replace(shape, flash_attention=True), moe_layer=moe_layer)
    if mixer == "linear":  # chunk states recomputed by the backward: Hv * dk * dv per chunk, bf16
        gdn = spec.linear_attention
        states = shape.tokens / gdn.chunk_size * gdn.num_value_heads * gdn.key_head_dim * gdn.value_head_dim
        transient = max(transient, states * compute.ACT_BYTES / shape.tp)
    return memory.LayerActivations(none=saved, selective=saved, full=layer.full, transient=transient)


def decoder_cost(env: Env, *, moe_layer: bool, mixer: str) -> ModuleCost:
    """Costs of one Gated DeltaNet or Mamba decoder layer (dense or MoE FFN) for one micro-batch on one GPU."""
    spec, shape = env.spec, env.shape
    moe = counting.moe_params(spec) if moe_layer else None
    gemms = mixers.mixer_gemms(spec, shape, mixer) + compute.mlp_gemms(spec, shape, moe=moe)
    g_fwd, g_bwd, _ = gemm_times(env, gemms)
    _, rest = compute.layer_elementwise_bytes(spec.model_copy(update={"position": "none"}), shape, moe=moe)
    mem = compute.memory_bound_time_s(rest + mixers.mixer_bytes(spec, shape, mixer), device=env.device, cal=env.cal)
    cast_fwd, cast_bwd = autocast_cast_s(env, _params_per_gpu(env, moe_layer, mixer))
    fwd, bwd = g_fwd + mem + cast_fwd, g_bwd + 2 * mem + cast_bwd
    pairs = mixers.tp_collectives(spec, mixer) - 1 + moe_layer_terms.ffn_tp_collectives(spec, shape, moe_layer=moe_layer)
    tp_fwd, tp_bwd = tp_times(env, fwd, bwd, collectives=pairs, gemm_s=(g_fwd, g_bwd))
    dispatcher, ep_fwd, ep_bwd = None, 0.0, 0.0
    if moe_layer:  # the same MoE FFN as an attention layer's: the dispatcher least exposed (layers.decoder_cost)
        shared_fwd, shared_bwd, _ = gemm_times(env, [g for g in gemms if g.name == "shared_experts"])
        dispatcher, ep_fwd, ep_bwd = moe_comm.choose(ep_options(env), layer_s=(fwd, bwd), shared_s=(shared_fwd, shared_bwd),
                                                     batch_overlap=env.moe_overlap, shared_overlap=env.moe_shared_overlap,
                                                     unhidden=moe_layer_terms.unhidden_s(env, env.moe_count_exchange))
    acts = activations(env, moe_layer=moe_layer, mixer=mixer)
    selective, act_selective = 0.0, acts.none
    modules = selective_modules.modules_of(env)
    if modules is not None:  # the FFN's and the norms' modules; no attention core, no MLA here
        ffn_pairs = moe_layer_terms.ffn_tp_collectives(spec, shape, moe_layer=moe_layer)
        parts = selective_modules.LayerParts(gemms=tuple(gemms), moe_layer=moe_layer, ep_fwd_s=ep_fwd,
                                             tp_ffn_s=tp_fwd * ffn_pairs / max(pairs, 1))
        selective, act_selective = selective_modules.recompute(env, parts, modules, act_none=acts.none, act_full=acts.full)
    elif env.selective_mode == "half_forward":  # torchtitan: every other layer, or every other matmul and pointwise ops
        selective, act_selective = (fwd + tp_fwd + ep_fwd) / 2, (acts.none + acts.full) / 2
    return ModuleCost(compute_fwd_s=fwd, compute_bwd_s=bwd, tp_fwd_s=tp_fwd, tp_bwd_s=tp_bwd, ep_fwd_s=ep_fwd,
                      ep_bwd_s=ep_bwd, selective_s=selective, act_none=acts.none, act_selective=act_selective,
                      act_full=acts.full, act_transient=acts.transient, moe_dispatcher=dispatcher)
