"""The search driver: branch and bound over the plan space, then DP/ILP refinement of the winners.

1. Enumerate factorisations (planner.search.space); structural rules prune them, counted per reason.
2. Per valid factorisation, its groups (micro-batch size, sp, recompute, tp_overlap) get the cost model's
   per-layer arrays; from them the sound lower bounds of planner.search.bounds: step time (1) and memory (2).
3. Factorisations are visited by ascending time bound and their groups likewise; a group, or one (schedule, vpp)
   variant of it, is pruned when its bound exceeds the step time of the current top_k + 1-th best distinct plan
   (the "time_lower_bound" count), a group or a (variant, ZeRO stage) when its memory bound exceeds the capacity
   ("memory_lower_bound"). Everything else is evaluated by CostModel.evaluate with balanced stages; when a rank
   would not fit and the base recompute is not "full", with the partial full recompute per stage that makes
   every rank fit at the least extra time (closed form, or ILP (A) for mixed layer types).
4. The best top_k + 1 are refined: with pp > 1 and vpp = 1 the stage-partition DP re-splits the layers
   (embedding/head imbalance, in-flight memory falling with the stage); when the DP finds no split that fits,
   the joint assignment ILP (B) chooses the split and the recompute set together (small problems only).
5. No configuration is dropped silently: configurations_considered = evaluated-and-fitting + sum(pruned).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from planner.capabilities import refusal
from planner.errors import InfeasibleError
from planner.schemas.plan import LaunchPlan, PlanRequest, SearchLimits
from planner.search import bounds
from planner.search.outcome import Ranking, Scored, infeasible_message, rank_key
from planner.search.partition import StageProblem, partition
from planner.search.refine import Counters, partial_recompute, rank_excess_bytes, rank_of_modules, rank_sums, split_for
from planner.search.space import Group, Options, Space, axis_orders

ProgressFn = Callable[[int, int], None]


@dataclass
class SearchResult:
    ranked: list[Scored]
    closest: Scored | None
    pruned: Counter
    considered: int
    evaluated: int
    counters: Counters
    memory_floor: tuple[float, str] | None
    capacity_bytes: float
    opts: Options


@dataclass
class _Arrays:
    """Sums of one group's per-layer arrays (what the bounds need)."""

    time_sum_s: float
    activation_floor_bytes: float
    end_stage_s: float  # max(embedding, head) + the fastest decoder layer (bound (1))
    time_keys: tuple  # keys of the per-layer time arrays of the group's orders


class _Search:
    def __init__(self, request: PlanRequest, cost, opts: Options, *, exhaustive: bool, progress: ProgressFn | None):
        self.request, self.cost, self.opts = request, cost, opts
        self.exhaustive, self.progress = exhaustive, progress
        self.space = Space(request, opts)
        self.limits = request.search or SearchLimits()
        self.ranking = Ranking(self.limits.top_k + 1)
        self.capacity = float(cost.capacity_bytes())
        self.counters = Counters()
        self.closest: Scored | None = None
        self.floor: tuple[float, str] | None = None
        self.evaluated = 0
        self._arrays: dict[tuple, _Arrays] = {}
        self._static: dict[tuple, np.ndarray] = {}
        self._times: dict[tuple, tuple] = {}
        self._split_bounds: dict[tuple, float] = {}
        self._acts: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
        self.partial_ok = "full" in opts.recompute_modes

    # ---- bounds -------------------------------------------------------------------------------------------
    def _candidate(self, group: Group, **member):
        from planner.cost.model import Candidate

        fields = group.candidate_fields()
        fields.update(member)
        return Candidate(**fields)

    def group_arrays(self, group: Group) -> _Arrays:
        """Time sum and activation floor of a group: the minimum over its axis orders (a bound must hold for every
        member). The per-layer times depend on the micro-batch shape, recompute, tp_overlap and the links of the
        TP, CP and EP groups only (planner.cost.layers reads no other link), so they are shared by every
        factorisation and order with the same links: computed once per such key."""
        key = (group.fact, group.microbatch_size, group.sp, group.recompute, group.tp_overlap)
        if key not in self._arrays:
            time_sum, act, end_s, keys = np.inf, np.inf, np.inf, []
            for order in axis_orders(group.fact):
                cand = self._candidate(group, zero_stage=self.opts.zero_stages[0], axis_order=order)
                links = self.cost.links(cand)
                tkey = (group.fact.tp, group.fact.cp, group.fact.ep, group.microbatch_size, group.sp,
                        group.recompute, group.tp_overlap, links.tp, links.cp, links.ep)
                if tkey not in self._times:
                    lc = self.cost.layer_costs(cand)
                    a = np.asarray(lc.activation_bytes, dtype=np.float64)
                    if self.partial_ok:
                        a = np.minimum(a, np.asarray(lc.full_recompute_activation_bytes, dtype=np.float64))
                    t = np.asarray(lc.forward_s) + np.asarray(lc.backward_s) + np.asarray(lc.recompute_s)
                    end = max(float(t[0]), float(t[-1])) + float(np.min(t[1:-1]))
                    self._times[tkey] = (float(t.sum()), float(a.sum()), end, t)
                keys.append(tkey)
                time_sum = min(time_sum, self._times[tkey][0])
                act = min(act, self._times[tkey][1])
                end_s = min(end_s, self._times[tkey][2])
            self._arrays[key] = _Arrays(time_sum, act, end_s, tuple(keys))
        return self._arrays[key]

    def static_floor(self, group: Group) -> tuple[float, float]:
        """Least static bytes (the highest ZeRO stage allowed: every stage shards at least what the one below
        does) and least other bytes (the lowest ZeRO stage: ZeRO-3 adds gathered weights) over the stages."""
        most = self._candidate(group, zero_stage=max(self.opts.zero_stages))
        least = self._candidate(group, zero_stage=min(self.opts.zero_stages))
        static = float(np.sum(self.cost.layer_costs(most).static_bytes))
        other = min(float(self.cost.stage_other_bytes(least, s)) for s in range(group.fact.pp))
        return static, other

    def memory_bound(self, group: Group, static: tuple[float, float]) -> float:
        arrays = self.group_arrays(group)
        return bounds.memory_lower_bound_bytes(static[0], arrays.activation_floor_bytes, group.fact.pp, static[1])

    def time_bound(self, group: Group, schedule: str = "2bw", vpp: int = 1) -> float:
        arrays = self.group_arrays(group)
        return bounds.step_time_lower_bound_s(arrays.time_sum_s, group.num_microbatches, group.fact.pp, schedule, vpp,
                                              arrays.end_stage_s)

    def split_bound_s(self, group: Group) -> float:
        """With vpp = 1: the least bottleneck stage time over every contiguous split (the partition DP on time
        alone, no memory limit), minimum over the group's orders; a rank time no split can go below."""
        best = np.inf
        for tkey in self.group_arrays(group).time_keys:
            key = (tkey, group.fact.pp)
            if key not in self._split_bounds:
                t = self._times[tkey][3]
                zeros = [0.0] * group.fact.pp
                problem = StageProblem(time_s=t[1:-1], static_bytes=np.zeros(len(t) - 2), activation_bytes=np.zeros(len(t) - 2),
                                       inflight=zeros, other_bytes=zeros, capacity_bytes=np.inf,
                                       embed_time_s=float(t[0]), head_time_s=float(t[-1]))
                self.counters.dp_calls += 1
                found = partition(problem)
                self._split_bounds[key] = found.bottleneck_s if found is not None else np.inf
            best = min(best, self._split_bounds[key])
        return best

    def variant_bound(self, group: Group, schedule: str, vpp: int) -> float:
        """Bound (1) for one (schedule, vpp) variant, with the DP's least bottleneck when vpp = 1."""
        from planner.cost.schedule import bubble_s

        lower = self.time_bound(group, schedule, vpp)
        if vpp > 1 or group.fact.pp == 1:
            return lower
        rank_s = self.split_bound_s(group)
        return max(lower, group.num_microbatches * rank_s + bubble_s(schedule, pp=group.fact.pp, vpp=1, rank_time_s=rank_s))

    # ---- the loop -----------------------------------------------------------------------------------------
    def bounded_groups(self) -> list[tuple[float, tuple, Group]]:
        """Every valid group that passes the memory bound, with its time bound, sorted by bound then a fixed
        tie-break (best-first: the incumbent improves fastest and the rest is pruned in one sweep)."""
        out = []
        for fact in self.space.factorisations():
            count = self.space.fact_count(fact)
            self.space.considered += count
            reason = self.space.fact_reason(fact)
            if reason is not None:
                self.space.pruned[reason] += count
                continue
            groups = self.space.fact_groups(fact)
            static = self.static_floor(groups[0])
            for group in groups:
                mem = self.memory_bound(group, static)
                if mem > self.capacity and not self.exhaustive:
                    self.space.pruned["memory_lower_bound"] += self.space.members_per_group(fact)
                    if self.floor is None or mem < self.floor[0]:
                        self.floor = (mem, f"dp={fact.dp} tp={fact.tp} pp={fact.pp} cp={fact.cp} ep={fact.ep} mbs={group.microbatch_size}")
                    continue
                out.append((self.time_bound(group), _group_tie(group), group))
        out.sort(key=lambda item: (item[0], item[1]))
        return out

    def run(self) -> None:
        groups = self.bounded_groups()
        for done, (lower, _, group) in enumerate(groups):
            if lower > self.ranking.threshold_s and not self.exhaustive:
                self.space.pruned["time_lower_bound"] += self._group_members(group)
            else:
                self.visit_group(group)
            if self.progress is not None and (done % 64 == 63 or done + 1 == len(groups)):
                self.progress(done + 1, len(groups))

    def _group_members(self, group: Group) -> int:
        return sum(count for _, _, count in self.space.variants(group))

    def visit_group(self, group: Group) -> None:
        """Members by (schedule, vpp) variant, ZeRO stage and axis order; the bound is re-checked before every
        member, as the incumbent improves while the group is visited."""
        orders = axis_orders(group.fact)
        for schedule, vpp, _ in self.space.variants(group):
            lower = self.variant_bound(group, schedule, vpp) if not self.exhaustive else 0.0
            for zero in self.opts.zero_stages:
                if not self.exhaustive and lower > self.ranking.threshold_s:
                    self.space.pruned["time_lower_bound"] += len(orders)
                    continue
                if not self.exhaustive and self.member_memory_floor(group, schedule, vpp, zero) > self.capacity:
                    self.space.pruned["memory_lower_bound"] += len(orders)
                    continue
                for order in orders:
                    if not self.exhaustive and lower > self.ranking.threshold_s:
                        self.space.pruned["time_lower_bound"] += 1
                        continue
                    self.visit(self._candidate(group, zero_stage=zero, schedule=schedule, vpp=vpp, axis_order=order))

    def member_memory_floor(self, group: Group, schedule: str, vpp: int, zero: int) -> float:
        """Bound (2) per pipeline rank for the balanced split the members are evaluated with: the rank's static
        bytes at this ZeRO stage + in-flight x its activation floor + its other bytes at the lowest ZeRO stage;
        the most loaded rank. Static bytes (params, grads, optimizer states) do not depend on the micro-batch,
        sp, recompute or the axis order, so they are taken once per (factorisation, ZeRO stage)."""
        fact = group.fact
        split = split_for(self.request.model.num_layers, _Shape(fact.pp, vpp))
        ranks = rank_of_modules(split, fact.pp)
        skey = (fact, zero, split)
        if skey not in self._static:
            lc = self.cost.layer_costs(self._candidate(group, zero_stage=zero))
            self._static[skey] = rank_sums(lc.static_bytes, ranks, fact.pp)
        akey = (group, split)
        if akey not in self._acts:
            cand = self._candidate(group, zero_stage=min(self.opts.zero_stages))
            lc = self.cost.layer_costs(cand)
            act = np.asarray(lc.activation_bytes, dtype=np.float64)
            if self.partial_ok:
                act = np.minimum(act, np.asarray(lc.full_recompute_activation_bytes, dtype=np.float64))
            other = np.array([float(self.cost.stage_other_bytes(cand, r)) for r in range(fact.pp)])
            self._acts[akey] = (rank_sums(act, ranks, fact.pp), other)
        act, other = self._acts[akey]
        probe = _Shape(fact.pp, vpp, schedule, group.num_microbatches)
        inflight = np.array([float(self.cost.inflight_microbatches(probe, r)) for r in range(fact.pp)])
        return float(np.max(self._static[skey] + inflight * act + other))

    def visit(self, cand) -> None:
        if self.opts.runnable:
            refused = refusal(
                cp=cand.cp, ep=cand.ep, dp=cand.dp, tp=cand.tp, pp=cand.pp, sp=cand.sp, zero_stage=cand.zero_stage,
                schedule=cand.schedule, recompute=cand.recompute, tp_overlap=cand.tp_overlap,
                is_moe=self.request.model.moe is not None,
            )
            if refused is not None:
                self.space.pruned[refused[0]] += 1
                return
        reasons = self.cost.validity_reasons(cand)
        if reasons:
            self.space.pruned[_slug(reasons[0])] += 1
            return
        item = self.evaluate(cand)
        self.evaluated += 1
        if item.ev.fits:
            self.ranking.offer(item)
            return
        self.space.pruned["does_not_fit"] += 1
        over = item.ev.peak_bytes - item.ev.capacity_bytes
        if self.closest is None or (over, item.key) < (self.closest.ev.peak_bytes - self.closest.ev.capacity_bytes, self.closest.key):
            self.closest = item

    def evaluate(self, cand) -> Scored:
        """Evaluate with balanced stages; when a rank would not fit and the base recompute is not "full", with the
        partial full recompute per stage that makes every rank fit at the least extra time (refine.py)."""
        self.counters.evaluations += 1
        if self.partial_ok and cand.recompute != "full":
            split = split_for(self.request.model.num_layers, cand)
            lc = self.cost.layer_costs(cand)
            excess = rank_excess_bytes(self.cost, cand, lc, split)
            if max(excess) > 0:
                counts = partial_recompute(self.cost, cand, lc, split, self.counters, self.limits.time_limit_s, excess)
                if counts is not None and any(counts):
                    ev = self.cost.evaluate(cand, stage_layers=split, full_recompute_layers=counts)
                    if ev.fits:
                        return Scored(rank_key(cand, ev), cand, ev, split, counts)
        ev = self.cost.evaluate(cand)
        return Scored(rank_key(cand, ev), cand, ev)


@dataclass(frozen=True)
class _Shape:
    """The fields of a candidate that the split and CostModel.inflight_microbatches read."""

    pp: int
    vpp: int
    schedule: str = "1f1b"
    num_microbatches: int = 1


def _group_tie(group: Group) -> tuple:
    f = group.fact
    return (f.tp, f.pp, f.cp, f.ep, f.dp, -group.microbatch_size, group.recompute, group.sp, group.tp_overlap)


def _slug(reason: str) -> str:
    """A `pruned` key from a validity reason: its words before the first ':' or '=' digits, snake_cased."""
    head = reason.split(":")[0].strip().lower()
    words = [w for w in "".join(c if c.isalnum() else " " for c in head).split() if not w.isdigit()]
    return "_".join(words[:8]) or "invalid"


def search(request: PlanRequest, *, fixed: dict[str, int] | None = None, progress: ProgressFn | None = None,
           exhaustive: bool = False, cost=None) -> SearchResult:
    """Run the search; `exhaustive=True` turns every bound off (the reference the tests compare against)."""
    from planner.search.refine_top import refine_top

    cost = cost if cost is not None else make_cost_model(request)
    opts = Options.from_request(request, fixed)
    state = _Search(request, cost, opts, exhaustive=exhaustive, progress=progress)
    state.run()
    ranked = refine_top(state, state.ranking.items)
    return SearchResult(
        ranked=ranked, closest=state.closest, pruned=state.space.pruned, considered=state.space.considered,
        evaluated=state.evaluated, counters=state.counters, memory_floor=state.floor, capacity_bytes=state.capacity,
        opts=opts,
    )


def make_cost_model(request: PlanRequest):
    """The cost model of a request, with its measured profile when the request names one."""
    from planner.cost.model import CostModel

    profile = None
    if request.profile is not None:
        from planner.io import load_file
        from planner.schemas.profile import Profile

        profile = load_file(Profile, request.profile)
    return CostModel(request, profile)


def plan(request: PlanRequest, *, progress: ProgressFn | None = None, fixed: dict[str, int] | None = None) -> LaunchPlan:
    """The fastest plan that fits, as a LaunchPlan; InfeasibleError (exit 1) saying how far the closest is."""
    result = search(request, fixed=fixed, progress=progress)
    if not result.ranked:
        limits = request.search or SearchLimits()
        message, shortfall, closest = infeasible_message(
            gpus=request.gpus, gpus_per_node=request.topology.gpus_per_node, capacity_bytes=result.capacity_bytes,
            closest=result.closest, floor=result.memory_floor, zero_stages=tuple(limits.zero_stages),
            recompute_modes=tuple(limits.recompute_modes), seq_len=request.seq_len, pruned=dict(result.pruned),
        )
        raise InfeasibleError(message, closest=closest, shortfall_bytes=shortfall)
    from planner.search.assemble import assemble

    return assemble(request, result)


__all__ = ["plan", "search", "SearchResult", "make_cost_model"]
