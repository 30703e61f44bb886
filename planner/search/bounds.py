"""Sound lower bounds that let the search discard whole groups of configurations without evaluating them.

Both bounds are lower bounds of what `CostModel.evaluate` returns, built only from the cost model's own per-layer
arrays (`LayerCosts`), so pruning with them never removes a configuration that could have won:

Time. Every pipeline rank runs `num_microbatches` forward+backward(+recompute) passes of its layers, and the
slowest rank's share of the per-micro-batch work T = sum_l (forward_s + backward_s + recompute_s) is at least
T / pp (the maximum is at least the mean; with vpp chunks per rank the same sum is split). Pipeline flushes add the
critical path of one micro-batch through the other stages (Huang et al. 2019 GPipe section 2.2; Narayanan et al.
2021 section 2.2). The cost model charges the bubble as planner.schedules.Schedule.bubble_s(rank time), increasing in
the rank time (GPipe and 1F1B (pp - 1) rank times, interleaved (pp - 1) / vpp, zero-bubble ZB-H1 a third of
1F1B's, PipeDream-2BW none), and the rank time is at least T / pp, so

    step_time >= num_microbatches * r + bubble_s(schedule, r),                          (1)
    r = max(T / pp, max(t_embedding, t_head) + min_l t_l)   (the second term for pp > 1: the end ranks hold the
                                                             embedding or the head and at least one layer)

Communication, the optimizer step and uneven stages only add to it; exposed communication is never negative.

Memory. A pipeline rank's peak is static + in-flight x activations + other bytes. The most loaded rank holds at
least the mean; every rank holds at least one micro-batch's activations (it must keep them until its backward);
static bytes fall (weakly) with the ZeRO stage and activations with recompute, SP and a smaller micro-batch, so
the least-memory variant of a factorisation bounds all of its configurations:

    peak >= (sum_l min_zero static_l + sum_l min(activation_l, full_recompute_activation_l)) / pp + min_s other_s   (2)
"""

from __future__ import annotations

from planner.schedules import TWO_BW
from planner.schedules import schedule as schedule_of


def step_time_lower_bound_s(time_sum_s: float, num_microbatches: int, pp: int, schedule: str = TWO_BW.name, vpp: int = 1,
                            end_stage_s: float = 0.0) -> float:
    """Bound (1); the default schedule (2bw: no bubble) gives a bound of every schedule. `end_stage_s`: with
    pp > 1 the first and last ranks hold the embedding / the head plus at least one decoder layer, so the
    bottleneck rank time is also at least max(t_emb, t_head) + the fastest decoder layer."""
    rank_s = max(time_sum_s / pp, end_stage_s if pp > 1 else 0.0)
    return num_microbatches * rank_s + schedule_of(schedule).bubble_s(pp=pp, vpp=vpp, rank_time_s=rank_s)


def memory_lower_bound_bytes(static_sum_bytes: float, activation_sum_bytes: float, pp: int, other_min_bytes: float) -> float:
    """Bound (2), from the least-memory variant's sums."""
    return (static_sum_bytes + activation_sum_bytes) / pp + other_min_bytes
