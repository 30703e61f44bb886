"""The search's entry point: plan(request), the runs of the search (planner.search.driver.search) that make one plan.

The driver searches one space; a plan may take several searches: the request's own space, one more per recompute
module set of the stack (module_sets, for MoE models; the results merged), and, when the fastest plan leaves the
stack's practice, one over that practice (prefer_practice, planner.search.practice). Here the searches are run in
that order under the request's one time limit, the outcome turned into a LaunchPlan (planner.search.assemble), or
into InfeasibleError / SolverTimeoutError when nothing fits. Kept apart from the driver so that the branch and
bound and the orchestration around it each have one home.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping

from planner.cost.validity import module_reasons
from planner.errors import InfeasibleError, SolverTimeoutError
from planner.frameworks import load_framework
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import LaunchPlan, PlanRequest, SearchLimits
from planner.search.costing import make_cost_model
from planner.search.driver import ProgressFn, SearchResult, search
from planner.search.outcome import Scored, infeasible_message


def plan(request: PlanRequest, *, progress: ProgressFn | None = None, fixed: Mapping[str, int] | None = None,
         framework: FrameworkProfile | None = None) -> LaunchPlan:
    """The fastest plan that fits (or, within the ranking band, the best inside the stack's practice:
    planner.search.practice), as a LaunchPlan; InfeasibleError (exit 1) saying how far the closest is.
    `framework`: the request's stack profile, resolved once by the caller (planner.api), else read here by name."""
    started = time.monotonic()
    framework = framework if framework is not None else load_framework(request.framework)
    cost = make_cost_model(request, framework)
    result = search(request, fixed=fixed, progress=progress, cost=cost, framework=framework)
    limits = request.search or SearchLimits()
    for modules in module_sets(request, framework):  # the stack's recompute module sets, each searched on its own
        left = limits.time_limit_s - (time.monotonic() - started)
        narrow = limits.model_copy(update={"recompute_modules": modules, "recompute_modes": ("selective",),
                                           "time_limit_s": max(left, 0.01)})
        result = merged(result, search(request.model_copy(update={"search": narrow}), fixed=fixed, cost=cost,
                                       framework=framework), limits.top_k + 1)
    if not result.ranked and result.timed_out:
        raise SolverTimeoutError(
            f"the search reached its time limit of {limits.time_limit_s:g} s ({result.evaluated:,} configurations evaluated, "
            f"none fitting yet): raise --time-limit (time_limit_s), fix --tp/--pp, or use more GPUs")
    if not result.ranked:
        message, shortfall, closest = infeasible_message(
            gpus=request.gpus, gpus_per_node=request.topology.gpus_per_node, capacity_bytes=result.capacity_bytes,
            closest=result.closest, floor=result.memory_floor, zero_stages=tuple(limits.zero_stages),
            recompute_modes=tuple(limits.recompute_modes), seq_len=request.seq_len, pruned=dict(result.pruned),
        )
        raise InfeasibleError(message, closest=closest, shortfall_bytes=shortfall)
    from planner.search.assemble import assemble

    preference = None
    if limits.prefer_practice and not result.timed_out:
        result, preference = prefer_practice(request, result, cost, limits.time_limit_s - (time.monotonic() - started))
    return assemble(request, result, preference)


def module_sets(request: PlanRequest, framework: FrameworkProfile) -> list[tuple[str, ...]]:
    """The recompute module sets the search tries beside the stack's own selective (capabilities.recompute
    .module_sets, for MoE models), each without the modules the model lacks (planner.cost.validity.module_reasons),
    distinct and not empty; none where the request names its own modules or leaves selective out."""
    limits = request.search or SearchLimits()
    if request.model.moe is None or limits.recompute_modules or "selective" not in limits.recompute_modes:
        return []
    found: list[tuple[str, ...]] = []
    for wanted in framework.capabilities.recompute.module_sets:
        kept = tuple(m for m in wanted if not module_reasons(request.model, (m,)))
        if kept and kept not in found:
            found.append(kept)
    return found


def merged(first: SearchResult, second: SearchResult, size: int) -> SearchResult:
    """Two searches of disjoint spaces as one: the best `size` plans of both, the closest of the second where the
    first has none, the counts added (configurations_considered stays the fitting ones plus the pruned)."""
    ranked = sorted(first.ranked + second.ranked)[:size]
    closest = first.closest if first.closest is not None else second.closest
    return dataclasses.replace(first, ranked=ranked, closest=closest, pruned=first.pruned + second.pruned,
                               considered=first.considered + second.considered,
                               evaluated=first.evaluated + second.evaluated, timed_out=first.timed_out or second.timed_out)


def prefer_practice(request: PlanRequest, result: SearchResult, cost, time_left_s: float):
    """(result, Preference | None): planner.search.practice's rule applied to the ranked plans; a second search
    over the stack's practice, pruned beyond the fastest plan's step time x (1 + ranking band), when the fastest
    leaves it. No band (a device family without published runs): no preference."""
    from planner.search import practice

    band = cost.cal.ranking_band
    narrow = practice.practice_options(result.opts)
    if band is None or narrow is None:
        return result, None
    fastest = result.ranked[0]
    inside: list[Scored] = []
    layers, timed_out = request.model.num_layers, False
    if practice.deviations(fastest.cand, result.opts, layers):
        limits = (request.search or SearchLimits()).model_copy(update={"time_limit_s": max(time_left_s, 0.01), "top_k": 0})
        again = search(request.model_copy(update={"search": limits}), cost=cost, opts=narrow,
                       ceiling_s=fastest.ev.step_time_s * (1 + band))
        timed_out = again.timed_out
        inside = [] if timed_out else again.ranked
    ranked, decision = practice.choose(result.ranked, inside, band=band, opts=result.opts, num_layers=layers,
                                       calibration=practice.calibration_name(cost.cal), timed_out=timed_out)
    return dataclasses.replace(result, ranked=ranked), decision


__all__ = ["plan", "module_sets", "merged", "prefer_practice"]
