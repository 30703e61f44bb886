"""Memory that torch.distributed.pipelining holds beyond a schedule's textbook in-flight count, for the stacks that run
it (behaviour.memory facts; the `planner` stack's executor: planner/executor/pipeline.py). All cited from torch 2.13
(torch/distributed/pipelining/), measured against the trace of the executor's step by
benchmarks/executor_memory_vs_trace.py.

- Split backward (ScheduleInterleavedZeroBubble, options.split_backward_retains_graph): the B pass,
  _backward.py stage_backward_input, runs autograd.grad(..., retain_graph=True) (line 250) and keeps, per micro-batch,
  the graph and the gradients arriving at every weight-gradient node (param_groups "grads", the hook of lines 226-240;
  stage.py backward_state, line 1031) until the W pass (stage_backward_weight). schedules.py _get_1f1b_rank_ops
  lets the W pass of rank r lag its B pass by r operations (num_1f1b_microbatches = rank, line 3114; the check at
  line 2841) after a warm-up of (vpp - 1) x (micro-batches per round) + pp - 1 - r forwards (_get_warmup_ops with
  multiply_factor=1, line 3079). So rank r holds the saved activations of warm-up + 1 + r chunk-micro-batches (every
  rank: min(m, pp) for vpp 1, where 1F1B holds pp - r), and the weight-gradient inputs of r + 1 of them (the one
  just through B and the r lagging).
- Receive buffers (options.pp_recv_buffers_per_microbatch): PipelineStage allocates one activation receive buffer per
  micro-batch for every stage but the first (stage.py _setup_forward_recv_info, lines 2243-2275:
  _make_tensor_from_meta per chunk_id) and one gradient receive buffer per micro-batch for every stage but the last
  (_setup_backward_recv_info lines 322-333, _create_grad_recv_info line 2314), all alive through the step. The trace
  shows them under 1F1B (Llama-3 8B pp 4, 32 micro-batches: middle ranks 1.19x the formula without them, 0.98x with)
  and under interleaved schedules with many micro-batches (the default request's pp 2 interleaved plans at 128
  micro-batches traced 104-130 GiB against 75-78 GiB priced without them), but not at pp 4 vpp 2 with 16
  micro-batches (0.97-1.03x without, 0.87x with: benchmarks/results/executor_memory_vs_trace.txt), kept as priced
  (the safe side) until that row is explained.
"""

from __future__ import annotations

from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import executor, moe_comm
from planner.cost.arrays import layer_working_bytes, moe_batch_overlap, priced_choices
from planner.cost.memory import p2p_activation_bytes
from planner.schedules import schedule as schedule_of

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate


def torch_split_backward(model: "CostModel", cand: "Candidate") -> bool:
    """The candidate runs torch's ScheduleInterleavedZeroBubble under a stack whose profile says its split backward
    retains the graph (the V-placed zbv and dualpipev keep the schedules' own counts: not measured here)."""
    sched = schedule_of(cand.schedule)
    return (model.options.split_backward_retains_graph and cand.pp > 1 and sched.splits_backward
            and sched.executor_class == "ScheduleInterleavedZeroBubble")


def _warmup(pp: int, stage: int, m: int, vpp: int) -> int:
    """torch's _get_warmup_ops(multiply_factor=1) for ScheduleInterleavedZeroBubble (micro-batches per round:
    m // max(1, m // pp))."""
    per_round = m // max(1, m // pp)
    return min((vpp - 1) * per_round + (pp - 1 - stage), m * vpp)


def zb_inflight(pp: int, stage: int, m: int, vpp: int) -> float:
    """Micro-batches (in units of the rank's layers) whose saved activations rank `stage` holds at its peak: the
    warm-up, the steady forward and the r whose W pass lags (module docstring)."""
    return min(m * vpp, _warmup(pp, stage, m, vpp) + 1 + stage) / vpp


def zb_weight_grad_held(pp: int, stage: int, m: int, vpp: int) -> float:
    """Micro-batches (in units of the rank's layers) whose weight-gradient inputs rank `stage` holds at its peak."""
    return min(m * vpp, stage + 1) / vpp


def weight_grad_input_bytes(model: "CostModel", cand: "Candidate") -> np.ndarray:
    """Per module (tok_embeddings, layers..., output): the gradients one micro-batch's B pass keeps for its W pass,
    the output gradient of every op with a weight: per attention layer q, k, v and the out-projection (a*d, 2*kv*d,
    h wide), the FFN's fc1 (2f gated, else f) and fc2 (h), the norms (h each); MoE layers the router (E wide) and
    the routed tokens' expert GEMMs; the head T x V, the embedding T x h. In the activation dtype, split by tp."""
    key = ("wgrad_inputs", cand.tp, cand.cp, cand.sp, cand.microbatch_size, cand.ep)
    found = model.memo.get(key)
    if found is not None:
        return found
    spec, shape = model.spec, model.shape(cand)
    dtype = 4 if model.request.precision == "fp32" else 2
    tokens, h, t = shape.tokens, spec.hidden_size, cand.tp
    a, kv, d = spec.num_attention_heads, spec.kv_heads, spec.dim_per_head
    attn = (a * d + 2 * kv * d + h) / t + spec.norms_per_layer * h / shape.sp_div
    fc1 = 2 if spec.gated else 1
    dense = tokens * (attn + (fc1 + 1) * spec.ffn_hidden_size / t)
    if spec.moe is not None:
        cfg = spec.moe
        routed = tokens * cfg.top_k * moe_comm.load_factor(cfg)
        moe = tokens * (attn + cfg.num_experts) + routed * (fc1 * cfg.expert_ffn_hidden_size + h) / t
        moe += tokens * (fc1 + 1) * cfg.shared_ffn_hidden_size / t
    else:
        moe = dense
    layers = np.where(model.moe_mask, moe, dense) if spec.moe is not None else np.full(spec.num_layers, dense)
    found = dtype * np.concatenate([[tokens * h / shape.sp_div], layers, [tokens * spec.vocab_size / t]])
    found.setflags(write=False)
    model.memo[key] = found
    return found


def stage_weight_grad_bytes(model: "CostModel", cand: "Candidate", split: tuple[int, ...]) -> np.ndarray:
    """weight_grad_input_bytes summed per pipeline rank over the split's virtual stages (embedding with the first,
    head with the last)."""
    per = weight_grad_input_bytes(model, cand)
    starts = [0, *accumulate(split)]
    stages = np.array([per[1 + lo:1 + hi].sum() for lo, hi in zip(starts[:-1], starts[1:])])
    stages[0] += per[0]
    stages[-1] += per[-1]
    return schedule_of(cand.schedule).rank_sums(stages[None, :], pp=cand.pp, vpp=cand.vpp)[0]


def recv_buffer_bytes(model: "CostModel", cand: "Candidate") -> np.ndarray:
    """Per pipeline rank: the receive buffers of every micro-batch (module docstring), an activation buffer for each
    local stage but the first, a gradient buffer for each but the last, s*b*h (/t with SP) each."""
    if not model.options.pp_recv_buffers_per_microbatch or cand.pp <= 1:
        return np.zeros(cand.pp)
    sched, stages = schedule_of(cand.schedule), cand.pp * cand.vpp
    counts = np.zeros(cand.pp)
    for s in range(stages):
        counts[sched.stage_rank(s, pp=cand.pp)] += (s != 0) + (s != stages - 1)
    return counts * cand.num_microbatches * p2p_activation_bytes(model.spec, model.shape(cand))


def loss_phase_credit(model: "CostModel", cand: "Candidate") -> np.ndarray:
    """Per pipeline rank: what stage_other_bytes counts for the loss phase beyond a layer's backward phase, on the
    loss rank (executor pricing only; else 0). The loss phase of a split-backward rank runs after a W pass, with one
    micro-batch of weight-gradient inputs fewer than the peak after its B pass (module docstring): evaluate counts
    the larger phase, not both (planner.cost.evaluate._memory)."""
    credit = np.zeros(cand.pp)
    recipe = model.executor_recipe_for(cand)
    if recipe is None or not torch_split_backward(model, cand):
        return credit
    loss = executor.loss_transient_bytes(model.spec, model.shape(cand), recipe)
    working = layer_working_bytes(model, cand, recompute=cand.recompute)
    credit[schedule_of(cand.schedule).loss_rank(pp=cand.pp, vpp=cand.vpp)] = max(0.0, loss - working)
    return credit


def ep_overlap_extra_microbatches(model: "CostModel", cand: "Candidate") -> float:
    """Micro-batches a rank holds in flight beyond its schedule's because the stack's batch-level MoE overlap runs
    (options.moe_overlap_extra_microbatch: Megatron-Core's combined 1F1B): with a pipeline, one more model chunk of
    warm-up forwards (schedules.py get_pp_rank_microbatches, num_warmup_microbatches + 1), 1/vpp of a micro-batch of
    the rank's layers; without one, micro-batch i+1's forward runs beside micro-batch i's backward
    (combined_1f1b_schedule_for_no_pipelining), one micro-batch. 0 where the overlap does not run: no MoE layer
    with ep > 1, the stack's conditions unmet (moe_batch_overlap), or a dispatcher it does not overlap."""
    if not model.options.moe_overlap_extra_microbatch or cand.ep <= 1 or not moe_batch_overlap(model, cand):
        return 0.0
    if priced_choices(model, cand)[1] != "batch":
        return 0.0
    return 1.0 if cand.pp == 1 else 1.0 / cand.vpp
