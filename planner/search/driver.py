"""The search driver: branch and bound over the plan space, then DP/ILP refinement of the winners.

1. Enumerate factorisations (planner.search.space); structural rules prune them, counted per reason.
2. Best-first over one heap of entries, each a sound lower bound of the step time of every configuration it
   stands for, refined in stages (the bounds: planner.search.bounds, group_bounds, floors, members; the numbers
   they need: planner.cost.bounds through CostModel):
     FAMILY   every group with one tp, cp, ep, sp, tp_overlap: global batch x a per-sequence floor / gpus x tp cp
     SHAPE    one micro-batch size of a family: m x T / pp over the placement-floor module times (bound (1))
     GROUP    one group: bound (3) on the balanced split with x = 0, pp communication over its cheapest footprint
     COUPLE   + the recompute a rank over capacity needs, from the least memory over schedules and ZeRO stages
     COUPLED  the same per (schedule, vpp, ZeRO stage); (variant, stage) pairs over capacity on a rank dropped;
              + pp and exposed dp time over the cheapest footprints
     PLACED   + each axis order's pp link; then + its exposed dp time at that ZeRO stage
     VISIT    the members, bounded with each axis order's own module times (planner.search.members)
     MEMBER   + the member's exact exposed dp time
     EVALUATE CostModel.evaluate with balanced stages; when a rank would not fit and the base recompute is not
              "full", with the partial full recompute per stage that makes every rank fit at the least extra
              time (closed form, or ILP (A) for mixed layer types)
   An entry whose bound exceeds the step time of the current top_k + 1-th best distinct plan is pruned with all
   it stands for ("time_lower_bound"); a group none of whose (variant, ZeRO stage) fits on every rank, or a
   member's (variant, ZeRO stage) that does not, is pruned by memory ("memory_lower_bound"). The threshold only
   falls, so a pruned configuration could not have entered the final top_k + 1; pruning with every bound off
   (`exhaustive`) gives the same plans (tests/unit/test_search_driver.py).
3. The best top_k + 1 are refined: with pp > 1 and vpp = 1 the stage-partition DP re-splits the layers
   (embedding/head imbalance, in-flight memory falling with the stage); when the DP finds no split that fits,
   the joint assignment ILP (B) chooses the split and the recompute set together (small problems only).
4. No configuration is dropped silently: configurations_considered = evaluated-and-fitting + sum(pruned).
5. The whole search is bounded by SearchLimits.time_limit_s (not each ILP): past it the heap's remaining entries
   are counted as pruned ("search_time_limit") and the best plan found so far is returned with a note saying so,
   or SolverTimeoutError when none was found; a search that ends in time is unaffected (and deterministic).
The searches that make one plan (the stack's recompute module sets, the practice preference) and the LaunchPlan
they give: planner.search.entry.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from planner.cost.arrays import moe_batch_overlap
from planner.frameworks import config_of, load_framework, refusal
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import PlanRequest, SearchLimits
from planner.search import compression_space
from planner.search.costing import make_cost_model
from planner.search.floors import Floors
from planner.search.members import Members
from planner.search.options import Options
from planner.search.outcome import Ranking, Scored, rank_key
from planner.search.refine import Counters, partial_recompute, rank_excess_bytes, split_for
from planner.search.space import Group, Space

ProgressFn = Callable[[int, int], None]
FAMILY, SHAPE, GROUP, COUPLE, COUPLED, PLACED, VISIT, MEMBER, EVALUATE = range(9)  # stages of a heap entry (_Search.run)


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
    timed_out: bool = False


class _Search:
    def __init__(self, request: PlanRequest, cost, opts: Options, *, exhaustive: bool, progress: ProgressFn | None):
        self.request, self.cost, self.opts = request, cost, opts
        self.exhaustive, self.progress = exhaustive, progress
        self.space = Space(request, opts)
        self.limits = request.search or SearchLimits()
        self.ranking = Ranking(self.limits.top_k + 1, offset_s=cost.step_overhead_s)
        self.capacity = float(cost.capacity_bytes())
        self.counters = Counters()
        self.closest: Scored | None = None
        self.floor: tuple[float, str] | None = None
        self.evaluated = 0
        # partial full recompute (some layers per stage) only where the stack can say it (--recompute-num-layers)
        self.partial_ok = "full" in opts.recompute_modes and opts.profile.capabilities.recompute.partial_full
        self.floors = Floors(self)
        self.members = Members(self)
        self.deadline = time.monotonic() + self.limits.time_limit_s
        self.timed_out = False

    def candidate(self, group: Group, **member):
        from planner.cost.model import Candidate

        fields = group.candidate_fields()
        fields.update(member)
        fields.setdefault("compression", self.opts.compression)
        fields.setdefault("dp_replicate", self.opts.dp_replicate)
        return Candidate(**fields)

    def compressions(self, cand) -> tuple:
        """The member's compression variants (planner.search.compression_space), `cand` with each."""
        if not self.opts.compression_auto:
            return (cand,)
        found = compression_space.variants(
            self.opts.profile, zero_stage=cand.zero_stage, pp=cand.pp, replicas=cand.dp_cp,
            dp_link=self.cost.links(cand).dp, auto=True, fixed=self.opts.compression)
        return tuple(dataclasses.replace(cand, compression=c) for c in found)

    def partial(self, group: Group) -> bool:
        """A partial full recompute may apply to the group's members (refine.partial_recompute)."""
        return self.partial_ok and group.recompute != "full"

    # ---- phase 1: bounds of every group (planner.search.floors), visited least first -------------------------
    def bounded_groups(self) -> list[tuple]:
        """The heap's first entries (bound, tie-break, stage, group, payload): one per family (FAMILY: the groups
        of every factorisation with one tp, cp, ep, sp and tp_overlap; payload (sp, tp_overlap, factorisations)),
        or with `exhaustive` one per group, visited as they come."""
        out, families = [], {}
        self.groups_total = 0
        for fact in self.space.factorisations():
            count = self.space.fact_count(fact)
            self.space.considered += count
            reason = self.space.fact_reason(fact)
            if reason is not None:
                self.space.pruned[reason] += count
                continue
            if self.exhaustive:
                out.extend((0.0, _group_tie(group), VISIT, group, None) for group in self.space.fact_groups(fact))
                continue
            sizes, sps, overlaps = self.space.group_options(fact)
            self.groups_total += len(sizes) * len(sps) * len(overlaps) * len(self.opts.recompute_modes)
            for sp, overlap in itertools.product(sps, overlaps):
                families.setdefault((fact.tp, fact.cp, fact.ep, sp, overlap), []).append(fact)
        for (tp, cp, ep, sp, overlap), facts in families.items():
            lower = self.floors.family_lower(facts[0], sp, overlap)
            out.append((lower, (-1, tp, cp, ep, int(sp), overlap), FAMILY, None, (sp, overlap, facts)))
        self.groups_total = len(out) if self.exhaustive else self.groups_total
        heapq.heapify(out)
        return out

    def memory_pruned(self, group: Group) -> None:
        """Count a group none of whose members fits as pruned by memory; the least of its bounds (2) is kept for
        the message when nothing fits at all."""
        fact = group.fact
        self.space.pruned["memory_lower_bound"] += self.space.members_per_group(fact)
        mem = min(self.floors.memory(group).values())
        if self.floor is None or mem < self.floor[0]:
            self.floor = (mem, f"dp={fact.dp} tp={fact.tp} pp={fact.pp} cp={fact.cp} ep={fact.ep} mbs={group.microbatch_size}")

    def run(self) -> None:
        """Best-first over one heap (module docstring, step 2). An entry whose bound exceeds the threshold is
        pruned with all it stands for; else it is refined and pushed back, expanded, or evaluated."""
        self.groups_done = 0
        self.heap = self.bounded_groups()
        while self.heap:
            lower, tie, stage, group, payload = heapq.heappop(self.heap)
            if time.monotonic() > self.deadline:
                self.timed_out = True
                self.prune(stage, group, payload, "search_time_limit")
            elif lower > self.ranking.threshold_s:
                self.prune(stage, group, payload)
            else:
                self.advance(lower, tie, stage, group, payload)

    def prune(self, stage: int, group: Group | None, payload, reason: str = "time_lower_bound") -> None:
        """Count everything an entry stands for as pruned for `reason`."""
        if stage == FAMILY:
            sp, overlap, facts = payload
            copies = len(self.opts.recompute_modes)
            batch, alike = self.request.global_batch_size, {}  # counted once per (pp, pp | m, orders)
            for fact in facts:
                for mbs in self.space.group_options(fact)[0]:
                    m = batch // (fact.dp * mbs)
                    entry = alike.setdefault((fact.pp, m % fact.pp == 0, len(self.space.orders(fact))), [fact, m, 0])
                    entry[2] += copies
            for fact, m, count in alike.values():
                self.space.prune_members(fact, m, reason, count)
                self.done(count)
        elif stage == SHAPE:
            self.space.prune_groups(payload, reason)
            self.done(len(payload))
        elif stage <= VISIT:
            self.space.prune_group(group, reason)
            self.done(1)
        else:
            self.space.pruned[reason] += 1

    def advance(self, lower: float, tie: tuple, stage: int, group: Group | None, payload) -> None:
        def push(*entry):
            heapq.heappush(self.heap, entry)

        if stage == FAMILY:
            sp, overlap, facts = payload
            for (mbs, multi), groups in self.floors.shapes(*payload).items():
                shape_tie = (0, facts[0].tp, facts[0].cp, facts[0].ep, mbs, multi, int(sp), overlap)
                push(max(lower, self.floors.shape_lower(groups[0])), shape_tie, SHAPE, None, groups)
        elif stage == SHAPE:
            for each in payload:
                push(max(lower, self.floors.time(each)), _group_tie(each), GROUP, each, None)
        elif stage == GROUP:
            floor = self.floors.coupled_floor(group)
            if floor < np.inf:
                push(max(lower, floor), tie, COUPLE, group, None)
            else:  # no (variant, ZeRO stage) fits on every rank
                self.memory_pruned(group)
                self.done(1)
        elif stage == COUPLE:
            coupled = self.floors.coupled(group, self.space.rules.zero_stages(group.fact.pp))
            if coupled:
                push(max(lower, self.floors.placed_floor(group, coupled)), tie, COUPLED, group, coupled)
            else:
                self.memory_pruned(group)
                self.done(1)
        elif stage == COUPLED:
            bounds = self.floors.pp_refined(group, payload)
            push(max(lower, bounds[0][0]), tie, PLACED, group, bounds)
        elif stage == PLACED:
            push(max(lower, self.floors.dp_refined(group, payload)), tie, VISIT, group, None)
        elif stage == VISIT:
            self.visit_group(group, tie)
            self.done(1)
        elif stage == MEMBER:
            vpp, schedule, zero, order = payload
            cand = self.candidate(group, zero_stage=zero, schedule=schedule, vpp=vpp, axis_order=order)
            dp_s = min(self.members.dp_exposed_s(group, each) for each in self.compressions(cand))
            push(lower + dp_s, tie, EVALUATE, group, cand)
        else:
            self.visit(payload)

    def done(self, groups: int) -> None:
        """Count groups finished (pruned or visited) for the progress callback."""
        before, self.groups_done = self.groups_done, self.groups_done + groups
        if self.progress is not None and (before // 64 != self.groups_done // 64 or self.groups_done == self.groups_total):
            self.progress(self.groups_done, self.groups_total)

    # ---- phase 2: the members of a group (planner.search.members) -----------------------------------------
    def visit_group(self, group: Group, tie: tuple) -> None:
        """Members by (schedule, vpp) variant, ZeRO stage and axis order: with `exhaustive` every one evaluated,
        else those within the threshold pushed on the heap with their bound (tie-break `tie` + the member)."""
        for schedule, vpp, count in self.space.variants(group):
            arrays = self.members.order_arrays(group, vpp) if not self.exhaustive else None
            if arrays is None:
                for zero in self.opts.zero_stages:
                    for order in self.space.orders(group.fact):
                        self.visit(self.candidate(group, zero_stage=zero, schedule=schedule, vpp=vpp, axis_order=order))
            elif self.cost.validity_reasons(self.candidate(group, schedule=schedule, vpp=vpp)):
                for zero in self.opts.zero_stages:  # every member invalid for the same reasons: counted by visit
                    for order, _ in arrays:
                        self.visit(self.candidate(group, zero_stage=zero, schedule=schedule, vpp=vpp, axis_order=order))
            else:
                self.members.expand(group, schedule, vpp, count, arrays,
                                    lambda lower, member: heapq.heappush(self.heap, (lower, (*tie, *member), MEMBER, group, member)))

    def variant_bound(self, group: Group, schedule: str, vpp: int) -> float:
        """Bound (3) of every member of one (schedule, vpp) variant (x = 0), the least over the axis orders."""
        arrays = self.members.order_arrays(group, vpp)
        return min(lower for lower, _, _ in self.members.variant_bounds(group, schedule, vpp, arrays))

    def visit(self, cand) -> None:
        """Evaluate one member: each of its compression variants, the one compression_space.pick keeps standing for it."""
        items, refused = [], None
        for each in self.compressions(cand):
            config = config_of(each, model=self.request.model, precision=self.request.precision)
            refused = refusal(self.opts.profile, config, allow_stale_weights=self.opts.allow_stale_weights)
            if refused is not None:
                continue
            reasons = self.cost.validity_reasons(each)
            if reasons:
                self.space.pruned[_slug(reasons[0])] += 1
                return
            items.append(self.evaluate(each))
        if not items:
            self.space.pruned[refused[0]] += 1
            return
        item = compression_space.pick(items, margin=self.cost.cal.ranking_band or 0.0)
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
        partial full recompute per stage that makes every rank fit at the least extra time (refine.py), unless the
        candidate is priced with the stack's MoE overlap, which a full recompute turns off (arrays.moe_batch_overlap)."""
        self.counters.evaluations += 1
        if self.partial_ok and cand.recompute != "full" and not moe_batch_overlap(self.cost, cand):
            split = split_for(self.request.model.num_layers, cand, self.request.model.mtp_num_layers)
            lc = self.cost.layer_costs(cand)
            excess = rank_excess_bytes(self.cost, cand, lc, split)
            if max(excess) > 0:
                left_s = max(0.1, self.deadline - time.monotonic())  # the ILP gets what is left of the search's time
                counts = partial_recompute(self.cost, cand, lc, split, self.counters, left_s, excess)
                if counts is not None and any(counts):
                    ev = self.cost.evaluate(cand, stage_layers=split, full_recompute_layers=counts)
                    if ev.fits:
                        return Scored(rank_key(cand, ev), cand, ev, split, counts)
        ev = self.cost.evaluate(cand)
        return Scored(rank_key(cand, ev), cand, ev)


def _group_tie(group: Group) -> tuple:
    f = group.fact
    return (f.tp, f.pp, f.cp, f.ep, f.dp, -group.microbatch_size, group.recompute, group.sp, group.tp_overlap)


def _slug(reason: str) -> str:
    """A `pruned` key from a validity reason: its words before the first ':' or '=' digits, snake_cased."""
    head = reason.split(":")[0].strip().lower()
    words = [w for w in "".join(c if c.isalnum() else " " for c in head).split() if not w.isdigit()]
    return "_".join(words[:8]) or "invalid"


def search(request: PlanRequest, *, fixed: Mapping[str, int] | None = None, progress: ProgressFn | None = None,
           exhaustive: bool = False, cost=None, opts: Options | None = None, ceiling_s: float | None = None,
           framework: FrameworkProfile | None = None) -> SearchResult:
    """Run the search; `exhaustive=True` turns every bound off (the reference the tests compare against). `opts`
    replaces the request's space (planner.search.practice narrows it); `ceiling_s` prunes every configuration
    slower than it from the start. `framework`: the request's stack profile as resolved where the request entered
    (planner.api); else the one of `opts` or `cost`, else read here by its name, once: the space and the cost model
    share the object."""
    from planner.search.refine_top import refine_top

    if framework is None:
        framework = opts.profile if opts is not None else cost.framework if cost is not None else load_framework(request.framework)
    cost = cost if cost is not None else make_cost_model(request, framework)
    opts = opts if opts is not None else Options.from_request(request, fixed, framework)
    state = _Search(request, cost, opts, exhaustive=exhaustive, progress=progress)
    if ceiling_s is not None:
        state.ranking.ceiling_s = ceiling_s
    state.run()
    ranked = refine_top(state, state.ranking.items)
    return SearchResult(
        ranked=ranked, closest=state.closest, pruned=state.space.pruned, considered=state.space.considered,
        evaluated=state.evaluated, counters=state.counters, memory_floor=state.floor, capacity_bytes=state.capacity,
        opts=opts, timed_out=state.timed_out,
    )


__all__ = ["search", "SearchResult", "make_cost_model"]
