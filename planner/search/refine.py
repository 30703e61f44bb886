"""From the cost model's per-layer arrays to the DP and ILP problems, and back to `evaluate` arguments.

- `stage_problem`: the stage-partition problem of a candidate (pp stages, vpp = 1) from its LayerCosts: decoder
  layers are entries 1..L-2 of the arrays, the embedding entry 0 rides on stage 0, the head entry L-1 on the last.
- `partial_recompute`: how many decoder layers of each virtual stage to recompute fully so that every pipeline
  rank fits, at the least extra time. When a rank's layers are identical (the usual case: one layer type per
  stage) the answer is closed-form: k = ceil(excess / saving) layers. Otherwise ILP (A) of planner.search.ilp
  decides, and the count is passed on (the cost model's `evaluate` takes counts per virtual stage).
"""

from __future__ import annotations

import math
from functools import lru_cache
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.errors import InfeasibleError
from planner.frameworks_split import balanced_split
from planner.schedules import DEFAULT, V_PLACED
from planner.schedules import schedule as schedule_of
from planner.search.partition import StageProblem, partition


@dataclass
class Counters:
    dp_calls: int = 0
    ilp_calls: int = 0
    evaluations: int = 0


def stage_problem(cost, cand, lc) -> StageProblem:
    """Problem of partition.py for a candidate with vpp = 1 (one stage per pipeline rank)."""
    time = np.asarray(lc.forward_s) + np.asarray(lc.backward_s) + np.asarray(lc.recompute_s)
    static = np.asarray(lc.static_bytes, dtype=np.float64)
    act = np.asarray(lc.activation_bytes, dtype=np.float64)
    return StageProblem(
        time_s=time[1:-1], static_bytes=static[1:-1], activation_bytes=act[1:-1],
        inflight=[float(cost.inflight_microbatches(cand, s)) for s in range(cand.pp)],
        other_bytes=[float(cost.stage_other_bytes(cand, s)) for s in range(cand.pp)],
        capacity_bytes=float(cost.capacity_bytes()),
        embed_time_s=float(time[0]), embed_static_bytes=float(static[0]), embed_activation_bytes=float(act[0]),
        head_time_s=float(time[-1]), head_static_bytes=float(static[-1]), head_activation_bytes=float(act[-1]),
        empty_ends=cost.framework.capabilities.interleaved_split.empty_chunks != "none",
    )


def chunk_ranges(stage_layers: Sequence[int]) -> list[range]:
    """Array indices (1-based decoder entries) of each virtual stage's decoder layers."""
    out, start = [], 1
    for count in stage_layers:
        out.append(range(start, start + count))
        start += count
    return out


@lru_cache(maxsize=4096)
def rank_of_modules(stage_layers: tuple[int, ...], pp: int, v_placed: bool = False) -> np.ndarray:
    """Pipeline rank of every module (embedding, decoder layers, head): virtual stage v runs on rank v % pp, or
    in a V (`v_placed`: zbv, dualpipev; planner.schedules.Schedule.stage_rank)."""
    schedule = V_PLACED[0] if v_placed else DEFAULT
    rank = [schedule.stage_rank(v, pp=pp) for v in range(len(stage_layers))]
    ranks = [0] + [rank[v] for v, count in enumerate(stage_layers) for _ in range(count)] + [rank[-1]]
    return np.asarray(ranks, dtype=np.int64)


def rank_sums(values: np.ndarray, ranks: np.ndarray, pp: int) -> np.ndarray:
    """Per pipeline rank sums of a per-module array."""
    return np.bincount(ranks, weights=np.asarray(values, dtype=np.float64), minlength=pp)


def rank_excess_bytes(cost, cand, lc, stage_layers: Sequence[int]) -> list[float]:
    """Per pipeline rank: bytes over capacity (<= 0 when it fits), by the contract's per-stage memory formula."""
    ranks = rank_of_modules(tuple(stage_layers), cand.pp, schedule_of(cand.schedule).v_placed)
    static = rank_sums(lc.static_bytes, ranks, cand.pp)
    act = rank_sums(lc.activation_bytes, ranks, cand.pp)
    return list(static + cost.inflight_per_rank(cand) * act + cost.other_per_rank(cand) - float(cost.capacity_bytes()))


def _rank_recompute_count(
    layer_idx: list[int], excess: float, inflight: float, lc, solve_ilp: Callable
) -> int | None:
    """Fewest-extra-time set of layers to recompute on one rank; its size, or None when even all do not fit."""
    if excess <= 0:
        return 0
    act = np.asarray(lc.activation_bytes, dtype=np.float64)[layer_idx]
    act_full = np.asarray(lc.full_recompute_activation_bytes, dtype=np.float64)[layer_idx]
    rf = np.asarray(lc.full_recompute_s, dtype=np.float64)[layer_idx]
    saving = inflight * (act - act_full)
    if np.ptp(saving) == 0 and np.ptp(rf) == 0:
        if saving[0] <= 0:
            return None
        k = math.ceil(excess / float(saving[0]) - 1e-12)
        return k if k <= len(layer_idx) else None
    try:
        choice = solve_ilp(rf, act, act_full, excess, inflight)
    except InfeasibleError:
        return None
    return int(sum(choice.recompute))


def partial_recompute(cost, cand, lc, stage_layers: Sequence[int], counters: Counters, time_limit_s: float,
                      excess: Sequence[float] | None = None) -> tuple[int, ...] | None:
    """Fully recomputed decoder layers per virtual stage so that every rank fits; None when impossible."""
    from planner.search.ilp import RecomputeProblem, solve_recompute

    def solve_ilp(rf, act, act_full, excess, inflight):
        # ILP (A) on these layers alone: their activations may use at most (their current bytes - excess)
        counters.ilp_calls += 1
        budget = inflight * float(act.sum()) - excess
        problem = RecomputeProblem(rf, act, act_full, base_bytes=0.0, inflight=inflight, capacity_bytes=budget)
        return solve_recompute(problem, time_limit_s=time_limit_s)

    ranges = chunk_ranges(stage_layers)
    counts = [0] * len(stage_layers)
    excess = rank_excess_bytes(cost, cand, lc, stage_layers) if excess is None else excess
    for rank, over in enumerate(excess):
        chunks = [v for v in range(len(stage_layers)) if schedule_of(cand.schedule).stage_rank(v, pp=cand.pp) == rank]
        idx = [i for v in chunks for i in ranges[v]]
        k = _rank_recompute_count(idx, over, float(cost.inflight_microbatches(cand, rank)), lc, solve_ilp)
        if k is None:
            return None
        for n, v in enumerate(chunks):  # spread evenly over the rank's chunks, the earliest first
            counts[v] = min(len(ranges[v]), -(-k // (len(chunks) - n)))
            k -= counts[v]
        if k > 0:
            return None
    return tuple(counts)


def split_for(num_layers: int, cand, last_slots: int = 0) -> tuple[int, ...]:
    """Balanced decoder layers per virtual stage (what the search passes when it does not partition; `last_slots`:
    the MTP layers, as the cost model's default split counts them)."""
    return balanced_split(num_layers, cand.pp * cand.vpp, last_slots=last_slots)


def dp_split(problem: StageProblem) -> tuple[int, ...] | None:
    """Decoder layers per stage of the stage-partition DP (planner.search.partition) for `problem`, or None when no
    split fits."""
    found = partition(problem)
    return None if found is None else tuple(found.layers_per_stage)
