"""A loaded LaunchPlan re-derived from its own request and configuration, and compared field by field.

Why: planner.plan_invariants checks the plan's shape (degrees multiply to the GPU count, every layer in one
stage, ranks 0..N-1), but a plan is also a set of numbers the cost model derived from its request. Edited by
hand (a changed model hidden_size, vocab_size, precision or framework; `memory.fits: true` at 10x the capacity;
a 0-second step; a rank moved to a node the topology lacks) it used to be explained, exported and even trained
as if true (issue 24). Here the plan's configuration (degrees, micro-batch, schedule, stage split, per-stage
recompute) is checked as `planner estimate` checks a user's (the framework must run it, the model must divide
by it) and evaluated again with the request inside the plan; every derived field (stages, ranks, process
groups, memory per stage, peak, fits, the prediction and its breakdown) must come back equal within the
rounding of planner.io.canonical_json (10 significant digits; RELATIVE_TOLERANCE leaves room for float
summation order). The first difference is a BadInputError (exit 2, HTTP 422) naming the field, the value the
plan states and the value its request gives.

A plan written by another planner version (`solver.version`) may have been costed by another cost model: it is
compared within OTHER_VERSION_TOLERANCE instead (still catches a 0 s step or a 10x memory claim), and
`planner check` is the tool that reports how the numbers moved. A plan whose measured profile or framework
file is not on this machine, or whose schedule the cost model does not price, cannot be re-derived: only its
shape and the agreement of its numbers with each other are checked, and `unverified_reason` says why. (torch's
zbv, dualpipev and interleaved-zero-bubble are priced: planner.schedules.)
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

from planner.errors import BadInputError
from planner.plan_invariants import FIX, check_plan
from planner.schemas.plan import LaunchPlan

RELATIVE_TOLERANCE = 1e-6
ABSOLUTE_TOLERANCE = 1e-12  # seconds / bytes / fractions: 0 against 1e-15 from a different summation order
OTHER_VERSION_TOLERANCE = 0.5
# The derived parts of a plan, compared whole (a field added to one of them later is compared too).
DERIVED = ("batch", "stages", "ranks", "process_groups", "prediction", "memory", "feasible", "infeasible_reasons")


def rederived(plan: LaunchPlan) -> LaunchPlan:
    """The plan the cost model derives from `plan`'s request and configuration, or a BadInputError naming why
    that configuration is not one the request allows (as `planner estimate` refuses it)."""
    from planner.cost.model import CostModel
    from planner.cost.notes import candidate_of
    from planner.cost.pins import pin_reasons, pinned
    from planner.cost.stack import options_for
    from planner.cost.validity import input_reasons
    from planner.frameworks import config_of, load_framework, refusal
    from planner.plan import build_launch_plan
    from planner.schemas.plan import Configuration

    ordered = sorted(plan.stages, key=lambda stage: stage.stage)
    modes = {stage.recompute.mode for stage in ordered}
    if len({stage.recompute.modules for stage in ordered}) > 1:
        raise BadInputError("stages[*].recompute.modules: the stages name different modules, one set per plan is what the search writes")
    if len(modes) > 1:
        raise BadInputError(f"stages[*].recompute.mode: the stages state {sorted(modes)}, one mode per plan is what the search writes")
    config = Configuration(parallelism=plan.parallelism, microbatch_size=plan.batch.microbatch_size, schedule=plan.schedule,
                           recompute=modes.pop(), recompute_modules=ordered[0].recompute.modules, stage_layers=tuple(_decoder_count(stage.layers) for stage in ordered))
    request = plan.request
    cand = candidate_of(request, config)
    profile = load_framework(request.framework)  # read once: the judge and the cost model share it
    options = pinned(options_for(profile, request.precision), plan.parallelism, spec=request.model, stack=profile.name)
    model = CostModel(request, framework=profile, options=options)  # the dispatcher, overlap, flavour it records
    bad = input_reasons(request, cand)
    if bad:
        raise BadInputError("; ".join(bad))
    refused = refusal(profile, config_of(cand, model=request.model, precision=request.precision))
    if refused is not None:
        raise BadInputError(refused[1])
    reasons = [*model.validity_reasons(cand), *pin_reasons(model, cand, plan.parallelism)]
    if reasons:
        raise BadInputError("; ".join(reasons))
    evaluation = model.evaluate(cand, stage_layers=config.stage_layers,
                                full_recompute_layers=[stage.recompute.full_layers for stage in ordered])
    return build_launch_plan(model, cand, evaluation, kind=plan.kind)


def _decoder_count(layers: tuple[str, ...]) -> int:
    from planner.plan_invariants import LAYER

    return sum(1 for name in layers if LAYER.match(name))


def _leaves(value: Any, path: str) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key in sorted(value):
            yield from _leaves(value[key], f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        yield f"{path}#len", len(value)
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    else:
        yield path, value


def _same(stated: Any, derived: Any, tolerance: float) -> bool:
    numbers = (int, float)
    if isinstance(stated, numbers) and isinstance(derived, numbers) and not isinstance(stated, bool) and not isinstance(derived, bool):
        return math.isclose(stated, derived, rel_tol=tolerance, abs_tol=ABSOLUTE_TOLERANCE)
    return stated == derived


def differences(stated: LaunchPlan, derived: LaunchPlan, *, tolerance: float = RELATIVE_TOLERANCE) -> list[tuple[str, Any, Any]]:
    """(field, stated, derived) for every derived field of `stated` that `derived` does not reproduce. The traced
    memory (memory.traced, planner.memory_trace) is not the cost model's: `planner check` re-traces it."""
    a = stated.model_dump(mode="json", include=set(DERIVED), exclude={"memory": {"traced"}})
    b = derived.model_dump(mode="json", include=set(DERIVED), exclude={"memory": {"traced"}})
    left, right = dict(_leaves(a, "")), dict(_leaves(b, ""))
    return [(key, left.get(key), right.get(key)) for key in [*left, *(k for k in right if k not in left)]
            if not _same(left.get(key), right.get(key), tolerance)]


def unverified_reason(plan: LaunchPlan) -> str | None:
    """Why the plan's numbers cannot be re-derived on this machine (a file its request names is absent), or None."""
    from pathlib import Path

    from planner.schedules import NAMES

    if plan.schedule not in NAMES:  # a schedule name of a newer version
        return f"its schedule {plan.schedule!r} is run by the executor but not costed by the planner"
    if plan.request.profile is not None and not Path(plan.request.profile).expanduser().is_file():
        return f"its measured profile {plan.request.profile} is not on this machine"
    calibration = plan.request.topology.comm_calibration
    if calibration and not Path(calibration).expanduser().is_file():
        return f"its topology's comm calibration {calibration} is not on this machine"
    ref = plan.request.framework
    if ref.endswith((".yaml", ".yml", ".json")) and not Path(ref).expanduser().is_file():
        return f"its framework file {ref} is not on this machine"
    return None


def _reproduces(plan: LaunchPlan, request_changes: dict[str, Any]) -> bool:
    """Whether the plan's numbers re-derive exactly from its request with `request_changes` applied."""
    request = plan.request.model_copy(update=request_changes)
    try:
        return not differences(plan, rederived(plan.model_copy(update={"request": request})))
    except BadInputError:
        return False


def edited_request_field(plan: LaunchPlan) -> str | None:
    """Which field of the request was edited after the numbers were derived, where one value of it re-derives
    them all: a model field against the shipped preset of the same name, the precision, the framework."""
    from planner.frameworks import list_frameworks
    from planner.models import list_presets, load_preset
    from planner.schemas.plan import Precision

    req = plan.request
    if req.model.name in list_presets():
        preset = load_preset(req.model.name).model_dump()
        stated = req.model.model_dump()
        for key in sorted(k for k in preset if k != "seq_len" and preset[k] != stated.get(k)):
            if _reproduces(plan, {"model": req.model.model_copy(update={key: getattr(load_preset(req.model.name), key)})}):
                return (f"request.model.{key} is {_shown(stated.get(key))} but the plan's numbers were derived with "
                        f"{_shown(preset[key])} (preset {req.model.name})")
    for precision in Precision.__args__:
        if precision != req.precision and _reproduces(plan, {"precision": precision}):
            return f"request.precision is {req.precision!r} but the plan's numbers were derived with {precision!r}"
    for framework in list_frameworks():
        if framework != req.framework and _reproduces(plan, {"framework": framework}):
            return f"request.framework is {req.framework!r} but the plan's numbers were derived with {framework!r}"
    return None


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def claim_problems(plan: LaunchPlan) -> list[str]:
    """The plan's numbers against each other, whatever cost model wrote them: a positive step time that gives
    the stated tokens/s, the peak as the largest stage's, fits and feasible as peak <= capacity says."""
    mem, pred = plan.memory, plan.prediction
    problems = []
    if not (math.isfinite(pred.step_time_s) and pred.step_time_s > 0):
        problems.append(f"prediction.step_time_s is {_shown(pred.step_time_s)}: a step takes a positive time")
    else:
        tokens_per_s = plan.batch.global_batch_size * plan.batch.seq_len / pred.step_time_s
        if not math.isclose(pred.tokens_per_s, tokens_per_s, rel_tol=1e-6):
            problems.append(f"prediction.tokens_per_s is {_shown(pred.tokens_per_s)} but global_batch_size*seq_len/step_time_s "
                            f"is {_shown(tokens_per_s)}")
    if mem.per_stage and mem.peak_bytes != max(stage.peak_bytes for stage in mem.per_stage):
        problems.append(f"memory.peak_bytes is {mem.peak_bytes} but the largest memory.per_stage peak is "
                        f"{max(stage.peak_bytes for stage in mem.per_stage)}")
    if mem.fits != (mem.peak_bytes <= mem.capacity_bytes):
        problems.append(f"memory.fits is {str(mem.fits).lower()} but memory.peak_bytes {mem.peak_bytes} is "
                        f"{'over' if mem.peak_bytes > mem.capacity_bytes else 'within'} memory.capacity_bytes {mem.capacity_bytes}")
    if plan.feasible and not mem.fits:
        problems.append("feasible is true but memory.fits is false")
    return problems


def verify_plan(plan: LaunchPlan, *, source: str = "plan", rederive: bool = True) -> LaunchPlan:
    """`plan` itself when its shape holds, its numbers agree with each other and (`rederive`) its request
    re-derives them; else a one-line BadInputError naming the first field that differs, what the plan states and
    what its request gives. `planner check` passes rederive=False: that the numbers moved is what it reports;
    the configuration must still be one the request allows."""
    check_plan(plan, source=source)
    claims = claim_problems(plan)
    if claims:
        raise BadInputError(f"{source} is inconsistent: {claims[0]}: {FIX}")
    if unverified_reason(plan) is not None:
        return plan
    try:
        derived = rederived(plan)
    except BadInputError as exc:
        raise BadInputError(f"{source} is inconsistent: its configuration is not one its request allows: {exc}: {FIX}") from None
    if not rederive:
        return plan
    from planner import __version__

    same_version = not plan.solver.version or plan.solver.version.startswith(f"planner {__version__} ")
    found = differences(plan, derived, tolerance=RELATIVE_TOLERANCE if same_version else OTHER_VERSION_TOLERANCE)
    if found:
        edited = edited_request_field(plan)
        if edited is not None:
            raise BadInputError(f"{source} is inconsistent: {edited}: {FIX}")
        field, stated, wanted = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise BadInputError(f"{source} is inconsistent: {field.replace('#len', ' (count)')} is {_shown(stated)} but its own "
                            f"request gives {_shown(wanted)}{more} (edited, or written before a cost-model change: `planner check` "
                               f"shows what moved): {FIX}")
    return plan
