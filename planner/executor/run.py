"""`planner run`: run a LaunchPlan on this machine and write one run report.

Starts `torchrun --standalone` with the plan's world size running planner.executor.runtime, waits,
collects every rank's result and writes the RunReport atomically (temporary file + rename). When a rank
fails, nothing is written: the error names the rank that failed first and its cause (from its
`rank-<r>.error.json`), and uncommitted checkpoint folders are removed. No torch import here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.errors import PlannerError
from planner.executor.checkpoint import remove_partial
from planner.executor.options import RunOptions
from planner.executor.report import RankFailure, RankResult, RunReport, build_report
from planner.executor.runnable import check_options, check_runnable
from planner.io import atomic_write_text, canonical_json, load_file
from planner.schemas.plan import LaunchPlan

RUNTIME_MODULE = "planner.executor.runtime"
STARTUP_ALLOWANCE_S = 120.0
OUTPUT_TAIL_CHARS = 2000


class RunFailedError(PlannerError):
    """A rank of the job failed (exit code 1): the message names the rank and the cause."""

    exit_code = 1


def torchrun_argv(plan_path: str | Path, nproc: int, options: RunOptions) -> list[str]:
    """The standalone torchrun command line (single node, no restarts)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--max-restarts", "0", "--monitor-interval", "0.2", "-m", RUNTIME_MODULE, str(plan_path), *options.to_argv(),
    ]


def _failure_message(results_dir: Path, returncode: int, output: str) -> str:
    """The earliest rank failure (the cause; later ones are usually peers losing their connection)."""
    failures = sorted(
        (RankFailure.model_validate_json(p.read_text()) for p in results_dir.glob("rank-*.error.json")),
        key=lambda f: (f.time_s, f.rank),
    )
    if failures:
        first = failures[0]
        others = sorted({f.rank for f in failures[1:]})
        tail = f" (then rank(s) {others} failed too)" if others else ""
        return f"rank {first.rank} failed: {first.error_type}: {first.message}{tail}"
    tail = output[-OUTPUT_TAIL_CHARS:].strip()
    return f"torchrun exited with code {returncode} before any rank reported a cause; its last output:\n{tail}"


def _collect(results_dir: Path, world: int) -> list[RankResult]:
    results = [RankResult.model_validate_json(p.read_text()) for p in sorted(results_dir.glob("rank-*.json"))
               if not p.name.endswith(".error.json")]
    if sorted(r.rank for r in results) != list(range(world)):
        raise RunFailedError(f"the job exited cleanly but only ranks {sorted(r.rank for r in results)} of {world} reported results")
    return results


def run_plan(plan_ref: LaunchPlan | str | Path, *, options: RunOptions, report_path: str | Path | None = None,
             warmup_steps: int = 1, nproc: int | None = None, env: dict[str, str] | None = None) -> RunReport:
    """Run the plan with torchrun on this machine; returns the report (also written to `report_path`).

    `nproc` overrides the number of processes started (default: the plan's world size): a mismatch is
    refused by every rank, which is how the tests check that refusal. `env` adds environment variables."""
    plan = plan_ref if isinstance(plan_ref, LaunchPlan) else load_file(LaunchPlan, plan_ref)
    notes = check_runnable(plan)
    check_options(plan, options)
    world = plan.parallelism.world_size
    started = nproc if nproc is not None else world
    results_dir = Path(tempfile.mkdtemp(prefix="planner-run-"))
    plan_path = Path(plan_ref).resolve() if not isinstance(plan_ref, LaunchPlan) else atomic_write_text(results_dir / "plan.json", canonical_json(plan))
    options = options.replace(results_dir=str(results_dir))
    try:
        completed = subprocess.run(
            torchrun_argv(plan_path, started, options), env={**os.environ, **(env or {})},
            capture_output=True, text=True, timeout=options.timeout_s + STARTUP_ALLOWANCE_S, check=False,
        )
        if completed.returncode != 0:
            if options.checkpoint_dir:
                remove_partial(options.checkpoint_dir)
            raise RunFailedError(_failure_message(results_dir, completed.returncode, completed.stdout + completed.stderr))
        results = _collect(results_dir, world)
    except subprocess.TimeoutExpired as exc:
        raise RunFailedError(f"the job ran past {exc.timeout:.0f} s and was stopped: raise --timeout-s or run fewer --steps") from None
    finally:
        shutil.rmtree(results_dir, ignore_errors=True)
    warmup = min(warmup_steps, max(0, len(results[0].step_times_s) - 1))
    report = build_report(plan, results, data=options.data or "synthetic", warmup_steps=warmup, notes=notes)
    if report_path is not None:
        atomic_write_text(report_path, canonical_json(report))
    return report
