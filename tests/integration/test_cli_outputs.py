"""Output files never replace what is not ours (issue 24): `-o`/`--report`/`--plot`/`--db` naming a FIFO, a
folder, a device node, or a name ending in '/' is refused in one line (exit 2) before any work, and the thing
named is left exactly as it was. The atomic writer itself refuses too (a last defence for callers that skip the
CLI's check). A character device is only ever checked by refusal (`/dev/null` must still be one afterwards)."""

from __future__ import annotations

import json
import os
import stat
import time
from pathlib import Path

import pytest
from cli_refusals import refused

from planner import api
from planner.errors import BadInputError
from planner.io import atomic_write_text, canonical_json, check_writable
from planner.schemas.plan import Configuration, Parallelism
from planner.cli import app
from typer.testing import CliRunner


@pytest.fixture()
def spots(tmp_path) -> dict[str, str]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "keep.txt").write_text("mine")
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, global_batch_size=16, seq_len=512)
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=2, tp=2, pp=2), microbatch_size=1))
    (tmp_path / "plan.json").write_text(canonical_json(plan))
    return {"fifo": str(fifo), "folder": str(folder), "slash": str(tmp_path / "newdir") + "/", "plan": str(tmp_path / "plan.json"),
            "tmp": str(tmp_path)}


COMMANDS = [
    ["plan", "--gpus", "8", "-o"], ["estimate", "--gpus", "8", "-o"], ["schema", "-o"],
    ["export", "{plan}", "--to", "megatron", "-o"], ["run", "{plan}", "--device", "cpu", "--report"],
]


@pytest.mark.parametrize("kind, words", [("fifo", "a FIFO"), ("folder", "a folder"), ("slash", "ends in a path separator")])
@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: c[0])
def test_special_outputs_are_refused_and_left_alone(spots, kind, words, command):
    args = [arg.format(**spots) for arg in command] + [spots[kind]]
    line = refused(args, within_s=15)
    assert words in line and spots[kind].rstrip("/").split("/")[-1] in line
    assert stat.S_ISFIFO(os.stat(spots["fifo"]).st_mode)
    assert (Path(spots["folder"]) / "keep.txt").read_text() == "mine"
    assert not Path(spots["slash"]).exists()
    assert sorted(p.name for p in Path(spots["tmp"]).iterdir()) == ["fifo", "folder", "plan.json"]  # no temporary left


def test_dev_null_is_refused_and_stays_a_character_device():
    before = os.stat("/dev/null")
    line = refused(["plan", "--gpus", "8", "-o", "/dev/null"], within_s=15)
    assert "a character device" in line
    with pytest.raises(BadInputError, match="character device"):
        atomic_write_text("/dev/null", "x")  # refused before any temporary file is made next to it
    after = os.stat("/dev/null")
    assert stat.S_ISCHR(after.st_mode) and (after.st_ino, after.st_rdev) == (before.st_ino, before.st_rdev)


def test_atomic_writer_refuses_special_files_itself(spots):
    for kind in ("fifo", "folder", "slash"):
        with pytest.raises(BadInputError, match="cannot write"):
            atomic_write_text(spots[kind], "x")
        with pytest.raises(BadInputError, match="cannot be written"):
            check_writable(spots[kind], flag="--report")
    assert stat.S_ISFIFO(os.stat(spots["fifo"]).st_mode)


def test_regular_files_and_links_to_them_are_replaced(spots):
    target = Path(spots["tmp"]) / "out.json"
    target.write_text("old")
    link = Path(spots["tmp"]) / "link.json"
    link.symlink_to(target)
    atomic_write_text(link, json.dumps({"new": 1}))
    assert link.is_symlink() and json.loads(target.read_text()) == {"new": 1}
    fifo_link = Path(spots["tmp"]) / "fifo-link"
    fifo_link.symlink_to(spots["fifo"])
    with pytest.raises(BadInputError, match="a FIFO"):
        atomic_write_text(fifo_link, "x")


# ---- issue 24's remaining tracebacks: one line, exit 2, before torchrun starts -------------------------------------

@pytest.mark.parametrize("flag, value, words", [
    ("--timeout-s", "nan", "--timeout-s nan"), ("--timeout-s", "inf", "--timeout-s inf"), ("--lr", "nan", "--lr nan"),
    ("--lr", "-0.1", "--lr -0.1"), ("--seed", str(2**63), "--seed"), ("--seed", "-1", "--seed -1"),
    ("--warmup-steps", "-1", "--warmup-steps -1"), ("--timeout-s", "1e12", "--timeout-s"),
])
def test_run_options_are_checked_before_torchrun(spots, flag, value, words):
    pytest.importorskip("torch")
    line = refused(["run", spots["plan"], "--device", "cpu", flag, value], within_s=10)
    assert words in line


@pytest.mark.parametrize("text", ["? [a, b]\n: 1\nname: x\n", "? {a: 1}\n: 1\n"])
def test_a_yaml_key_that_is_a_list_or_mapping_is_one_line(tmp_path, text):
    path = tmp_path / "model.yaml"
    path.write_text(text)
    assert "mapping key must be a plain name" in refused(["plan", "--model", str(path), "--gpus", "8"], within_s=10)


def test_an_absurd_capacity_factor_is_one_line(tmp_path):
    spec = api.load_model("mixtral-8x7b").model_dump(mode="json")
    spec["moe"]["capacity_factor"] = 9e307
    path = tmp_path / "moe.json"
    path.write_text(json.dumps(spec))
    assert "capacity_factor" in refused(["estimate", "--model", str(path), "--gpus", "16", "--ep", "8"], within_s=10)


def test_an_absurd_fabric_latency_is_one_line(tmp_path):
    topology = api.load_topology("dgx-h100").model_dump(mode="json")
    topology["intra_node"]["latency_s"] = 1e308  # overflowed to NaN step times
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(topology))
    assert "intra_node.latency_s" in refused(["plan", "--topology", str(path), "--gpus", "8"], within_s=10)
