"""Phase 2 of the branch and bound: the members of one group, bounded with each axis order's own arrays.

A group reaches phase 2 when its phase-1 bound (planner.search.floors) is within the threshold. Its members are
(schedule, vpp) variant x ZeRO stage x axis order. Per variant and order, bound (3) of
planner.search.group_bounds with x = 0 and the order's pp link; a variant whose least bound exceeds the threshold
is pruned whole. Per ZeRO stage, the rank memory floor (held static bytes + in-flight x the least activations
+ other bytes, the balanced split of the variant): a stage over capacity on some rank holds no member that fits.
Per member, bound (3) with the recompute a rank over capacity needs (x_r); a member within the threshold goes on
the search's heap, where its exact exposed dp time is added (planner.cost.bounds.dp_exposed_s) before it is evaluated.
Nothing here evaluates a configuration: every count goes to `pruned` or to the heap.
"""

from __future__ import annotations

import numpy as np

from planner.cost import bounds as cost_bounds
from planner.cost.arrays import moe_batch_overlap
from planner.cost import p2p
from planner.schedules import DEFAULT
from planner.schedules import schedule as schedule_of
from planner.search.group_bounds import (MARGIN_BYTES, BoundsState, ModuleArrays, module_arrays, rank_sums,
                                         recompute_floor_s,
                                         step_lower_s, variant_shape)
from planner.search.space import Group


class Members(BoundsState):
    """Phase-2 bounds for one search (`state`: the driver's _Search)."""

    def shape(self, pp: int, vpp: int, schedule: str = DEFAULT.name):
        v = schedule_of(schedule).v_placed  # zbv, dualpipev: stages in a V, not looped
        return self._cached(("shape", pp, vpp, v), lambda: variant_shape(self.num_layers, pp, vpp, v, self.mtp_num_layers))

    def order_arrays(self, group: Group, vpp: int = 1) -> list[tuple[tuple[str, ...], ModuleArrays]]:
        """ModuleArrays of the group's members with `vpp` virtual stages under each axis order (their own links).
        The members of a group share them but where the stack's MoE overlap runs for some vpp and not others
        (planner.cost.arrays.moe_batch_overlap: Megatron-Core's needs virtual stages when pp > 1), so they are kept
        per overlap."""
        def make():
            out = []
            for order in self.state.space.orders(group.fact):
                lc = self.cost.layer_costs(self.state.candidate(group, zero_stage=self.opts.zero_stages[0], vpp=vpp,
                                                                axis_order=order))
                out.append((order, module_arrays(lc, self.state.partial(group))))
            return out

        overlap = moe_batch_overlap(self.cost, self.state.candidate(group, vpp=vpp))
        return self._cached(("order_arrays", group, overlap), make)

    def variant_bounds(self, group: Group, schedule: str, vpp: int, arrays) -> list[tuple[float, np.ndarray, float]]:
        """Per axis order: bound (3) with x = 0, the rank times and the pp communication."""
        f, m = group.fact, group.num_microbatches
        ranks = self.shape(f.pp, vpp, schedule).ranks
        out = []
        for order, arr in arrays:
            times = rank_sums(arr.time_s, ranks, f.pp)
            key = ("ppc", f, order, m, group.microbatch_size, group.sp, schedule_of(schedule).chunked_p2p, vpp)
            ppc = self._cached(key, lambda: p2p.pp_comm_s(self.cost,
                self.state.candidate(group, schedule=schedule, vpp=vpp, axis_order=order)))
            out.append((step_lower_s(m, float(times.max()), schedule, f.pp, vpp, ppc), times, ppc))
        return out

    def rank_fixed_bytes(self, group: Group, schedule: str, vpp: int, zero: int) -> np.ndarray:
        """Per rank: held static bytes + other bytes - capacity (what activations may use is minus this)."""
        return self.static_row(group, schedule, vpp, zero) + self.other_row(group, schedule, vpp, zero) - self.state.capacity

    def static_row(self, group: Group, schedule: str, vpp: int, zero: int) -> np.ndarray:
        """Per rank: the held static bytes (planner.cost.bounds.held_static_bytes) of the variant's balanced split."""
        f, v = group.fact, schedule_of(schedule).v_placed
        return self._cached(("static", f, zero, schedule_of(schedule).weight_versions, group.num_microbatches == 1, vpp, v), lambda: rank_sums(
            cost_bounds.held_static_bytes(self.cost, self.state.candidate(group, zero_stage=zero, schedule=schedule, vpp=vpp)),
            self.shape(f.pp, vpp, schedule).ranks, f.pp))

    def other_row(self, group: Group, schedule: str, vpp: int, zero: int) -> np.ndarray:
        """Per rank: the other bytes (CostModel.other_per_rank) of the member."""
        return self._cached(("other", group.fact, zero, group.microbatch_size, group.sp, schedule_of(schedule).v_placed),
                            lambda: self.cost.other_per_rank(self.state.candidate(group, zero_stage=zero, schedule=schedule, vpp=vpp)))

    def rank_fixed_rows(self, group: Group, schedule: str, vpp: int, zeros) -> np.ndarray:
        """rank_fixed_bytes for each ZeRO stage in `zeros`, as rows (memoised on what they read): the held static
        rows (per split) plus the other-bytes rows (per micro-batch shape), less the capacity."""
        f, zeros, v = group.fact, tuple(zeros), schedule_of(schedule).v_placed
        key = ("rows", f, schedule_of(schedule).weight_versions, group.num_microbatches == 1, vpp, group.microbatch_size, group.sp, zeros, v)
        found = self.memo.get(key)
        if found is None:
            static = self._cached(("static_rows", f, zeros, schedule_of(schedule).weight_versions, group.num_microbatches == 1, vpp, v),
                                  lambda: np.stack([self.static_row(group, schedule, vpp, z) for z in zeros]))
            other = self._cached(("other_rows", f, zeros, group.microbatch_size, group.sp, v),
                                 lambda: np.stack([self.other_row(group, schedule, vpp, z) for z in zeros]))
            found = self.memo[key] = static + other - self.state.capacity
        return found

    def expand(self, group: Group, schedule: str, vpp: int, count: int, arrays, push) -> None:
        """Bound the members of one valid variant; `push(lower, (vpp, schedule, zero, order))` those within the
        threshold, count the rest in `pruned`."""
        state, f, m = self.state, group.fact, group.num_microbatches
        pruned = state.space.pruned
        per_order = self.variant_bounds(group, schedule, vpp, arrays)
        least = min(lower for lower, _, _ in per_order)
        if least > state.ranking.threshold_s:
            pruned["time_lower_bound"] += count
            return
        ranks = self.shape(f.pp, vpp, schedule).ranks
        inflight = self.cost.schedule_inflight_per_rank(state.candidate(group, schedule=schedule, vpp=vpp))
        act = rank_sums(arrays[0][1].activation_bytes, ranks, f.pp)  # activations read no link
        act_floor = rank_sums(arrays[0][1].floor_bytes, ranks, f.pp)
        ratios: dict[int, np.ndarray] = {}
        allowed = state.space.rules.zero_stages(f.pp)
        for zero in self.opts.zero_stages:
            if zero not in allowed:
                pruned["zero_stage_not_in_framework"] += len(arrays)
                continue
            if least > state.ranking.threshold_s:
                pruned["time_lower_bound"] += len(arrays)
                continue
            fixed = self.rank_fixed_bytes(group, schedule, vpp, zero)
            if float((fixed + inflight * act_floor).max()) > MARGIN_BYTES:
                pruned["memory_lower_bound"] += len(arrays)
                continue
            excess = fixed + inflight * act
            over = state.partial(group) and float(excess.max()) > MARGIN_BYTES
            for index, ((order, arr), (lower, times, ppc)) in enumerate(zip(arrays, per_order)):
                if over and lower <= state.ranking.threshold_s:
                    extra = recompute_floor_s(arr, ranks, f.pp, excess, inflight, ratios, index)
                    lower = step_lower_s(m, float((times + extra).max()), schedule, f.pp, vpp, ppc)
                if lower > state.ranking.threshold_s:
                    pruned["time_lower_bound"] += 1
                    continue
                push(lower, (vpp, schedule, zero, order))

    def dp_exposed_s(self, group: Group, cand) -> float:
        """The member's exact exposed dp time (shared by members that differ in schedule, recompute, overlap)."""
        key = ("dp", group.fact, cand.axis_order, cand.zero_stage, cand.num_microbatches, cand.microbatch_size,
               cand.sp, cand.vpp, cand.compression, schedule_of(cand.schedule).v_placed)
        return self._cached(key, lambda: cost_bounds.dp_exposed_s(self.cost, cand, self.shape(cand.pp, cand.vpp, cand.schedule).ranks))
