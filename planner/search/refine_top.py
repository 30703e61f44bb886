"""Refinement of the search's winners with the stage-partition DP and the joint assignment ILP.

The branch and bound evaluates balanced stages. With vpp > 1 the stack's uneven forms are tried
(planner.search.refine_uneven: the embedding/loss counted as layers, fewer layers on the first and last ranks).
For the best few configurations with pp > 1 and vpp = 1 the
DP (planner.search.partition) re-splits the layers to minimise the slowest stage under each stage's own memory
(the embedding and LM head make the end stages heavier; 1F1B's first stage holds pp micro-batches, the last one);
when no split fits with the base recompute, ILP (B) (planner.search.ilp) chooses the split and the fully
recomputed layers together. A refined split replaces the balanced one only when `evaluate` predicts it faster
(or equal and lighter), so refinement never makes a plan worse under the cost model. Refinement counts against
the search's time limit: past it, the remaining winners keep their balanced split (and the plan says so).
"""

from __future__ import annotations

import time

from planner.cost.arrays import moe_batch_overlap
from planner.errors import InfeasibleError
from planner.search.outcome import Scored, rank_key
from planner.search.refine import dp_split, stage_problem
from planner.search.refine_uneven import refine_interleaved

ILP_B_MAX_BINARIES = 400  # n_layers * pp; CBC's time grows quickly beyond (the DP covers the rest)


def refine_top(state, items: list[Scored]) -> list[Scored]:
    """Refined copies of `items`, re-ranked; items that cannot be refined are kept as they are."""
    out = [_refine(state, item) for item in items]
    return sorted(out)


def _refine(state, item: Scored) -> Scored:
    cand = item.cand
    if cand.pp == 1:
        return item
    if time.monotonic() > getattr(state, "deadline", float("inf")):
        state.timed_out = True
        return item
    if cand.vpp > 1:  # the stack's uneven first/last and embedding/loss forms (planner.search.refine_uneven)
        return refine_interleaved(state, item) if item.full_recompute_layers is None else item
    cost, counters = state.cost, state.counters
    lc = cost.layer_costs(cand)
    problem = stage_problem(cost, cand, lc)
    counters.dp_calls += 1
    found = dp_split(problem)
    best = item
    if found is not None:
        best = _better(best, _evaluate(state, cand, found, None))
    elif (state.partial_ok and cand.recompute != "full" and not moe_batch_overlap(cost, cand)
          and problem.num_layers * cand.pp <= ILP_B_MAX_BINARIES):  # a full recompute turns the MoE overlap off
        best = _better(best, _joint(state, cand, lc, problem))
    return best


def _joint(state, cand, lc, problem) -> Scored | None:
    from planner.search.ilp import solve_assignment

    state.counters.ilp_calls += 1
    try:
        assignment = solve_assignment(
            problem, lc.full_recompute_s[1:-1], lc.full_recompute_activation_bytes[1:-1],
            time_limit_s=min(max(0.1, getattr(state, "deadline", 0.0) - time.monotonic()), 10.0),
        )
    except InfeasibleError:
        return None
    return _evaluate(state, cand, assignment.layers_per_stage, assignment.recompute_per_stage)


def _evaluate(state, cand, stage_layers, full_recompute) -> Scored | None:
    ev = state.cost.evaluate(
        cand, stage_layers=tuple(stage_layers), full_recompute_layers=tuple(full_recompute) if full_recompute else None
    )
    state.counters.evaluations += 1
    if not ev.fits:
        return None
    return Scored(rank_key(cand, ev), cand, ev, tuple(stage_layers), tuple(full_recompute) if full_recompute else None)


def _better(current: Scored, new: Scored | None) -> Scored:
    return new if new is not None and new.key < current.key else current
