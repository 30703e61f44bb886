"""CI regression of committed plans: recompute each plan from the request inside it and compare.

A plan of kind "plan" is re-searched (planner.search.entry.plan, as `api.plan`); a plan of kind "estimate" is
re-estimated for its own configuration (planner.estimate.estimate, as `api.estimate`). A plan fails the check when
- the predicted step time got worse by more than `tolerance` (relative, default 2%),
- it no longer fits (or is no longer feasible), or
- the chosen configuration changed (degrees, batch split, schedule, stage split, recompute), unless
  `allow_change` is set.
Each result carries a readable diff (degrees, stages, memory, time) of old vs new.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from planner.errors import BadInputError, InfeasibleError
from planner.export.common import decoder_layers
from planner.io import load_file
from planner.schemas.plan import Configuration, LaunchPlan
from planner.units import GiB

Status = Literal["ok", "improved", "changed", "regressed", "no_longer_fits"]
DEFAULT_TOLERANCE = 0.02


@dataclass(frozen=True)
class Difference:
    """One compared quantity: what it is, the committed value, the recomputed value."""

    what: str
    old: str
    new: str


@dataclass(frozen=True)
class CheckResult:
    path: str
    kind: str
    status: Status
    old_step_time_s: float
    new_step_time_s: float | None
    differences: tuple[Difference, ...]
    messages: tuple[str, ...]

    @property
    def failed(self) -> bool:
        return self.status in ("regressed", "no_longer_fits", "changed")

    @property
    def relative_change(self) -> float | None:
        if self.new_step_time_s is None or self.old_step_time_s <= 0:
            return None
        return self.new_step_time_s / self.old_step_time_s - 1.0


@dataclass(frozen=True)
class CheckReport:
    tolerance: float
    allow_change: bool
    results: tuple[CheckResult, ...] = field(default_factory=tuple)

    @property
    def failed(self) -> bool:
        return any(result.failed for result in self.results)


def configuration_of(plan: LaunchPlan) -> Configuration:
    """The fixed configuration a plan describes, as `estimate` takes it (stage split included)."""
    modes = {stage.recompute.mode for stage in plan.stages}
    ordered = sorted(plan.stages, key=lambda stage: stage.stage)
    return Configuration(
        parallelism=plan.parallelism,
        microbatch_size=plan.batch.microbatch_size,
        schedule=plan.schedule,
        recompute=(mode := modes.pop() if len(modes) == 1 else "selective"),
        recompute_modules=ordered[0].recompute.modules if mode == "selective" else (),
        stage_layers=tuple(len(decoder_layers(stage.layers)) for stage in ordered),
    )


def recompute_plan(plan: LaunchPlan) -> LaunchPlan:
    """Recompute `plan` with today's cost model and search, from the request inside it.

    Calls the search and the cost model directly (what api.plan / api.estimate delegate to), not planner.api:
    api imports this module for `planner check`, and the façade sits above everything it fronts."""
    if plan.kind == "plan":
        from planner.search.entry import plan as search_plan

        if plan.memory.traced is None:
            return search_plan(plan.request)
        from planner.memory_trace import verify_searched  # a plan verified by trace is re-verified the same way

        return verify_searched(search_plan(plan.request), search_plan)
    from planner.estimate import estimate

    return estimate(plan.request, configuration_of(plan))


def _signature(plan: LaunchPlan) -> dict[str, str]:
    """The configuration as comparable strings, one per reported quantity."""
    par, batch = plan.parallelism, plan.batch
    ordered = sorted(plan.stages, key=lambda stage: stage.stage)
    return {
        "degrees": f"dp={par.dp} tp={par.tp} pp={par.pp} vpp={par.vpp} cp={par.cp} ep={par.ep} sp={par.sp} "
        f"zero={par.zero_stage} tp_overlap={par.tp_overlap}",
        "batch": f"microbatch_size={batch.microbatch_size} num_microbatches={batch.num_microbatches}",
        "schedule": plan.schedule,
        "stages (decoder layers)": str([len(decoder_layers(stage.layers)) for stage in ordered]),
        "recompute": str([f"{stage.recompute.mode}+{stage.recompute.full_layers}" for stage in ordered]),
    }


def compare(old: LaunchPlan, new: LaunchPlan) -> tuple[list[Difference], bool]:
    """All quantities side by side (degrees, stages, memory, time) and whether the configuration changed."""
    before, after = _signature(old), _signature(new)
    diffs = [Difference(what, before[what], after[what]) for what in before]
    changed = any(d.old != d.new for d in diffs)
    diffs.append(Difference("peak memory", f"{old.memory.peak_bytes / GiB:.2f} GiB", f"{new.memory.peak_bytes / GiB:.2f} GiB"))
    diffs.append(Difference("fits", str(old.memory.fits), str(new.memory.fits)))
    diffs.append(Difference("step time", f"{old.prediction.step_time_s:.4g} s", f"{new.prediction.step_time_s:.4g} s"))
    return diffs, changed


def check_plan(path: Path, old: LaunchPlan, *, tolerance: float, allow_change: bool) -> CheckResult:
    """Recompute one plan and classify the outcome."""
    base = dict(path=str(path), kind=old.kind, old_step_time_s=old.prediction.step_time_s)
    try:
        new = recompute_plan(old)
    except (InfeasibleError, BadInputError) as exc:  # a fixed configuration that no longer divides is bad input
        return CheckResult(**base, status="no_longer_fits", new_step_time_s=None, differences=(), messages=(str(exc),))
    diffs, changed = compare(old, new)
    messages: list[str] = []
    status: Status = "ok"
    change = new.prediction.step_time_s / old.prediction.step_time_s - 1.0 if old.prediction.step_time_s > 0 else 0.0
    if not new.feasible or not new.memory.fits:
        status = "no_longer_fits"
        messages += list(new.infeasible_reasons) or [f"peak {new.memory.peak_bytes / GiB:.2f} GiB > capacity {new.memory.capacity_bytes / GiB:.2f} GiB"]
    elif change > tolerance:
        status = "regressed"
        messages.append(f"predicted step time {change:+.1%} (tolerance {tolerance:.1%})")
    elif changed and not allow_change:
        status = "changed"
        messages.append("the chosen configuration changed (pass --allow-change to accept)")
    elif change < -tolerance:
        status = "improved"
        messages.append(f"predicted step time {change:+.1%}: consider committing the new plan")
    if changed and allow_change:
        messages.append("configuration changed (allowed)")
    return CheckResult(**base, status=status, new_step_time_s=new.prediction.step_time_s, differences=tuple(diffs), messages=tuple(messages))


def plan_files(target: str | Path) -> list[Path]:
    """A plan file, or every *.json under a folder (sorted, recursive)."""
    root = Path(target)
    if root.is_file():
        return [root]
    if not root.is_dir():
        raise BadInputError(f"{root}: no such file or folder: pass a plan JSON or a folder of them")
    files = sorted(root.rglob("*.json"))
    if not files:
        raise BadInputError(f"{root}: no *.json plans found: commit plans made by `planner plan -o`")
    return files


def check_plans(
    target: str | Path,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    allow_change: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """Check every plan under `target`; a file that is not a LaunchPlan is bad input (exit 2).

    All files are validated before any is recomputed, so bad input fails fast. `progress(done, total)`
    is called after each plan (searches can take seconds each)."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise BadInputError(f"tolerance={tolerance} must be a finite number >= 0: e.g. --tolerance 0.02 for 2%")
    from planner.plan_verify import verify_plan

    plans = [(path, verify_plan(load_file(LaunchPlan, path), source=str(path), rederive=False)) for path in plan_files(target)]
    results = []
    for path, plan in plans:
        results.append(check_plan(path, plan, tolerance=tolerance, allow_change=allow_change))
        if progress is not None:
            progress(len(results), len(plans))
    return CheckReport(tolerance=tolerance, allow_change=allow_change, results=tuple(results))


def report_dict(report: CheckReport) -> dict:
    """JSON-ready form of a report (for --json)."""
    return {
        "tolerance": report.tolerance,
        "allow_change": report.allow_change,
        "failed": report.failed,
        "results": [
            {
                "path": r.path, "kind": r.kind, "status": r.status, "failed": r.failed,
                "old_step_time_s": r.old_step_time_s, "new_step_time_s": r.new_step_time_s,
                "relative_change": r.relative_change, "messages": list(r.messages),
                "differences": [{"what": d.what, "old": d.old, "new": d.new} for d in r.differences],
            }
            for r in report.results
        ],
    }
