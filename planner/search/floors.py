"""Bounds of families, shapes and groups (stages FAMILY..PLACED of planner.search.driver), before any group's
module costs under its own placement are computed.

A group's members differ in (schedule, vpp), ZeRO stage and axis order; every bound here holds for all of them,
and for every group a family or shape stands for:

- family (tp, cp, ep, sp, tp_overlap): m x microbatch_size x planner.cost.bounds.per_sample_floor_s / pp, the same for
  every pp, micro-batch size and recompute;
- shape (a family's micro-batch size): m x T / pp with T the least sum over the recompute modes of the
  placement-floor module times (planner.cost.bounds.floor_time_sum_s), the same for every pp;
- group, `time`: bound (3) of planner.search.group_bounds with x = 0 on the placement-floor arrays
  (planner.cost.bounds.floor_costs) and the balanced split of each variant, plus pp communication over the cheapest
  footprint (planner.cost.bounds.pp_comm_floor_s);
- group, `coupled_floor` then `coupled`: with x_r, the recompute a rank over capacity needs, and the per-rank
  memory floor (held static bytes + in-flight x least activations + other bytes; a (variant, ZeRO stage) over
  capacity on some rank holds no member that fits), first from the least memory over the schedules and stages,
  then per (schedule, vpp, stage);
- group, `pp_refined` then `dp_refined`: each axis order's pp link (planner.cost.p2p.pp_comm_s) and exposed dp time at
  that ZeRO stage (planner.cost.bounds.dp_exposed_s): the placement of the dp and pp groups, not yet the module costs
  under it.
Memory bound (2) per ZeRO stage (`memory`) only names the least memory when nothing fits.

Everything is memoised on what it depends on: the placement-floor arrays on (tp, cp, ep, micro-batch shape,
recompute, tp_overlap), shared by every pp; static bytes per (factorisation, ZeRO stage).
"""

from __future__ import annotations

import numpy as np

from planner.cost import bounds as cost_bounds
from planner.cost import p2p
from planner.schedules import DEFAULT, V_PLACED
from planner.schedules import schedule as schedule_of
from planner.schemas.dims import ParallelDims
from planner.search import bounds
from planner.search.group_bounds import (MARGIN_BYTES, BoundsState, ModuleArrays, module_arrays, recompute_floor_s,
                                         step_lower_s, variant_shape)
from planner.search.space import Group


class Floors(BoundsState):
    """Bounds of groups for one search (`state`: the driver's _Search: cost, opts, request, space)."""

    def order(self, fact: ParallelDims) -> tuple[str, ...]:
        return self.state.space.orders(fact)[0]

    def shape(self, pp: int, vpp: int, schedule: str = DEFAULT.name):
        v = schedule_of(schedule).v_placed  # zbv, dualpipev: stages in a V, not looped
        return self._cached(("shape", pp, vpp, v), lambda: variant_shape(self.num_layers, pp, vpp, v, self.mtp_num_layers))

    def candidate(self, group: Group, **member):
        member.setdefault("axis_order", self.order(group.fact))
        return self.state.candidate(group, **member)

    @staticmethod
    def arrays_key(group: Group) -> tuple:
        f = group.fact
        return ("floor", f.tp, f.cp, f.ep, group.microbatch_size, group.sp, group.recompute, group.tp_overlap, f.pp > 1)

    def arrays(self, group: Group) -> ModuleArrays:
        """Placement-floor ModuleArrays of the group (shared by every pp with these tp, cp, ep and shape)."""
        return self._cached(self.arrays_key(group), lambda: module_arrays(
            cost_bounds.floor_costs(self.cost, self.candidate(group, zero_stage=self.opts.zero_stages[0])),
            self.state.partial(group)))

    def group(self, fact: ParallelDims, mbs: int, sp: bool, recompute: str, overlap: str) -> Group:
        return Group(fact, mbs, self.state.request.global_batch_size // (fact.dp * mbs), sp, recompute, overlap,
                     self.opts.modules_for(recompute))

    def shapes(self, sp: bool, overlap: str, facts: list[ParallelDims]) -> dict[tuple[int, bool], list[Group]]:
        """The groups of a family by shape (micro-batch size, pp > 1): one ModuleArrays key but the recompute."""
        out: dict[tuple[int, bool], list[Group]] = {}
        space = self.state.space
        for fact in facts:
            for mbs in space.group_options(fact)[0]:
                groups = [self.group(fact, mbs, sp, recompute, overlap) for recompute in self.opts.recompute_modes]
                kept = [g for g in groups if not space.refuses_group(g)]
                self.state.done(len(groups) - len(kept))
                if kept:
                    out.setdefault((mbs, fact.pp > 1), []).extend(kept)
        return out

    def family_lower(self, fact: ParallelDims, sp: bool, overlap: str) -> float:
        """A bound of every group with this factorisation's tp, cp, ep and these sp, tp_overlap, whatever its pp,
        micro-batch size and recompute: m * microbatch_size * (per-sample floor) / pp (planner.cost.bounds
        .per_sample_floor_s; bound (1) with T >= microbatch_size x the floor, recompute times being >= 0), the
        same for them all, since m / pp = global_batch_size * tp * cp / (gpus * microbatch_size)."""
        group = self.group(fact, self.state.space.group_options(fact)[0][0], sp, self.opts.recompute_modes[0], overlap)
        floor = cost_bounds.per_sample_floor_s(self.cost, self.candidate(group, zero_stage=self.opts.zero_stages[0]))
        return group.num_microbatches * group.microbatch_size * floor / fact.pp

    def shape_lower(self, group: Group) -> float:
        """A bound of every group of the family with this group's micro-batch size, whatever its pp and recompute:
        m * T / pp (bound (1)) with T the least sum over the recompute modes (planner.cost.bounds.floor_time_sum_s)."""
        floor = cost_bounds.floor_time_sum_s(self.cost, self.candidate(group, zero_stage=self.opts.zero_stages[0]))
        return bounds.step_time_lower_bound_s(floor, group.num_microbatches, group.fact.pp)

    def memory(self, group: Group) -> dict[int, float]:
        """Bound (2) per ZeRO stage."""
        f = group.fact
        act = float(self.arrays(group).floor_bytes.sum())
        out = {}
        for zero in self.opts.zero_stages:
            static = self._cached(("static", f, zero, group.num_microbatches == 1), lambda: float(
                cost_bounds.held_static_bytes(self.cost, self.candidate(group, zero_stage=zero)).sum()))
            other = self._cached(("other", f, zero, group.microbatch_size, group.sp, group.recompute, group.recompute_modules), lambda: float(
                self.cost.other_per_rank(self.candidate(group, zero_stage=zero)).min()))
            out[zero] = bounds.memory_lower_bound_bytes(static, act, f.pp, other)
        return out

    def variants(self, group: Group) -> list[tuple[int, tuple[str, ...]]]:
        """The group's valid variants as (vpp, schedules), the schedules of one entry sharing a stage placement
        (looped, or a V); PipeDream-2BW only where validity_reasons allows it (it needs num_microbatches >= pp:
        only then is it asked). The same for every group of a factorisation with this num_microbatches."""
        f = group.fact
        key = ("variants", f, group.num_microbatches)
        found = self.memo.get(key)
        if found is None:
            by_vpp: dict[tuple[int, bool], list[str]] = {}
            for schedule, vpp in self.state.space.rules.valid_variants(f.pp, group.num_microbatches):
                if schedule_of(schedule).min_microbatches_is_pp and group.num_microbatches < f.pp and self.cost.validity_reasons(
                        self.candidate(group, schedule=schedule)):
                    continue
                by_vpp.setdefault((vpp, schedule_of(schedule).v_placed), []).append(schedule)
            found = self.memo[key] = [(vpp, tuple(schedules)) for (vpp, _), schedules in by_vpp.items()]
        return found

    def variant_ranks(self, group: Group) -> tuple[np.ndarray, np.ndarray]:
        """The rank of every module under each entry of `variants`, as one bincount index (entry i's ranks + i * pp),
        and the module of each position: per-rank sums of every variant in one call, each sum added in the order
        group_bounds.rank_sums adds it."""
        f = group.fact

        def make() -> tuple[np.ndarray, np.ndarray]:
            layout = tuple((vpp, schedule_of(schedules[0]).v_placed) for vpp, schedules in self.variants(group))
            return self._cached(("variant_ranks", f.pp, layout), lambda: (np.concatenate(
                [self.shape(f.pp, vpp, V_PLACED[0].name if v else DEFAULT.name).ranks + i * f.pp for i, (vpp, v) in enumerate(layout)])
                if layout else np.zeros(0, np.int64), np.tile(np.arange(self.num_layers + 2), len(layout))))
            # the same for every factorisation with this pp and layout; with each entry's module index

        return self._cached(("variant_ranks", f, group.num_microbatches), make)

    def rows(self, group: Group, field: str) -> np.ndarray:
        """variant_sums of one ModuleArrays field of the group (time_s, floor_bytes, activation_bytes), memoised on
        the arrays and pp (which fix the factorisation and the micro-batch count)."""
        return self._cached((field, self.arrays_key(group), group.fact.pp),
                            lambda: self.variant_sums(group, getattr(self.arrays(group), field)))

    def variant_sums(self, group: Group, values: np.ndarray) -> np.ndarray:
        """Per-rank sums of a per-module array under each entry of `variants`: rows of pp."""
        index, modules = self.variant_ranks(group)
        rows = len(modules) // (self.num_layers + 2)
        return np.bincount(index, weights=values.take(modules), minlength=rows * group.fact.pp).reshape(rows, group.fact.pp)

    def time(self, group: Group) -> float:
        """Bound (3) with x = 0 on the placement-floor arrays, the least over the variants, each with pp
        communication over its cheapest footprint (planner.cost.bounds.pp_comm_floor_s). The bottleneck rank time of
        every variant comes from one array operation, shared by the groups of these arrays and pp."""
        f, m = group.fact, group.num_microbatches
        variants = self.variants(group)
        rank_s = self._cached(("rank_rows", self.arrays_key(group), f.pp), lambda: self.rows(group, "time_s").max(axis=1).tolist())
        floors = self.pp_comm_floors(group)
        ppc = self._cached(("ppc_rows", f, group.microbatch_size, group.sp),
                           lambda: [floors[(vpp, schedule_of(schedules[0]).chunked_p2p)] for vpp, schedules in variants])
        return min((step_lower_s(m, rank_s[i], s, f.pp, vpp, ppc[i]) for i, (vpp, schedules) in enumerate(variants)
                    for s in schedules), default=np.inf)

    def coupled_floor(self, group: Group) -> float:
        """A bound of `coupled` for the whole group from one row per vpp: the least held static + other bytes of
        any schedule and ZeRO stage per rank, the fewest in-flight micro-batches of any schedule per rank, the
        least bubble. x_r = (static_r + f_r a_r - C) / f_r x ratio_r grows with f_r once static_r <= C (else no
        member fits) and with static_r, so these least values bound every (schedule, ZeRO stage). inf: no member
        of the group fits."""
        f, m = group.fact, group.num_microbatches
        zeros = self.state.space.rules.zero_stages(f.pp)
        variants = self.variants(group)
        if not zeros or not variants:
            return np.inf
        inflight, fixed = self.least_rows(group, zeros)
        akey = self.arrays_key(group)
        act_floor = self.rows(group, "floor_bytes")
        kept = (fixed.max(axis=1) <= MARGIN_BYTES) & ((fixed + inflight * act_floor).max(axis=1) <= MARGIN_BYTES)
        if not kept.any():
            return np.inf
        times = self.rows(group, "time_s")
        if self.state.partial(group):
            act = self.rows(group, "activation_bytes")
            times = times.copy()
            for i in np.flatnonzero(kept):
                vpp, schedules = variants[i]
                ranks, v = self.shape(f.pp, vpp, schedules[0]).ranks, schedule_of(schedules[0]).v_placed
                times[i] = times[i] + recompute_floor_s(self.arrays(group), ranks, f.pp, fixed[i] + inflight[i] * act[i],
                                                        inflight[i], self.memo, ("ratio", akey, f.pp, vpp, v))
        bottleneck = times.max(axis=1).tolist()
        floors = self.pp_comm_floors(group)
        ppc = self._cached(("ppc_each", f, group.microbatch_size, group.sp), lambda: [
            [floors[(vpp, schedule_of(s).chunked_p2p)] for s in schedules] for vpp, schedules in variants])
        return min(step_lower_s(m, bottleneck[i], s, f.pp, variants[i][0], ppc[i][j])
                   for i in np.flatnonzero(kept).tolist() for j, s in enumerate(variants[i][1]))

    def least_rows(self, group: Group, zeros: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Per entry of `variants` (rows): the fewest in-flight micro-batches of its schedules per rank, and the
        least held static + other bytes - capacity of its schedules and ZeRO stages per rank (coupled_floor)."""
        f, m = group.fact, group.num_microbatches

        def make():
            variants = self.variants(group)
            inflight = self._cached(("inflight_rows", f.pp, m, tuple(variants)), lambda: np.stack([np.minimum.reduce([
                self._cached(("inflight", s, f.pp, vpp, m), lambda: self.cost.schedule_inflight_per_rank(
                    self.candidate(group, schedule=s, vpp=vpp))) for s in schedules]) for vpp, schedules in variants]))
            looped = [[s for s in schedules if not schedule_of(s).stale_weights] for _, schedules in variants]
            if all(looped):  # one memory class (not 2BW) in every entry: all of them in one array operation
                fixed = self.class_fixed_rows(group, [(vpp, each[-1]) for (vpp, _), each in zip(variants, looped)], zeros)
                for i, (vpp, schedules) in enumerate(variants):
                    for stale in (s for s in schedules if schedule_of(s).stale_weights):
                        fixed[i] = np.minimum(fixed[i], self.state.members.rank_fixed_rows(group, stale, vpp, zeros).min(axis=0))
                return inflight, fixed
            return inflight, np.stack([np.minimum.reduce([self.state.members.rank_fixed_rows(group, s, vpp, zeros).min(axis=0)
                                       for s in {schedule_of(s).weight_versions: s for s in schedules}.values()])
                                       for vpp, schedules in variants])

        return self._cached(("least_rows", f, m, group.microbatch_size, group.sp), make)

    def class_fixed_rows(self, group: Group, reps: list[tuple[int, str]], zeros: tuple[int, ...]) -> np.ndarray:
        """Per entry of `variants` (its vpp and a schedule `reps[i]` of one memory class): the least over `zeros` of
        held static + other bytes - capacity per rank, Members.rank_fixed_rows(...).min(axis=0) of every entry at
        once (the held bytes read no vpp: planner.cost.bounds.held_static_bytes)."""
        return self.class_rows(group, reps, zeros).min(axis=0)

    def class_rows(self, group: Group, reps: list[tuple[int, str]], zeros: tuple[int, ...]) -> np.ndarray:
        """Members.rank_fixed_rows of every entry of `variants` with the schedule `reps[i]` (one memory class), as
        (ZeRO stage, entry, rank), memoised on what they read."""
        layout = tuple((each_vpp, schedule_of(each).v_placed) for each_vpp, each in reps)  # what the rank sums read
        key = ("class_rows", group.fact, group.num_microbatches == 1, schedule_of(reps[0][1]).weight_versions, group.microbatch_size, group.sp,
               zeros, layout)
        return self._cached(key, lambda: self._class_rows(group, reps, zeros, layout))

    def _class_rows(self, group: Group, reps: list[tuple[int, str]], zeros: tuple[int, ...], layout: tuple) -> np.ndarray:
        f, members = group.fact, self.state.members
        vpp, schedule = reps[0]
        static = self._cached(("class_static", f, group.num_microbatches == 1, schedule_of(schedule).weight_versions, zeros, layout), lambda: np.stack([
            self.variant_sums(group, cost_bounds.held_static_bytes(
                self.cost, self.state.candidate(group, zero_stage=z, schedule=schedule, vpp=vpp))) for z in zeros]))
        first = {}  # the first entry of each placement (looped, V): its other bytes
        for vpp, schedule in reps:
            first.setdefault(schedule_of(schedule).v_placed, (vpp, schedule))
        other = {v: np.stack([members.other_row(group, s, vpp, z) for z in zeros]) for v, (vpp, s) in first.items()}
        if len(other) == 1:
            rows = static + next(iter(other.values()))[:, None, :]
        else:
            rows = static + np.stack([other[schedule_of(s).v_placed] for _, s in reps], axis=1)
        return rows - self.state.capacity

    def coupled(self, group: Group, zeros: list[int]) -> list[tuple[float, int, str, int]]:
        """Per (vpp, schedule, ZeRO stage in `zeros`) that the per-rank memory floor (planner.search.members)
        allows: bound (3) on the placement-floor arrays with x_r, the recompute a rank over capacity needs (its
        d_l are at most any placement's), no pp communication; sorted. Empty: no member of the group fits."""
        f, m = group.fact, group.num_microbatches
        arrays, out = self.arrays(group), []
        all_times, all_act, all_floor = (self.rows(group, field) for field in ("time_s", "activation_bytes", "floor_bytes"))
        variants = self.variants(group)
        looped = [[s for s in schedules if not schedule_of(s).stale_weights] for _, schedules in variants]
        class_rows = self.class_rows(group, [(vpp, each[-1]) for (vpp, _), each in zip(variants, looped)],
                                     tuple(zeros)) if all(looped) else None  # rank_fixed_rows of every entry at once
        for i, (vpp, schedules) in enumerate(variants):
            ranks, v = self.shape(f.pp, vpp, schedules[0]).ranks, schedule_of(schedules[0]).v_placed
            times, act, act_floor = all_times[i], all_act[i], all_floor[i]
            bottleneck: dict = {}  # schedules with the same memory (1F1B, ZB-H1) share the rank times
            for schedule in schedules:  # every ZeRO stage at once: rows of per-rank numbers
                inflight = self._cached(("inflight", schedule, f.pp, vpp, m), lambda: self.cost.schedule_inflight_per_rank(
                    self.candidate(group, schedule=schedule, vpp=vpp)))
                fixed, fits = self._cached(
                    ("fits", f, group.microbatch_size, group.sp, vpp, schedule, tuple(zeros), act_floor.tobytes()),
                    lambda: self._fits(group, schedule, vpp, zeros, inflight, act_floor,
                                       class_rows[:, i, :] if class_rows is not None and not schedule_of(schedule).stale_weights else None))
                if not fits.any():
                    continue
                key = (inflight.tobytes(), fixed.tobytes())
                if key not in bottleneck:
                    rank_s = np.broadcast_to(times, fixed.shape)
                    if self.state.partial(group):
                        rank_s = times + recompute_floor_s(arrays, ranks, f.pp, fixed + inflight * act, inflight, self.memo,
                                                            ("ratio", self.arrays_key(group), f.pp, vpp, v))
                    bottleneck[key] = rank_s.max(axis=1)
                lowers = step_lower_s(m, bottleneck[key], schedule, f.pp, vpp, 0.0)
                out.extend((float(lower), vpp, schedule, zero) for lower, zero, ok in zip(lowers, zeros, fits) if ok)
        return sorted(out)

    def _fits(self, group: Group, schedule: str, vpp: int, zeros: list[int], inflight: np.ndarray,
              act_floor: np.ndarray, fixed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Rows per ZeRO stage of held static + other - capacity per rank (`fixed` when the caller has them), and
        whether the least activations fit on every rank (shared by the groups that differ only in recompute and
        tp_overlap)."""
        fixed = self.state.members.rank_fixed_rows(group, schedule, vpp, zeros) if fixed is None else fixed
        return fixed, (fixed + inflight * act_floor).max(axis=1) <= MARGIN_BYTES

    def pp_comm_floor_s(self, group: Group, vpp: int, schedule: str) -> float:
        """planner.cost.bounds.pp_comm_floor_s of the group's (schedule, vpp) variant (flat schedules share one)."""
        return self.pp_comm_floors(group)[(vpp, schedule_of(schedule).chunked_p2p)]

    def pp_comm_floors(self, group: Group) -> dict[tuple[int, bool], float]:
        """pp_comm_floor_s of every variant of the group by (vpp, chunked): one send over the cheapest footprint,
        each schedule's transfers (planner.cost.bounds.pp_comm_floors_s); shared by the groups of this shape."""
        key = ("ppc", group.fact, group.microbatch_size, group.sp)  # the factorisation and shape fix num_microbatches
        found = self.memo.get(key)
        if found is None:
            wanted: dict[tuple[int, bool], tuple[str, int]] = {}
            for vpp, schedules in self.variants(group):
                for schedule in schedules:
                    wanted.setdefault((vpp, schedule_of(schedule).chunked_p2p), (schedule, vpp))
            values = cost_bounds.pp_comm_floors_s(self.cost, self.candidate(group), list(wanted.values()))
            found = self.memo[key] = dict(zip(wanted, values))
        return found

    def placed_floor(self, group: Group, coupled: list[tuple[float, int, str, int]]) -> float:
        """The least over `coupled` of its bound plus pp communication over the cheapest footprint and exposed dp
        time over the cheapest footprint of the dp groups (planner.cost.bounds.dp_exposed_s(floor=True)) at that stage."""
        f, m = group.fact, group.num_microbatches
        best = np.inf
        for time_s, vpp, schedule, zero in coupled:
            time_s += self.pp_comm_floor_s(group, vpp, schedule)
            if time_s >= best:
                continue
            best = min(best, time_s + self.dp_floors(group, zero)[(vpp, schedule_of(schedule).v_placed)])
        return best

    def dp_floors(self, group: Group, zero: int) -> dict[tuple[int, bool], float]:
        """planner.cost.bounds.dp_exposed_s(floor=True) at this ZeRO stage under the split of every variant of the
        group, by (vpp, V placement), in one array operation (planner.cost.bounds.dp_exposed_floors_s)."""
        f = group.fact
        layout = self._cached(("dp_layout", f, group.num_microbatches), lambda: {
            (vpp, schedule_of(schedules[0]).v_placed): schedules[0] for vpp, schedules in self.variants(group)})

        def rows() -> dict[str, np.ndarray]:  # the splits' sums, shared by the ZeRO stages
            cands = [self.candidate(group, zero_stage=zero, vpp=vpp, **({"schedule": s} if v else {})) for (vpp, v), s in layout.items()]
            return cost_bounds.dp_split_rows(self.cost, cands, [self.shape(f.pp, vpp, s).ranks for (vpp, _), s in layout.items()])

        return self._cached(("dp_floors", f, zero, group.microbatch_size, group.sp), lambda: dict(zip(layout, cost_bounds.dp_exposed_floors_s(
            self.cost, self.candidate(group, zero_stage=zero), self._cached(("dp_rows", f, group.microbatch_size, group.sp), rows)))))

    def pp_refined(self, group: Group, bounds: list[tuple[float, int, str, int]]) -> list[tuple[float, int, int, tuple, bool]]:
        """`coupled` plus each axis order's pp communication (planner.cost.p2p.pp_comm_s): (bound, vpp, zero, order),
        sorted."""
        f, m = group.fact, group.num_microbatches
        out = []
        for time_s, vpp, schedule, zero in bounds:
            for order in self.state.space.orders(f):
                key = ("ppc_order", f, order, m, group.microbatch_size, group.sp, vpp, schedule_of(schedule).chunked_p2p)
                ppc = self._cached(key, lambda: p2p.pp_comm_s(self.cost,
                    self.candidate(group, schedule=schedule, vpp=vpp, axis_order=order)))
                out.append((time_s + ppc, vpp, zero, order, schedule_of(schedule).v_placed))
        return sorted(out)

    def dp_refined(self, group: Group, bounds: list[tuple[float, int, int, tuple, bool]]) -> float:
        """The least over the entries of `pp_refined` of the bound plus that order's exposed dp time at that
        ZeRO stage (planner.cost.bounds.dp_exposed_s)."""
        f, m = group.fact, group.num_microbatches
        best = np.inf
        for time_s, vpp, zero, order, v in bounds:
            if time_s >= best:
                break
            ranks = self.shape(f.pp, vpp, V_PLACED[0].name if v else DEFAULT.name).ranks
            dp = self._cached(("dp", f, order, zero, m, group.microbatch_size, group.sp, vpp, v), lambda: (
                cost_bounds.dp_exposed_s(self.cost, self.candidate(group, zero_stage=zero, vpp=vpp, axis_order=order,
                                                      **({"schedule": V_PLACED[0].name} if v else {})), ranks)))
            best = min(best, time_s + dp)
        return best
