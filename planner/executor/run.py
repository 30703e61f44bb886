"""`planner run`: run a LaunchPlan on this machine and write one run report.

Starts `torchrun --standalone` with the plan's world size running planner.executor.runtime, waits,
collects every rank's result and writes the RunReport atomically (temporary file + rename). When a rank
fails, nothing is written: the error names the rank that caused the failure and why (its
`rank-<r>.error.json`, or, for a rank killed or crashed without one, the signal torchrun saw; the peers'
lost-connection errors are consequences), and uncommitted checkpoint folders are removed. Every world size runs
with the same CPU threads per rank (OMP_NUM_THREADS, default 1: what torchrun gives each of several processes),
so a single-process run is timed like a multi-process one. No torch import here.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from planner.errors import BadInputError, PlannerError
from planner.executor.checkpoint import VERIFIED_ENV, check_resume, remove_partial
from planner.executor.host import host_load, load_average, usable_cores
from planner.executor.lifetime import kill_group, wrapped_argv
from planner.executor.report import RankFailure, RankResult, RunReport, build_report
from planner.io import atomic_write_text, canonical_json, load_file
from planner.launch_spec.options import RunOptions
from planner.launch_spec.runnable import check_runnable
from planner.schemas.plan import LaunchPlan

RUNTIME_MODULE = "planner.executor.runtime"
STARTUP_ALLOWANCE_S = 120.0
REAP_TIMEOUT_S = 10.0  # after the agent's group is killed: its ranks die by their parent-death signal
OUTPUT_TAIL_CHARS = 2000


THREADS_ENV, DEFAULT_THREADS = "OMP_NUM_THREADS", "1"


def thread_env(env: dict[str, str] | None) -> dict[str, str]:
    """OMP_NUM_THREADS for every rank, whatever the world size: the caller's (env, then this process's), else 1.
    torchrun sets 1 only when it starts several processes, so single-process runs used every core before."""
    value = (env or {}).get(THREADS_ENV) or os.environ.get(THREADS_ENV) or DEFAULT_THREADS
    if not value.isdigit() or int(value) < 1:
        raise BadInputError(f"{THREADS_ENV}={value!r}: set a positive number of CPU threads per rank, e.g. {THREADS_ENV}=1")
    return {THREADS_ENV: value}


class RunFailedError(PlannerError):
    """A rank of the job failed (exit code 1): the message names the rank and the cause."""

    exit_code = 1


def torchrun_argv(plan_path: str | Path, nproc: int, options: RunOptions) -> list[str]:
    """The standalone torchrun command line (single node, no restarts)."""
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc),
        "--max-restarts", "0", "--monitor-interval", "0.2", "-m", RUNTIME_MODULE, str(plan_path), *options.to_argv(),
    ]


# A survivor's error when a peer died first: the consequence, not the cause.
PEER_LOSS = re.compile(r"connection (reset|closed|refused)|broken pipe|socket closed|read error|write error|timed? ?out|"
                       r"communicator was aborted|watchdog", re.IGNORECASE)
# torchrun's failure summary: "rank : 1 (local_rank: 1)" then "exitcode : -9 (pid: ...)"
EXIT_LINE = re.compile(r"rank\s*:\s*(\d+)\s*\(local_rank:\s*\d+\)\s*\n\s*exitcode\s*:\s*(-?\d+)")
ABORT_LINE = re.compile(r"what\(\):\s*(.+)")


def signal_deaths(output: str) -> dict[int, int]:
    """rank -> signal number of the ranks torchrun saw die by a signal other than its own SIGTERM (which it sends
    to the survivors after the first failure): a kill (OOM, SIGKILL) or a crash (SIGABRT, SIGSEGV)."""
    deaths = {int(rank): -int(code) for rank, code in EXIT_LINE.findall(output) if int(code) < 0}
    return {rank: sig for rank, sig in deaths.items() if sig != signal.SIGTERM}


def lost_a_peer(failure: RankFailure) -> bool:
    """Whether a rank's failure is the consequence of a peer's: its message, or one of the exceptions chained under it
    (torch.distributed.pipelining wraps a lost connection as "Failed to run stage backward"), reads as a lost
    connection. Only the traceback's exception lines are read (column 0), not its source lines (`timeout=...`)."""
    chained = [line for line in failure.traceback.splitlines()
               if line and not line[0].isspace() and not line.startswith(("Traceback", "The above", "During handling"))]
    return any(PEER_LOSS.search(text) for text in (failure.message, *chained))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _failure_message(results_dir: Path, returncode: int, output: str) -> str:
    """The rank whose failure caused the others: a rank's own error first, then a rank that died by a signal
    without reporting (its peers then report only lost connections), then the earliest lost connection."""
    failures = sorted(
        (RankFailure.model_validate_json(p.read_text()) for p in results_dir.glob("rank-*.error.json")),
        key=lambda f: (f.time_s, f.rank),
    )
    own = [f for f in failures if not lost_a_peer(f)]
    reported = {f.rank for f in failures}
    silent = {r: sig for r, sig in signal_deaths(output).items() if r not in reported}
    if own:
        first = own[0]
        cause = f"rank {first.rank} failed: {first.error_type}: {first.message}"
    elif silent:
        rank = min(silent)
        aborted = ABORT_LINE.findall(output)
        detail = f": {aborted[-1].strip()}" if aborted and silent[rank] == signal.SIGABRT else ""
        cause = (f"rank {rank} died by {_signal_name(silent[rank])} without reporting a cause (killed, e.g. out of "
                 f"memory, or crashed){detail}")
        first = None
    elif failures:
        first = failures[0]
        cause = f"rank {first.rank} failed: {first.error_type}: {first.message}"
    else:
        tail = output[-OUTPUT_TAIL_CHARS:].strip()
        return f"torchrun exited with code {returncode} before any rank reported a cause; its last output:\n{tail}"
    cause_rank = first.rank if first is not None else min(silent)
    others = sorted(({f.rank for f in failures} | set(silent)) - {cause_rank})
    return cause + (f" (then rank(s) {others} failed too)" if others else "")


def _collect(results_dir: Path, world: int) -> list[RankResult]:
    results = [RankResult.model_validate_json(p.read_text()) for p in sorted(results_dir.glob("rank-*.json"))
               if not p.name.endswith(".error.json")]
    if sorted(r.rank for r in results) != list(range(world)):
        raise RunFailedError(f"the job exited cleanly but only ranks {sorted(r.rank for r in results)} of {world} reported results")
    return results


def run_agent(argv: list[str], *, env: dict[str, str], timeout_s: float) -> tuple[int, str]:
    """Run torchrun's agent to its end: (exit code, stdout + stderr). The agent dies with this process (parent-death
    signal, planner.executor.lifetime) and runs in its own process group, which is killed whole past `timeout_s`
    (subprocess.TimeoutExpired), on SIGTERM (raised here as SystemExit 143) and on any other exception; its ranks
    follow by their own parent-death signal."""
    proc = subprocess.Popen(wrapped_argv(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    previous = _raise_on_sigterm()
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except BaseException:
        kill_group(proc.pid)
        try:
            proc.communicate(timeout=REAP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
        raise
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
    return proc.returncode, stdout + stderr


def _raise_on_sigterm():
    """On the main thread: SIGTERM becomes SystemExit(143), so the run's cleanup (kill the agent's group, remove the
    results folder and partial checkpoints) happens; returns the handler to restore (None off the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, _frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def run_plan(plan_ref: LaunchPlan | str | Path, *, options: RunOptions, report_path: str | Path | None = None,
             warmup_steps: int = 1, nproc: int | None = None, env: dict[str, str] | None = None) -> RunReport:
    """Run the plan with torchrun on this machine; returns the report (also written to `report_path`).

    `nproc` overrides the number of processes started (default: the plan's world size): a mismatch is
    refused by every rank, which is how the tests check that refusal. `env` adds environment variables."""
    from planner.executor.preflight import preflight
    from planner.plan_verify import verify_plan

    if warmup_steps < 0:
        raise BadInputError(f"--warmup-steps {warmup_steps}: give 0 or more steps to leave out of the median step time")

    loaded = plan_ref if isinstance(plan_ref, LaunchPlan) else load_file(LaunchPlan, plan_ref)
    plan = verify_plan(loaded, source="plan" if isinstance(plan_ref, LaunchPlan) else str(plan_ref))
    notes = check_runnable(plan)
    preflight(plan, options, report_path)
    if options.resume:
        check_resume(options.checkpoint_dir, plan)  # a changed layout is bad input (exit 2), found before launch
    world = plan.parallelism.world_size
    started = nproc if nproc is not None else world
    results_dir = Path(tempfile.mkdtemp(prefix="planner-run-"))
    plan_path = Path(plan_ref).resolve() if not isinstance(plan_ref, LaunchPlan) else atomic_write_text(results_dir / "plan.json", canonical_json(plan))
    options = options.replace(results_dir=str(results_dir))
    load_before = load_average()
    try:
        verified = {VERIFIED_ENV: "1"} if options.resume else {}
        returncode, output = run_agent(torchrun_argv(plan_path, started, options),
                                       env={**os.environ, **(env or {}), **thread_env(env), **verified},
                                       timeout_s=options.timeout_s + STARTUP_ALLOWANCE_S)
        if returncode != 0:
            if options.checkpoint_dir:
                remove_partial(options.checkpoint_dir)
            raise RunFailedError(_failure_message(results_dir, returncode, output))
        results = _collect(results_dir, world)
    except subprocess.TimeoutExpired as exc:
        raise RunFailedError(f"the job ran past {exc.timeout:.0f} s and was stopped: raise --timeout-s or run fewer --steps") from None
    finally:
        shutil.rmtree(results_dir, ignore_errors=True)
    warmup = min(warmup_steps, max(0, len(results[0].step_times_s) - 1))
    report = build_report(plan, results, data=options.data or "synthetic", warmup_steps=warmup, notes=notes)
    host = host_load(before=load_before, after=load_average(), cores=usable_cores(), ranks=started,
                     threads_per_rank=report.threads_per_rank or int(thread_env(env)[THREADS_ENV]))
    report = report.model_copy(update={"host": host})
    if report_path is not None:
        atomic_write_text(report_path, canonical_json(report))
    return report
