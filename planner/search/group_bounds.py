"""Bounds of the branch and bound per group of configurations, from the cost model's per-module arrays.

Phase 1 (every group, planner.search.floors) uses planner.cost.bounds.floor_costs: per-module times at most those under
any placement of the cp, ep, dp and pp groups (planner.cost.bounds), so no group needs placing yet. Phase 2
(a group that phase 1 did not prune, planner.search.members) uses each axis order's own arrays.

Members are evaluated with balanced stages (split_for) and, when a rank does not fit, with a partial full
recompute that only adds time to that rank (refine.partial_recompute; `evaluate` adds full_recompute_s -
recompute_s per recomputed layer, and the dp and optimizer terms do not read the recompute). So with t_r the
rank's per-micro-batch time under the base recompute (planner.cost.evaluate), every member's step time is at least

    m * t_b + bubble_s(schedule, t_b) + pp_comm_s,          t_b = max_r (t_r + x_r)                       (3)

where x_r lower-bounds the recompute the rank needs to fit: a rank over capacity by E_r bytes, holding f_r
micro-batches, saves f_r (a_l - a'_l) bytes per recomputed layer l at d_l extra seconds, so by the fractional
knapsack (the LP relaxation of ILP (A)) x_r >= E_r / f_r * min_l d_l / (a_l - a'_l). Where some d_l < 0 the
module times are taken as t_l + min(0, d_l) and x_r = 0 (still a lower bound; the analytic model has d_l >= 0).
The step is increasing in t_b, and exposed dp communication and the optimizer step are never negative.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from planner.schedules import schedule as schedule_of
from planner.search.refine import rank_of_modules, split_for

MARGIN_BYTES = 1.0  # CostModel.capacity_bytes() is rounded down: only an excess above this certainly does not fit


@dataclass(frozen=True)
class ModuleArrays:
    """Per-module numbers of one group under one set of links (time under the base recompute, and so on)."""

    time_s: np.ndarray  # forward + backward + recompute, + min(0, extra) where a partial recompute may apply
    extra_s: np.ndarray  # full_recompute_s - recompute_s: what recomputing the module fully adds
    activation_bytes: np.ndarray  # saved per micro-batch under the base recompute
    floor_bytes: np.ndarray  # the least a module can save (min with full recompute when partial recompute applies)
    saving_bytes: np.ndarray  # activation - full-recompute activation where positive, else 0

    @property
    def time_sum_s(self) -> float:
        return float(self.time_s.sum())


def module_arrays(lc, partial: bool) -> ModuleArrays:
    """ModuleArrays of LayerCosts `lc`; `partial`: a partial full recompute may apply (base recompute not full)."""
    time = np.asarray(lc.forward_s) + np.asarray(lc.backward_s) + np.asarray(lc.recompute_s)
    extra = np.asarray(lc.full_recompute_s, dtype=np.float64) - np.asarray(lc.recompute_s, dtype=np.float64)
    act = np.asarray(lc.activation_bytes, dtype=np.float64)
    full = np.asarray(lc.full_recompute_activation_bytes, dtype=np.float64)
    if partial:
        time = time + np.minimum(extra, 0.0)
        floor = np.minimum(act, full)
    else:
        floor = act
    return ModuleArrays(time, extra, act, floor, np.maximum(act - full, 0.0) if partial else np.zeros_like(act))


def rank_sums(values: np.ndarray, ranks: np.ndarray, pp: int) -> np.ndarray:
    return np.bincount(ranks, weights=values, minlength=pp)


def step_lower_s(m: int, rank_s: float, schedule: str, pp: int, vpp: int, pp_comm_s: float) -> float:
    """Bound (3) for a bottleneck rank time."""
    return m * rank_s + schedule_of(schedule).bubble_s(pp=pp, vpp=vpp, rank_time_s=rank_s) + pp_comm_s


def recompute_floor_s(arrays: ModuleArrays, ranks: np.ndarray, pp: int, excess: np.ndarray, inflight: np.ndarray,
                      cache: dict | None = None, key=None) -> np.ndarray:
    """x_r of bound (3) per rank (`excess` per rank, or rows of them): 0 where the rank fits; inf where no module
    can save bytes. `cache[key]` keeps the per-rank least d_l / (a_l - a'_l) of these arrays and ranks."""
    over = excess > MARGIN_BYTES
    if not over.any() or (arrays.extra_s < 0).any():
        return np.zeros_like(excess)
    best = None if cache is None else cache.get(key)
    if best is None:
        saves = arrays.saving_bytes > 0
        ratio = np.where(saves, arrays.extra_s / np.where(saves, arrays.saving_bytes, 1.0), np.inf)
        best = np.full(pp, np.inf)
        np.minimum.at(best, ranks, ratio)
        if cache is not None:
            cache[key] = best
    with np.errstate(invalid="ignore"):
        return np.where(over, excess / inflight * best, 0.0)


@dataclass
class VariantShape:
    """What one (pp, vpp) needs of the balanced split: the rank of every module."""

    split: tuple[int, ...]
    ranks: np.ndarray


def variant_shape(num_layers: int, pp: int, vpp: int, v_placed: bool = False, last_slots: int = 0) -> VariantShape:
    split = split_for(num_layers, _Probe(pp, vpp), last_slots)
    return VariantShape(split, rank_of_modules(split, pp, v_placed))


@dataclass(frozen=True)
class _Probe:
    pp: int
    vpp: int


class BoundsState:
    """What the phase-1 (Floors) and phase-2 (Members) bounds share: the search state and one memo per search."""

    def __init__(self, state):
        self.state, self.cost, self.opts = state, state.cost, state.opts
        self.num_layers = state.request.model.num_layers
        self.mtp_num_layers = state.request.model.mtp_num_layers
        self.memo: dict[tuple, object] = {}

    def _cached(self, key: tuple, make):
        found = self.memo.get(key)
        if found is None:
            found = self.memo[key] = make()
        return found
