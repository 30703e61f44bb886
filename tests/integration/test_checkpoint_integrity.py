"""A damaged checkpoint is refused before the resume, naming the damaged file in one line (issue 24).

One real run (2 ranks, tiny model, 2 steps, a checkpoint after each) makes the checkpoints; each test damages a copy
of the newest one as an operator or a failing disk would and calls the same check `planner run --resume` makes before
it starts torchrun (planner.executor.checkpoint.check_resume); one case goes through the CLI end to end. A write past
the file-size limit (RLIMIT_FSIZE in the launcher's subprocess, inherited by the ranks) is named, not a silent kill."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from executor_plans import TINY, honest, make_plan, write_plan  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from planner.cli import app  # noqa: E402
from planner.errors import BadInputError  # noqa: E402
from planner.executor.checkpoint import check_resume, latest_step, step_dir  # noqa: E402
from planner.executor.run import run_plan  # noqa: E402
from planner.launch_spec.options import RunOptions  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def the_plan():
    return honest(make_plan(TINY, dp=2, num_microbatches=1))


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("ckpt")
    plan = write_plan(the_plan(), folder / "plan.json")
    run_plan(plan, options=RunOptions(steps=2, checkpoint_dir=str(folder / "ckpt"), checkpoint_every=1, device="cpu", timeout_s=120))
    assert latest_step(folder / "ckpt") == 2
    return folder


@pytest.fixture()
def copy(saved, tmp_path) -> Path:
    shutil.copytree(saved / "ckpt", tmp_path / "ckpt")
    return tmp_path / "ckpt"


def newest(root: Path) -> Path:
    return step_dir(root, latest_step(root))


def shard(root: Path) -> Path:
    return sorted(newest(root).glob("*.distcp"))[0]


def refused_resume(root: Path, plan=None) -> str:
    with pytest.raises(BadInputError) as caught:
        check_resume(root, plan or the_plan())
    message = str(caught.value)
    assert "\n" not in message
    return message


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.slow
def test_an_intact_checkpoint_resumes(copy):
    assert check_resume(copy, the_plan()) == 2


@pytest.mark.slow
@pytest.mark.parametrize("damage, words", [
    (lambda root: _flip(shard(root)), "does not match its sha256"),
    (lambda root: shard(root).write_bytes(shard(root).read_bytes()[:-100]), "bytes, the manifest says"),
    (lambda root: shard(root).unlink(), "is missing"),
    (lambda root: shutil.copyfile(sorted(step_dir(root, 1).glob("*.distcp"))[0], shard(root)), "does not match its sha256"),
    (lambda root: shutil.copyfile(shard(root), newest(root) / "__9_0.distcp"), "is not in the checkpoint's manifest"),
    (lambda root: _flip(newest(root) / ".metadata"), ".metadata does not match its sha256"),
    (lambda root: (newest(root) / "planner-step.json").write_text('{"step": 2, "files": {'), "planner-step.json is unreadable"),
    (lambda root: (newest(root) / "planner-step.json").write_text('{"step": 2}'), "is not a checkpoint manifest"),
], ids=["flipped-bytes", "truncated", "missing", "stale-shard", "extra-shard", "metadata", "manifest-json", "manifest-old"])
def test_damage_is_named_in_one_line(copy, damage, words):
    damage(copy)
    message = refused_resume(copy)
    assert words in message and str(newest(copy)) in message, message


@pytest.mark.slow
def test_another_model_or_layout_is_refused_with_what_differs(copy):
    other = the_plan().request.model.model_copy(update={"hidden_size": 64, "ffn_hidden_size": 128})
    plan = honest(make_plan(other, dp=2, num_microbatches=1))
    assert "model.ffn_hidden_size=64 -> 128, model.hidden_size=32 -> 64" in refused_resume(copy, plan)
    zero1 = refused_resume(copy, honest(make_plan(TINY, dp=2, zero_stage=1, num_microbatches=1)))
    assert "zero_stage=0 -> 1" in zero1 and "ZeRO-1 saves each rank's optimizer partition" in zero1
    assert check_resume(copy, honest(make_plan(TINY, dp=2, zero_stage=2, num_microbatches=1))) == 2  # reshards


@pytest.mark.slow
def test_planner_run_resume_refuses_damage_before_launch(copy, saved):
    _flip(shard(copy))
    started = time.monotonic()
    result = CliRunner().invoke(app, ["run", str(saved / "plan.json"), "--steps", "3", "--device", "cpu",
                                      "--checkpoint-dir", str(copy), "--resume"])
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert result.exit_code == 2 and len(lines) == 1 and "does not match its sha256" in lines[0], result.output
    assert time.monotonic() - started < 15  # refused before torchrun starts


def _limit_file_size() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, 64 << 10))


@pytest.mark.slow
def test_a_write_past_the_file_size_limit_is_named(tmp_path):
    plan = write_plan(the_plan(), tmp_path / "plan.json")
    env = os.environ | {"PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    done = subprocess.run([sys.executable, "-m", "planner.cli", "run", str(plan), "--steps", "1", "--device", "cpu",
                           "--checkpoint-dir", str(tmp_path / "ckpt"), "--checkpoint-every", "1", "--timeout-s", "120"],
                          env=env, capture_output=True, text=True, timeout=300, preexec_fn=_limit_file_size)
    assert done.returncode == 1, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot write checkpoint" in lines[0] and "EFBIG" in lines[0], done.stderr
    assert latest_step(tmp_path / "ckpt") is None and not list((tmp_path / "ckpt").glob(".step-*"))
    assert json.loads(plan.read_text())  # nothing of ours was damaged
