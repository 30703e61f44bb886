"""`planner plan` verifies the plans of our own stack by trace by default (issue 20, item 2): the chosen plan and
each alternative it prints carry their traced peak; `--no-trace-memory` skips it; other stacks stay opt-in; without
torch the plan says it was not verified and still plans."""

import json

import pytest
from typer.testing import CliRunner

from planner.cli import app

runner = CliRunner()
MODEL = """name: tiny
num_layers: 4
hidden_size: 64
ffn_hidden_size: 176
num_attention_heads: 4
num_kv_heads: 2
vocab_size: 256
seq_len: 128
activation: swiglu
norm: rmsnorm
"""


@pytest.fixture
def args(tmp_path):
    spec = tmp_path / "tiny.yaml"
    spec.write_text(MODEL)
    return ["plan", "--model", str(spec), "--topology", "dgx-h100", "--gpus", "2", "--global-batch-size", "8",
            "--seq-len", "128", "--top-k", "2", "--json"]


def test_planner_stack_plans_are_verified_by_trace_by_default(args):
    pytest.importorskip("torch")
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    traced = plan["memory"]["traced"]
    assert traced["peak_bytes"] > 0 and traced["fits"] is True and traced["note"].startswith("traced by")
    assert plan["alternatives"] and all(alt["traced_peak_bytes"] > 0 for alt in plan["alternatives"])
    summary = runner.invoke(app, args[:-1])
    assert summary.exit_code == 0 and "memory by trace:" in summary.stdout and ", traced " in summary.stdout


def test_no_trace_memory_and_other_stacks_are_not_traced(args):
    skipped = runner.invoke(app, [*args, "--no-trace-memory"])
    assert skipped.exit_code == 0, skipped.output
    assert "traced" not in skipped.stdout
    other = runner.invoke(app, [*args, "--framework", "torchtitan"])
    assert other.exit_code == 0, other.output
    assert "traced" not in other.stdout


def test_without_torch_the_plan_says_so_and_still_plans(args, monkeypatch):
    """torch made unfindable at the seam planner.memory_trace checks (importlib.util.find_spec): no trace, the note
    says why, the formula's plan stands."""
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch" else real(name, *a))
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["memory"]["traced"]["note"].startswith("not verified by trace: torch not installed")
    assert "peak_bytes" not in plan["memory"]["traced"] or plan["memory"]["traced"]["peak_bytes"] is None
    baseline = json.loads(runner.invoke(app, [*args, "--no-trace-memory"]).stdout)
    assert plan["parallelism"] == baseline["parallelism"] and plan["batch"] == baseline["batch"]


def test_a_plan_verified_by_trace_passes_check(args, tmp_path):
    """`planner check` re-verifies a traced plan by trace (planner.check.recompute_plan), so the plan `planner plan`
    wrote by default is the one it recomputes."""
    pytest.importorskip("torch")
    folder = tmp_path / "plans"
    folder.mkdir()
    written = runner.invoke(app, [*args[:-1], "-o", str(folder / "tiny.json")])
    assert written.exit_code == 0, written.output
    checked = runner.invoke(app, ["check", str(folder)])
    assert checked.exit_code == 0, checked.output
    assert "passed: 1 plan(s), 0 failing" in checked.output
