"""How a failed or mismatched run is reported (issue 14): the rank that caused a failure is named even when it
died by a signal without reporting (its peers then report only lost connections); resuming under another
layout or GPU count is bad input (exit 2) found before launch; every world size runs with the same threads."""

from __future__ import annotations

import json
import signal

import pytest
from executor_plans import TINY, make_plan, write_plan

from planner.errors import BadInputError
from planner.executor.checkpoint import STEP_FILE, layout_of, step_dir
from planner.executor.report import RankFailure
from planner.executor.run import _failure_message, signal_deaths, thread_env
from planner.launch_spec.options import RunOptions

TORCHRUN_SUMMARY = """
Failures:
[1]:
  rank      : 0 (local_rank: 0)
  exitcode  : -15 (pid: 2875)  (SIGTERM)
Root Cause (first observed failure):
[0]:
  rank      : 1 (local_rank: 1)
  exitcode  : -9 (pid: 2876)  (SIGKILL)
"""
RESET = "[gloo/transport/tcp/pair.cc:537] Read error [127.0.0.1]:21180: Connection reset by peer."


def _write_failure(folder, rank, message, time_s):
    failure = RankFailure(rank=rank, error_type="RuntimeError", message=message, time_s=time_s)
    (folder / f"rank-{rank}.error.json").write_text(failure.model_dump_json())


def test_a_killed_rank_is_named_not_the_peer_that_lost_its_connection(tmp_path):
    _write_failure(tmp_path, 0, RESET, 1.0)
    assert signal_deaths(TORCHRUN_SUMMARY) == {1: signal.SIGKILL}  # torchrun's own SIGTERM of rank 0 is no cause
    message = _failure_message(tmp_path, 1, TORCHRUN_SUMMARY)
    assert message.startswith("rank 1 died by SIGKILL without reporting a cause") and "then rank(s) [0]" in message


def test_a_peer_loss_wrapped_by_the_pipeline_schedule_is_no_cause(tmp_path):
    """Issue 24: killing rank 1 of a TP2 x PP2 job named rank 0, whose error torch.distributed.pipelining wraps as
    "Failed to run stage backward" with the lost connection only in the chained exception of its traceback."""
    chained = (f"Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n    dist.recv(t, timeout=timeout)\n"
               f"RuntimeError: {RESET}\n\nThe above exception was the direct cause of the following exception:\n\n"
               f"Traceback (most recent call last):\n  File \"y.py\", line 2, in g\nRuntimeError: \n  Failed to run stage backward:\n")
    failure = RankFailure(rank=0, error_type="RuntimeError", message="\n  Failed to run stage backward:\n  Stage output: (...)",
                          traceback=chained, time_s=1.0)
    (tmp_path / "rank-0.error.json").write_text(failure.model_dump_json())
    assert _failure_message(tmp_path, 1, TORCHRUN_SUMMARY).startswith("rank 1 died by SIGKILL")
    own = failure.model_copy(update={"traceback": chained.replace(RESET, "shape mismatch"), "message": "shape mismatch"})
    (tmp_path / "rank-0.error.json").write_text(own.model_dump_json())
    assert _failure_message(tmp_path, 1, TORCHRUN_SUMMARY).startswith("rank 0 failed: RuntimeError: shape mismatch")


def test_an_aborted_rank_is_named_with_its_abort_reason(tmp_path):
    _write_failure(tmp_path, 0, RESET, 1.0)
    output = "  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 2048 vs 1024.\n" + \
        TORCHRUN_SUMMARY.replace("-9 (pid: 2876)  (SIGKILL)", "-6 (pid: 2876)  (SIGABRT)")
    assert "rank 1 died by SIGABRT" in (msg := _failure_message(tmp_path, 1, output)) and "2048 vs 1024" in msg


def test_a_rank_own_error_beats_an_earlier_lost_connection(tmp_path):
    _write_failure(tmp_path, 0, RESET, 1.0)
    _write_failure(tmp_path, 1, "injected failure at step 2", 2.0)
    assert _failure_message(tmp_path, 1, "").startswith("rank 1 failed: RuntimeError: injected failure")


def test_threads_are_one_per_rank_unless_the_caller_says(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert thread_env(None) == {"OMP_NUM_THREADS": "1"}
    assert thread_env({"OMP_NUM_THREADS": "4"}) == {"OMP_NUM_THREADS": "4"}
    with pytest.raises(BadInputError, match="OMP_NUM_THREADS='0'"):
        thread_env({"OMP_NUM_THREADS": "0"})


@pytest.mark.parametrize(("changed", "field"), [
    (dict(dp=4, zero_stage=1), "ZeRO-1 saves each rank's optimizer partition"),  # cannot reshard (planner.executor.reshard)
    (dict(dp=2, zero_stage=1, gpus=8), "!= request.gpus=8"),  # an inconsistent plan file: refused before the checkpoint is read
])
def test_resume_under_another_layout_is_bad_input_before_launch(changed, field, tmp_path):
    """A ZeRO-1 DP2 checkpoint resumed under DP4, or under a request for another GPU count: exit 2, nothing started."""
    from typer.testing import CliRunner

    from planner.cli import app

    pytest.importorskip("torch")
    saved = make_plan(TINY, dp=2, zero_stage=1, num_microbatches=1)
    folder = step_dir(tmp_path / "ckpt", 2)
    folder.mkdir(parents=True)
    (folder / STEP_FILE).write_text(json.dumps({"step": 2, "world_size": 2, "layout": layout_of(saved), "files": {}}))
    gpus = changed.pop("gpus", None)
    plan = make_plan(TINY, num_microbatches=1, **changed)
    if gpus is not None:
        plan = plan.model_copy(update={"request": plan.request.model_copy(update={"gpus": gpus})})
    path = write_plan(plan, tmp_path / "plan.json")
    result = CliRunner().invoke(app, ["run", str(path), "--steps", "3", "--checkpoint-dir", str(tmp_path / "ckpt"), "--resume"])
    assert result.exit_code == 2, result.output
    assert field in result.output
    assert "resume with the plan that wrote it" in result.output or "write the plan again" in result.output


@pytest.mark.slow
def test_a_rank_killed_mid_run_is_named(tmp_path):
    pytest.importorskip("torch")
    from planner.executor.run import RunFailedError, run_plan

    plan = make_plan(TINY, dp=2, num_microbatches=1)
    env = {"PLANNER_FAIL_RANK": "1", "PLANNER_FAIL_STEP": "2", "PLANNER_FAIL_SIGNAL": str(int(signal.SIGKILL))}
    with pytest.raises(RunFailedError, match=r"^rank 1 died by SIGKILL without reporting a cause"):
        run_plan(write_plan(plan, tmp_path / "plan.json"), options=RunOptions(steps=3, timeout_s=60), env=env)
