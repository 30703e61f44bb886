"""A plan's memory verified by the executor's own step (issue 20, item 2): the search prices candidates by the
formulas; this traces the chosen plan (and each alternative it lists) with planner.executor.memtrace, records the
traced peak in the LaunchPlan (`memory.traced`, `alternatives[].traced_peak_bytes`), and replaces a chosen plan whose
traced peak does not fit by the first alternative whose traced peak does.

Only the `planner` stack runs our executor, so only its plans are traced. torch is imported here only when a trace
is asked for (the planner core stays torch-free); without torch the plan says it was not verified by trace. A step the
fake tensors cannot follow (the pipeline schedules' and DDP's data-dependent host reads, MoE routing's data-dependent
shapes) is said the same way, with the reason.
"""

from __future__ import annotations

import importlib.util

from planner.schemas.plan import Configuration, LaunchPlan, TracedMemory, TracedRank

EXECUTOR_FRAMEWORK = "planner"


def trace_memory(plan: LaunchPlan) -> TracedMemory:
    """The traced peak of every distinct rank of `plan`, or a note saying why there is none."""
    if plan.request.framework != EXECUTOR_FRAMEWORK:
        return TracedMemory(note=f"not verified by trace: framework {plan.request.framework!r} is not the executor's (planner)")
    if importlib.util.find_spec("torch") is None:
        return TracedMemory(note="not verified by trace: torch is not installed (pip install 'llm-planner[torch]')")
    from planner.executor.memtrace import trace_plan

    try:
        traces = trace_plan(plan)
    except Exception as exc:  # the fake tensors could not follow this step: say so, keep the formula's verdict
        first = (str(exc).splitlines() or [""])[0][:160]
        return TracedMemory(note=f"not verified by trace: the fake-tensor trace cannot follow this step ({type(exc).__name__}: {first})")
    ranks = tuple(TracedRank(rank=t.rank, pp_rank=t.coords.get("pp", 0), peak_bytes=t.peak_bytes,
                             **{f"{part}_bytes": t.parts[part] for part in t.parts}) for t in traces)
    peak = max(r.peak_bytes for r in ranks)
    fits = peak <= plan.memory.capacity_bytes
    return TracedMemory(peak_bytes=peak, fits=fits, ranks=ranks, note=(
        f"traced by planner.executor.memtrace: the executor's step on fake tensors, {len(ranks)} distinct rank(s), "
        f"CUDA allocator rounding and cuBLAS workspace included; {'fits' if fits else 'does NOT fit'} in "
        f"{plan.memory.capacity_bytes / 2**30:.2f} GiB"))


def with_trace(plan: LaunchPlan, traced: TracedMemory) -> LaunchPlan:
    return plan.model_copy(update={"memory": plan.memory.model_copy(update={"traced": traced})})


def verify_plan(plan: LaunchPlan) -> LaunchPlan:
    """`plan` with its traced memory (and its alternatives'); a chosen plan that does not fit by trace is replaced
    by the first alternative that does, with a note; when none does, the plan is marked infeasible with the reason."""
    from planner.estimate import estimate

    traced = trace_memory(plan)
    alternatives, candidates = [], []
    for alt in plan.alternatives:
        config = Configuration(parallelism=alt.parallelism, microbatch_size=alt.batch.microbatch_size,
                               schedule=alt.schedule, recompute=alt.recompute)
        try:
            alt_plan = estimate(plan.request, config)
        except Exception:  # an alternative the estimate refuses stays as the search listed it
            alternatives.append(alt)
            continue
        alt_traced = trace_memory(alt_plan) if traced.peak_bytes is not None else TracedMemory()
        alternatives.append(alt.model_copy(update={"traced_peak_bytes": alt_traced.peak_bytes}))
        candidates.append((alt_plan, alt_traced))
    checked = with_trace(plan, traced).model_copy(update={"alternatives": tuple(alternatives)})
    if traced.fits is not False:
        return checked
    for alt_plan, alt_traced in candidates:
        if alt_traced.fits:
            note = (f"the search's first choice ({_describe(plan)}) traced {traced.peak_bytes / 2**30:.2f} GiB, over the "
                    f"{plan.memory.capacity_bytes / 2**30:.2f} GiB capacity: replaced by the next plan that fits by trace")
            rest = tuple(a for a in alternatives if not _same(a, alt_plan))
            return with_trace(alt_plan, alt_traced).model_copy(update={
                "kind": plan.kind, "alternatives": rest, "pruned": plan.pruned, "solver": plan.solver,
                "notes": (*plan.notes, note)})
    reason = (f"traced peak {traced.peak_bytes / 2**30:.2f} GiB exceeds the capacity {plan.memory.capacity_bytes / 2**30:.2f} GiB "
              "(planner.executor.memtrace), and no listed alternative fits by trace: use a smaller micro-batch, more "
              "recompute or more GPUs")
    return checked.model_copy(update={"feasible": False, "infeasible_reasons": (*plan.infeasible_reasons, reason)})


def _describe(plan: LaunchPlan) -> str:
    par, batch = plan.parallelism, plan.batch
    return (f"dp={par.dp} tp={par.tp} pp={par.pp} zero={par.zero_stage} micro-batch {batch.microbatch_size} "
            f"recompute {plan.stages[0].recompute.mode}")


def _same(alt, plan: LaunchPlan) -> bool:
    return (alt.parallelism == plan.parallelism and alt.batch == plan.batch and alt.schedule == plan.schedule
            and alt.recompute == plan.stages[0].recompute.mode)
