"""SearchResult -> LaunchPlan (kind "plan"): the winner through planner.plan.build_launch_plan, plus the
alternatives with why they lost, the pruned counts and the solver statistics. Nothing wall-clock goes in, so the
same request gives the same bytes.
"""

from __future__ import annotations

import planner
from planner.schemas.plan import Alternative, LaunchPlan, PlanRequest, SolverStats
from planner.search.outcome import Scored, why_not

SEARCH_VERSION = "search-1"


def space_notes(result) -> list[str]:
    """What the space allowed and how the winner was refined (deterministic text)."""
    opts = result.opts
    notes = [
        f"space for framework {opts.profile.name} ({opts.profile.versions}): dp x tp x pp x cp = gpus with tp dividing "
        f"gpus_per_node (TP inside a node), ep dividing {opts.profile.capabilities.expert_parallel.span.replace('_', '*')} "
        f"for MoE, what the framework runs (`planner framework show {opts.profile.name}`), "
        f"microbatch_size up to {opts.max_microbatch_size}, zero {list(opts.zero_stages)}, recompute {list(opts.recompute_modes)} "
        f"(+ partial full recompute per stage), schedules {list(opts.schedules)}, tp_overlap {list(opts.tp_overlap)}, "
        "axis orders with tp innermost" + ("; PipeDream-2BW allowed (one-step-stale weights)" if opts.allow_stale_weights else ""),
        "ranking: step time, then peak memory, then smaller tp, pp, cp, ep, dp, vpp, zero, larger microbatch",
    ]
    if opts.fixed:
        notes.append("fixed by the request: " + ", ".join(f"{k}={v}" for k, v in sorted(opts.fixed.items())))
    if getattr(result, "timed_out", False):
        notes.append("the search reached its time limit: this is the best plan found by then, not proven the fastest; "
                     "raise the time limit (--time-limit, time_limit_s) for the full search")
    return notes


def placement_note(cost, best: Scored, profile=None) -> str | None:
    """Topology-aware placement: the winner under every axis order of the space (tp innermost), by step time; for a
    stack with a fixed rank order (profile capabilities.rank_order) the note says the plan follows it."""
    import dataclasses

    from planner.search.space import axis_orders

    c = best.cand
    fixed = profile.capabilities.rank_order if profile is not None else None
    if fixed is not None:
        return (f"placement: ranks laid out as framework {profile.name!r} builds them, {'>'.join(fixed.axes)} outermost "
                f"first ({fixed.native}); links priced in that order")
    orders = axis_orders(c)
    if len(orders) < 2:
        return None
    timed = []
    for order in orders:
        ev = cost.evaluate(dataclasses.replace(c, axis_order=order), stage_layers=best.stage_layers,
                           full_recompute_layers=best.full_recompute_layers)
        timed.append((ev.step_time_s, order))
    timed.sort()
    base = timed[0][0]
    parts = [f"{'>'.join(o)} {t:.4g} s" + (f" (+{100 * (t - base) / base:.1f}%)" if t > base else "") for t, o in timed]
    return "placement (axis order, outermost first) compared by predicted step time: " + "; ".join(parts)


def assemble(request: PlanRequest, result, preference=None) -> LaunchPlan:
    """The plan of the best configuration of `result` (which must have one); `preference` is the practice rule's
    decision (planner.search.practice): its note, and the why-not of the fastest plan when another was chosen."""
    from planner.cost.notes import model_notes
    from planner.plan import batch_of, build_launch_plan, parallelism_of
    from planner.search.costing import make_cost_model

    best, rest = result.ranked[0], result.ranked[1:]
    cost = make_cost_model(request, result.opts.profile)  # a fresh model: its notes name the winner's shapes only
    ev = cost.evaluate(best.cand, stage_layers=best.stage_layers, full_recompute_layers=best.full_recompute_layers)
    alternatives = [
        Alternative(parallelism=parallelism_of(o.cand), batch=batch_of(request, o.cand), schedule=o.cand.schedule,
                    recompute=o.cand.recompute, recompute_modules=o.cand.recompute_modules,
                    step_time_s=o.ev.step_time_s, peak_bytes=int(o.ev.peak_bytes),
                    why_not=(preference and preference.why_not(o)) or why_not(best, o))
        for o in rest
    ]
    solver = SolverStats(
        configurations_considered=result.considered, configurations_evaluated=result.evaluated,
        ilp_calls=result.counters.ilp_calls, dp_calls=result.counters.dp_calls,
        version=f"planner {planner.__version__} {SEARCH_VERSION}",
    )
    placement = placement_note(cost, best, result.opts.profile)
    notes = [*model_notes(cost), *space_notes(result), *([placement] if placement else []),
             *([preference.note()] if preference is not None else [])]
    return build_launch_plan(
        cost, best.cand, ev, kind="plan", notes=notes,
        alternatives=alternatives, pruned=dict(sorted(result.pruned.items())), solver=solver,
    )

