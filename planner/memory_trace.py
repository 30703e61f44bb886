"""A plan's memory verified by the executor's own step (issue 20, item 2): the search prices candidates by the
formulas; this traces the chosen plan (and each alternative it lists) with planner.executor.memtrace, records the
traced peak in the LaunchPlan (`memory.traced`, `alternatives[].traced_peak_bytes`), and replaces a chosen plan whose
traced peak does not fit by the next plan of the search's ranking whose traced peak does (verify_plan). `planner plan` does this by default for the `planner` stack (api.plan(trace_memory=
None): on for that stack, off for the others, whose peaks are not our code's); `--no-trace-memory` skips it,
`planner estimate --trace-memory` asks for it. Plans made without it are unchanged.

Each rank is traced with 2 and 3 decoder layers per stage (and, for a pipeline, two micro-batch counts past its
warm-up) and extended linearly to its real depth (planner.executor.memtrace_scale: within 0.25% of full traces on the
tested plans): seconds at the real widths. A time budget (TRACE_BUDGET_S) bounds the verification of one plan request: plans
left when it runs out say they were not verified.

Only the `planner` stack runs our executor, so only its plans are traced. torch is imported here only when a trace
is asked for (the planner core stays torch-free); without torch the plan says it was not verified by trace. A step the
fake tensors cannot follow (MoE routing's data-dependent shapes: planner.executor.memtrace) is said the same way,
with the reason.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable

from planner.schemas.plan import Configuration, LaunchPlan, TracedMemory, TracedRank

EXECUTOR_FRAMEWORK = "planner"
TRACE_BUDGET_S = 120.0  # seconds of tracing for one request's plans at most (a plan is a few seconds: module docstring)


def trace_memory(plan: LaunchPlan, *, deadline: float | None = None) -> TracedMemory:
    """The traced peak of every distinct rank of `plan`, or a note saying why there is none. `deadline`
    (time.monotonic()): past it, the plan is not traced and says so."""
    if plan.request.framework != EXECUTOR_FRAMEWORK:
        return TracedMemory(note=f"not verified by trace: framework {plan.request.framework!r} is not the executor's (planner)")
    if importlib.util.find_spec("torch") is None:
        return TracedMemory(note="not verified by trace: torch not installed (pip install 'llm-planner[torch]')")
    if deadline is not None and time.monotonic() > deadline:
        return TracedMemory(note=f"not verified by trace: the {TRACE_BUDGET_S:.0f} s budget of tracing was spent on "
                                 "the plans before it")
    from planner.executor.memtrace_scale import scalable, trace_plan_scaled
    from planner.executor.moe_contract import ROUTING_NOTE

    try:
        traces = trace_plan_scaled(plan, target=target_of(plan))
    except Exception as exc:  # the fake tensors could not follow this step: say so, keep the formula's verdict
        first = (str(exc).splitlines() or [""])[0][:160]
        return TracedMemory(note=f"not verified by trace: the fake-tensor trace cannot follow this step ({type(exc).__name__}: {first})")
    ranks = tuple(TracedRank(rank=t.rank, pp_rank=t.coords.get("pp", 0), peak_bytes=t.peak_bytes,
                             **{f"{part}_bytes": t.parts[part] for part in t.parts}) for t in traces)
    peak = max(r.peak_bytes for r in ranks)
    fits = peak <= plan.memory.capacity_bytes
    how = ("CUDA contracts, allocator rounding and cuBLAS workspace included" if target_of(plan) == "cuda"
           else "CPU tensors as allocated")
    scaled = (", each extended linearly from stages of 2 and 3 layers (planner.executor.memtrace_scale)"
              if scalable(plan) else "")
    routing = f"; {ROUTING_NOTE}" if plan.request.model.moe is not None else ""
    return TracedMemory(peak_bytes=peak, fits=fits, ranks=ranks, note=(
        f"traced by planner.executor.memtrace: the executor's step on fake tensors, {len(ranks)} distinct rank(s)"
        f"{scaled}, {how}{routing}; {'fits' if fits else 'does NOT fit'} in {plan.memory.capacity_bytes / 2**30:.2f} GiB"))


def target_of(plan: LaunchPlan) -> str:
    """"cpu" for a CPU topology (loopback fabric: the executor runs gloo on CPU processes), else "cuda" (the CUDA
    contracts, rounding and workspace of planner.executor.memtrace)."""
    return "cpu" if plan.request.topology.intra_node.kind == "loopback" else "cuda"


def with_trace(plan: LaunchPlan, traced: TracedMemory) -> LaunchPlan:
    return plan.model_copy(update={"memory": plan.memory.model_copy(update={"traced": traced})})


MAX_TRACED_PLANS = 8  # plans traced at most while looking for one that fits (each trace takes seconds)


TIGHTER_SEARCHES = 2  # searches with less memory (by the trace's measure of the formula) after the ranking fails


def verify_plan(plan: LaunchPlan, *, wider: Callable[[float], LaunchPlan] | None = None) -> LaunchPlan:
    """`plan` with its traced memory and its alternatives'. A chosen plan that does not fit by trace is replaced by
    the first plan in the search's ranking that does: its listed alternatives, then (when none fits) the ranking of
    `wider(1)` (the same search keeping more alternatives), then of `wider(r)`: the search with the device's usable
    memory divided by r, the least traced/formula ratio of the plans traced over capacity (the formula under-counts
    the executor's memory by at least that much there), TIGHTER_SEARCHES times at most; up to MAX_TRACED_PLANS traces. InfeasibleError when none
    fits. A plan that could not be traced keeps the formula's verdict, with the note saying so. The tracing of one call
    stops after TRACE_BUDGET_S (the plans left say so)."""
    deadline = time.monotonic() + TRACE_BUDGET_S
    traced = trace_memory(plan, deadline=deadline)
    seen = {_key(plan): (plan.memory.peak_bytes, traced)}  # configuration -> (formula peak, traced)
    alternatives = tuple(_traced_alternative(plan, alt, seen, deadline) if traced.peak_bytes is not None else alt
                         for alt in plan.alternatives)
    checked = with_trace(plan, traced).model_copy(update={"alternatives": alternatives})
    if traced.fits is not False:
        return checked
    replacement = _first_fitting(plan, list(plan.alternatives), seen, deadline)
    if replacement is None and wider is not None:
        replacement = _search_fitting(plan, seen, deadline, wider)
    if replacement is None:
        from planner.errors import InfeasibleError

        spent = f"; the {TRACE_BUDGET_S:.0f} s budget of tracing ran out" if time.monotonic() > deadline else ""
        raise InfeasibleError(
            f"the search's first choice ({_describe(plan)}) traced {traced.peak_bytes / 2**30:.2f} GiB over the "
            f"{plan.memory.capacity_bytes / 2**30:.2f} GiB capacity, and no plan of its ranking fits by trace "
            f"({len(seen)} traced, planner.executor.memtrace{spent}): use a smaller --microbatch-size, --recompute full or "
            "more GPUs",
            closest=_describe(plan), shortfall_bytes=traced.peak_bytes - plan.memory.capacity_bytes)
    alt_plan, alt_traced = replacement
    note = (f"the search's first choice ({_describe(plan)}) traced {traced.peak_bytes / 2**30:.2f} GiB, over the "
            f"{plan.memory.capacity_bytes / 2**30:.2f} GiB capacity: replaced by the next plan of its ranking that fits by "
            f"trace ({_describe(alt_plan)}, {alt_traced.peak_bytes / 2**30:.2f} GiB)")
    rest = tuple(a for a in alternatives if _key(a) != _key(alt_plan))
    return with_trace(alt_plan, alt_traced).model_copy(update={
        "kind": plan.kind, "alternatives": rest, "pruned": plan.pruned, "solver": plan.solver, "notes": (*plan.notes, note)})


def verify_searched(plan: LaunchPlan, search: Callable) -> LaunchPlan:
    """verify_plan for a plan the search made: `search(request)` (planner.search.entry.plan) gives the wider
    rankings (the same request keeping the most alternatives; with less usable memory) a plan that does not fit by
    trace falls back on."""
    from planner.schemas import limits
    from planner.schemas.plan import SearchLimits

    request = plan.request
    wider = request.model_copy(update={"search": (request.search or SearchLimits()).model_copy(
        update={"top_k": limits.MAX_TOP_K})})

    def ranking(shrink: float) -> LaunchPlan:
        device = wider.topology.device
        usable = device.memory_bytes - device.reserved_memory_bytes
        smaller = device.model_copy(update={"reserved_memory_bytes": device.memory_bytes - int(usable / shrink)})
        return search(wider.model_copy(update={"topology": wider.topology.model_copy(update={"device": smaller})}))

    return verify_plan(plan, wider=ranking)


def _search_fitting(plan: LaunchPlan, seen: dict, deadline: float, wider: Callable[[float], LaunchPlan]):
    """(plan, traced) of the first plan that fits by trace in the wider rankings (verify_plan), or None."""
    from planner.errors import InfeasibleError

    shrink = 1.0
    for _ in range(1 + TIGHTER_SEARCHES):
        try:
            broader = wider(shrink)
        except InfeasibleError:  # nothing fits the smaller memory by the formula
            return None
        before = set(seen)
        found = _first_fitting(plan, [_as_alternative(broader), *broader.alternatives], seen, deadline)
        ratios = [t.peak_bytes / f for key, (f, t) in seen.items() if t.fits is False and f > 0
                  and (key not in before or shrink == 1.0)]  # this round's measure of the formula (all, the first)
        if found is not None or not ratios or time.monotonic() > deadline or min(ratios) <= shrink:
            return found
        shrink = min(ratios)
    return None


def _key(item) -> tuple:
    """A plan's or an alternative's configuration."""
    recompute = item.recompute if hasattr(item, "recompute") else item.stages[0].recompute.mode
    return item.parallelism, item.batch, item.schedule, recompute


def _estimate_of(plan: LaunchPlan, alt) -> LaunchPlan | None:
    from planner.estimate import estimate

    config = Configuration(parallelism=alt.parallelism, microbatch_size=alt.batch.microbatch_size, schedule=alt.schedule,
                           recompute=alt.recompute)
    try:
        return estimate(plan.request, config)
    except Exception:  # an alternative the estimate refuses cannot replace the plan
        return None


def _traced_alternative(plan: LaunchPlan, alt, seen: dict, deadline: float):
    alt_plan = _estimate_of(plan, alt)
    if alt_plan is None:
        return alt
    if _key(alt) not in seen:
        seen[_key(alt)] = (alt_plan.memory.peak_bytes, trace_memory(alt_plan, deadline=deadline))
    return alt.model_copy(update={"traced_peak_bytes": seen[_key(alt)][1].peak_bytes})


def _first_fitting(plan: LaunchPlan, ranking: list, seen: dict, deadline: float):
    """(plan, traced) of the first configuration of `ranking` that fits by trace, or None. A configuration whose
    formula peak, scaled by the least traced/formula ratio of the plans traced over capacity so far, exceeds the
    capacity is passed over untraced (even the most favourable correction of the formula by the trace says it would
    not fit either)."""
    capacity = plan.memory.capacity_bytes
    for alt in ranking:
        ratios = [t.peak_bytes / f for f, t in seen.values() if t.fits is False and f > 0]
        if _key(alt) not in seen and ratios and alt.peak_bytes * min(ratios) > capacity:
            continue
        alt_plan = _estimate_of(plan, alt)
        if alt_plan is None or not alt_plan.feasible:
            continue
        if _key(alt) not in seen:
            if len(seen) >= MAX_TRACED_PLANS:
                return None
            seen[_key(alt)] = (alt_plan.memory.peak_bytes, trace_memory(alt_plan, deadline=deadline))
        if seen[_key(alt)][1].fits:
            return alt_plan, seen[_key(alt)][1]
    return None


def _as_alternative(plan: LaunchPlan):
    from planner.schemas.plan import Alternative

    return Alternative(parallelism=plan.parallelism, batch=plan.batch, schedule=plan.schedule,
                       recompute=plan.stages[0].recompute.mode, step_time_s=plan.prediction.step_time_s,
                       peak_bytes=plan.memory.peak_bytes, why_not="")


def _describe(plan: LaunchPlan) -> str:
    par, batch = plan.parallelism, plan.batch
    return (f"dp={par.dp} tp={par.tp} pp={par.pp} zero={par.zero_stage} micro-batch {batch.microbatch_size} "
            f"recompute {plan.stages[0].recompute.mode}")
