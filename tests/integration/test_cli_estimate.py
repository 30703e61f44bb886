"""`planner estimate` through the real typer app: tables, JSON, -o, exit codes 0 / 1 / 2."""

import json

from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
BASE = ["estimate", "--model", "llama3-8b", "--gpus", "16", "--global-batch-size", "64", "--seq-len", "4096",
        "--framework", "megatron-core"]


def test_table_and_exit_0():
    result = runner.invoke(app, BASE + ["--tp", "4", "--pp", "2", "--sp", "--recompute", "selective", "--zero", "1"])
    assert result.exit_code == 0, result.output
    for text in ("step time", "MFU", "Memory per pipeline rank", "tp_comm_exposed", "fits"):
        assert text in result.output


def test_json_and_output_file(tmp_path):
    out = tmp_path / "plan.json"
    result = runner.invoke(app, BASE + ["--tp", "8", "--json", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["parallelism"]["dp"] == 2 and plan["kind"] == "estimate"
    assert json.loads(out.read_text()) == plan


def test_does_not_fit_exit_1():
    result = runner.invoke(app, ["estimate", "--model", "llama3-70b", "--gpus", "8", "--tp", "8", "--global-batch-size", "8"])
    assert result.exit_code == 1
    assert "does not fit" in result.output and "GiB" in result.output


def test_batch_not_divisible_exit_2():
    result = runner.invoke(app, BASE + ["--tp", "8", "--global-batch-size", "63"])
    assert result.exit_code == 2 and "not divisible" in result.output


def test_bad_input_exit_2_one_line():
    result = runner.invoke(app, ["estimate", "--gpus", "6", "--tp", "3", "--pp", "2", "--global-batch-size", "8"])
    assert result.exit_code == 2
    assert "tp=3 must divide num_attention_heads=32" in result.output and "Traceback" not in result.output
    result = runner.invoke(app, ["estimate", "--nodes", "1", "--gpus", "16"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    for flags in (["--schedule", "bogus"], ["--precision", "fp64"], ["--global-batch-size", "0"], ["--tp", "0"]):
        result = runner.invoke(app, ["estimate", *flags])
        assert result.exit_code == 2 and "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1
