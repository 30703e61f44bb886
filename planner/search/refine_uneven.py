"""Uneven interleaved chunks for the search's winners with vpp > 1 (the stage-partition DP covers vpp = 1).

With pp x vpp chunks a pipeline rank's time and memory are sums over its vpp chunks, so the per-stage DP does not
apply (planner.search.partition). The embedding and the LM head make ranks 0 and pp-1 the slowest under equal
chunks; the stacks' own remedies are few and spelled by flags: the embedding and/or the loss counted as a layer
(Megatron's --account-for-embedding/loss-in-pipeline-split, torchtitan's first/last_stage_less_layers), and fewer
layers on the first and last pipeline ranks (--decoder-first/last-pipeline-num-layers; every first/last count at or
below the middle ranks' that Megatron's rule accepts). `candidate_splits` lists those forms the stack runs
(planner.frameworks_split: the forms a stack without a layout lists, the same forms for a stack with one), each
judged by split_refusal; `refine_interleaved` evaluates them and keeps the best, replacing the balanced split
only when `evaluate` predicts it faster (or equal and lighter), as refine_top does for the DP.
"""

from __future__ import annotations

from planner.frameworks_split import balanced_split, interleaved_forms, split_refusal
from planner.schemas.framework import FrameworkProfile
from planner.search.outcome import Scored, rank_key
from planner.search.refine import dp_split, stage_problem

MAX_FORMS = 64  # first/last pairs beyond this many are not tried (the search's time limit holds)


def candidate_splits(profile: FrameworkProfile, *, num_layers: int, pp: int, vpp: int) -> list[tuple[int, ...]]:
    """Splits other than the balanced one that the stack runs for pp x vpp chunks, plainest first, deduplicated."""
    split = profile.capabilities.interleaved_split
    if split.layout:  # any split is spelled; offer the forms a first/last-and-slots stack has
        permissive = split.model_copy(update=dict(embedding_slot=True, loss_slot=True, uneven_first_last=True))
        profile = profile.model_copy(update=dict(
            capabilities=profile.capabilities.model_copy(update=dict(interleaved_split=permissive))))
    balanced = balanced_split(num_layers, pp * vpp)  # an MTP spec's default differs: then it is one form more
    out: list[tuple[int, ...]] = []
    for counts in interleaved_forms(profile, num_layers=num_layers, pp=pp, vpp=vpp).values():
        if counts != balanced and counts not in out and split_refusal(
                profile, num_layers=num_layers, pp=pp, vpp=vpp, counts=counts) is None:
            out.append(counts)
    return out[:MAX_FORMS]


def tried_splits(cost, cand, profile: FrameworkProfile) -> list[tuple[int, ...]]:
    """The splits the search tries for `cand` beyond the balanced one: the stage-partition DP's for vpp = 1
    (planner.search.refine.dp_split; none when no split fits), the stack's uneven forms (candidate_splits) for
    vpp > 1; none without a pipeline. The reading of an unsaid split (benchmarks/accuracy_cases.planned_split) takes
    them from here; the search takes the same two, refine_interleaved through this and refine_top._refine through
    dp_split directly (it keeps the DP's problem for its joint-assignment ILP where the DP finds no split)."""
    if cand.pp == 1:
        return []
    if cand.vpp > 1:
        return candidate_splits(profile, num_layers=cost.spec.num_layers, pp=cand.pp, vpp=cand.vpp)
    found = dp_split(stage_problem(cost, cand, cost.layer_costs(cand)))
    return [found] if found is not None else []


def refine_interleaved(state, item: Scored) -> Scored:
    """`item` with the fastest fitting split among the stack's uneven forms (itself if none is better)."""
    cand, best = item.cand, item
    for counts in tried_splits(state.cost, cand, state.opts.profile):
        ev = state.cost.evaluate(cand, stage_layers=counts)
        state.counters.evaluations += 1
        if not ev.fits:
            continue
        scored = Scored(rank_key(cand, ev), cand, ev, counts, None)
        if scored.key < best.key:
            best = scored
    return best
