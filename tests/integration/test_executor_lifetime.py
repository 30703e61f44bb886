"""No rank outlives `planner run` (issue 24): SIGKILL of the launcher, SIGKILL of its process group, SIGTERM, and the
launcher's own timeout each leave no process of the job (agent or rank) within a bounded time.

The job's processes are found by their command line, which holds the plan's unique path (torchrun's agent and every
rank get it as an argument). 2 ranks of a tiny model on CPU, told to run far more steps than the test waits for."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor_plans import make_plan, write_plan  # noqa: E402

from planner.executor.run import run_agent, thread_env, torchrun_argv  # noqa: E402
from planner.launch_spec.options import RunOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
START_S, GONE_S = 120.0, 30.0


def job_pids(marker: str) -> dict[int, str]:
    """pid -> command line of the live processes whose command line holds `marker`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found[int(entry.name)] = cmdline
    return found


def wait_for_ranks(marker: str, count: int = 2) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if sum("planner.executor.runtime" in cmd and "torch.distributed.run" not in cmd for cmd in job_pids(marker).values()) >= count:
            time.sleep(1.0)  # past the rank's entry point
            return
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not start within {START_S:.0f} s: {job_pids(marker)}")


def assert_all_gone(marker: str) -> None:
    deadline = time.monotonic() + GONE_S
    while job_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = job_pids(marker)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"processes outlived the launcher: {left}"


def long_plan(tmp_path: Path) -> Path:
    return write_plan(make_plan(pp=2, num_microbatches=2), tmp_path / f"lifetime-{os.getpid()}-{time.monotonic_ns()}.json")


def launch(plan: Path) -> subprocess.Popen:
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    return subprocess.Popen([sys.executable, "-m", "planner.cli", "run", str(plan), "--steps", "1000000", "--device", "cpu"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill", "sigkill-group", "sigterm"])
def test_the_ranks_die_with_the_launcher(tmp_path, how):
    plan = long_plan(tmp_path)
    launcher = launch(plan)
    try:
        wait_for_ranks(str(plan))
        if how == "sigkill":
            launcher.send_signal(signal.SIGKILL)
        elif how == "sigkill-group":
            os.killpg(launcher.pid, signal.SIGKILL)
        else:
            launcher.send_signal(signal.SIGTERM)
        launcher.wait(GONE_S)
        assert_all_gone(str(plan))
    finally:
        if launcher.poll() is None:
            launcher.kill()


@pytest.mark.slow
def test_the_launchers_timeout_kills_agent_and_ranks(tmp_path):
    plan = long_plan(tmp_path)
    argv = torchrun_argv(plan, 2, RunOptions(steps=1_000_000, device="cpu", results_dir=str(tmp_path / "results")))
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        run_agent(argv, env={**os.environ, **thread_env(None)}, timeout_s=40)
    assert time.monotonic() - started < 40 + GONE_S
    assert_all_gone(str(plan))
