"""Brute-force references for the stage-partition DP and the two ILPs: enumerate every split (and every
recompute subset) of a small instance. Exponential on purpose; tests compare the fast solvers against these.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from planner.search.ilp import RecomputeProblem
from planner.search.partition import INF, StageProblem, stage_memory_bytes, stage_time_s


def compositions(num_layers: int, num_stages: int, empty_ends: bool = False) -> Iterator[tuple[int, ...]]:
    """Every way to write num_layers as an ordered sum of num_stages positive parts (with `empty_ends`, the first
    and last part may be 0: the positive compositions of num_layers + 2 less one at each end)."""
    if empty_ends and num_stages > 1:
        for counts in compositions(num_layers + 2, num_stages):
            yield (counts[0] - 1, *counts[1:-1], counts[-1] - 1)
        return
    for cuts in itertools.combinations(range(1, num_layers), num_stages - 1):
        bounds = (0, *cuts, num_layers)
        yield tuple(bounds[k + 1] - bounds[k] for k in range(num_stages))


def brute_partition(problem: StageProblem) -> float:
    """Min over all contiguous splits of the bottleneck stage time, subject to memory; inf when none fits."""
    best = INF
    for counts in compositions(problem.num_layers, problem.num_stages, problem.empty_ends):
        start, worst, fits = 0, 0.0, True
        for s, count in enumerate(counts):
            if stage_memory_bytes(problem, s, start, start + count) > problem.capacity_bytes:
                fits = False
                break
            worst = max(worst, stage_time_s(problem, s, start, start + count))
            start += count
        if fits:
            best = min(best, worst)
    return best


def brute_recompute(problem: RecomputeProblem) -> float:
    """Min extra recompute time over all subsets of fully recomputed layers that fit; inf when none fits."""
    n = len(problem.full_recompute_s)
    best = INF
    for mask in itertools.product((0, 1), repeat=n):
        x = np.array(mask, dtype=np.float64)
        mem = problem.base_bytes + problem.inflight * float(
            np.sum(problem.activation_bytes * (1 - x) + problem.full_recompute_activation_bytes * x)
        )
        if mem <= problem.capacity_bytes:
            best = min(best, float(np.sum(problem.full_recompute_s * x)))
    return best


def brute_assignment(
    problem: StageProblem, full_recompute_s: np.ndarray, full_recompute_activation_bytes: np.ndarray
) -> float:
    """Min bottleneck over all contiguous splits AND per-layer full-recompute choices (the joint ILP's reference)."""
    best = INF
    n = problem.num_layers
    for counts in compositions(n, problem.num_stages):
        worst, start = 0.0, 0
        for s, count in enumerate(counts):
            stage_best = _stage_best_with_recompute(problem, s, start, count, full_recompute_s, full_recompute_activation_bytes)
            worst = max(worst, stage_best)
            start += count
        best = min(best, worst)
    return best


def _stage_best_with_recompute(
    problem: StageProblem, stage: int, start: int, count: int, rf_s: np.ndarray, act_full: np.ndarray
) -> float:
    """The least time of one stage over recompute subsets that make it fit (stages are independent given a split)."""
    base_time = stage_time_s(problem, stage, start, start + count)
    base_mem = stage_memory_bytes(problem, stage, start, start + count)
    f = float(problem.inflight[stage])
    best = INF
    for mask in itertools.product((0, 1), repeat=count):
        x = np.array(mask, dtype=np.float64)
        sl = slice(start, start + count)
        saved = f * float(np.sum((problem.activation_bytes[sl] - act_full[sl]) * x))
        if base_mem - saved <= problem.capacity_bytes:
            best = min(best, base_time + float(np.sum(rf_s[sl] * x)))
    return best

