"""CLI through typer's runner: export, check, explain, schema, serve --help; bad input exits 2 with one line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner.cli import app
from planner.io import canonical_json

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # the hand-built plans of the unit tests
from test_explain import with_alternative  # noqa: E402
from test_export import honest, make_plan  # noqa: E402

runner = CliRunner()


@pytest.fixture()
def plan_file(tmp_path):
    path = tmp_path / "plan.json"
    path.write_text(canonical_json(honest_with_alternative(honest(make_plan(dp=2, tp=4, pp=2, gbs=32)))))
    return path


def honest_with_alternative(plan):
    """with_alternative's runner-up (25% slower) and pruned counts on a plan whose own numbers stay as derived."""
    made = with_alternative(plan)
    alt = made.alternatives[0].model_copy(update={"step_time_s": 1.25 * plan.prediction.step_time_s})
    return plan.model_copy(update={"alternatives": (alt,), "pruned": made.pruned})


def one_error_line(result) -> str:
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


@pytest.mark.parametrize("target", ["torchtitan", "megatron", "deepspeed", "torchrun", "slurm"])
def test_export_every_target_to_file(plan_file, tmp_path, target):
    out = tmp_path / f"out.{target}"
    if target in ("torchrun", "slurm", "torchtitan"):  # our executor and torchtitan run ZeRO-2/3 with TP, not ZeRO-1
        plan_file.write_text(canonical_json(honest(make_plan(dp=2, tp=4, pp=2, gbs=32, zero=2))))
    result = runner.invoke(app, ["export", str(plan_file), "--to", target, "-o", str(out)])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    if target == "torchtitan":  # torchtitan 0.3: --module/--config plus overrides, no TOML
        assert "--parallelism.tensor_parallel_degree 4" in text and "PLANNER_TORCHTITAN_ARGS=(" in text
    if target == "deepspeed":
        assert json.loads(text)["train_batch_size"] == 32


def test_export_json_and_bad_inputs(plan_file, tmp_path):
    result = runner.invoke(app, ["export", str(plan_file), "--to", "megatron", "--json"])
    assert result.exit_code == 0 and "--tensor-model-parallel-size 4" in json.loads(result.stdout)["text"]
    bad = runner.invoke(app, ["export", str(plan_file), "--to", "jax"])
    assert bad.exit_code == 2 and "choose one of torchtitan" in one_error_line(bad)
    missing = runner.invoke(app, ["export", str(tmp_path / "nope.json"), "--to", "megatron"])
    assert missing.exit_code == 2 and "file not found" in one_error_line(missing)
    zero2 = tmp_path / "zero2.json"
    zero2.write_text(canonical_json(honest(make_plan(pp=2, zero=2))))
    refused = runner.invoke(app, ["export", str(zero2), "--to", "deepspeed"])
    assert refused.exit_code == 2 and "zero_stage=2 is not run by framework 'deepspeed' with pp > 1" in one_error_line(refused)


def test_explain_text_json_and_plot(plan_file, tmp_path):
    text = runner.invoke(app, ["explain", str(plan_file)])
    assert text.exit_code == 0 and "Why this configuration" in text.output and "Runner-up" in text.output
    png = tmp_path / "p.png"
    as_json = runner.invoke(app, ["explain", str(plan_file), "--json", "--plot", str(png)])
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["runner_up"]["slower_by"] == pytest.approx(0.25)
    assert png.read_bytes()[:4] == b"\x89PNG"
    garbage = tmp_path / "g.json"
    garbage.write_text("[1, 2")
    bad = runner.invoke(app, ["explain", str(garbage)])
    assert bad.exit_code == 2 and "malformed JSON" in one_error_line(bad)


@pytest.mark.parametrize("name", ["plan", "model", "topology", "profile", "request", "calibration", "runs"])
def test_schema_every_format(name, tmp_path):
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["schema", name, "-o", str(out)])
    assert result.exit_code == 0
    schema = json.loads(out.read_text())
    assert schema["$schema"].endswith("2020-12/schema") and schema["additionalProperties"] is False


def test_schema_all_and_unknown():
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0 and set(json.loads(result.stdout)) == {"plan", "model", "topology", "profile", "request",
                                                                          "calibration", "runs"}
    bad = runner.invoke(app, ["schema", "widget"])
    assert bad.exit_code == 2 and "choose one of plan" in one_error_line(bad)


def test_check_exit_codes(plan_file, tmp_path):
    bad = runner.invoke(app, ["check", str(tmp_path / "none")])
    assert bad.exit_code == 2 and "no such file" in one_error_line(bad)
    negative = runner.invoke(app, ["check", str(plan_file), "--tolerance", "-1"])
    assert negative.exit_code == 2


@pytest.mark.parametrize("command", ["export", "check", "explain", "serve", "schema"])
def test_help_has_examples(command):
    result = runner.invoke(app, [command, "--help"])
    assert result.exit_code == 0 and "Examples" in result.output and f"planner {command}" in result.output


def test_check_cli_on_real_estimates_passes_then_fails_on_worse_cost_model(tmp_path, monkeypatch):
    from planner import api
    from planner.cost import compute
    from planner.schemas.plan import Configuration, Parallelism

    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="megatron-core")
    for name, (tp, pp) in {"a": (4, 2), "b": (8, 1)}.items():
        config = Configuration(parallelism=Parallelism(dp=16 // (tp * pp), tp=tp, pp=pp, sp=True, zero_stage=1), recompute="selective")
        (tmp_path / f"{name}.json").write_text(canonical_json(api.estimate(request, config)))
    ok = runner.invoke(app, ["check", str(tmp_path)])
    assert ok.exit_code == 0 and "passed: 2 plan(s), 0 failing" in ok.output
    original = compute.gemm_time_s
    monkeypatch.setattr(compute, "gemm_time_s", lambda *a, **k: 1.2 * original(*a, **k))
    worse = runner.invoke(app, ["check", str(tmp_path)])
    assert worse.exit_code == 1 and "REGRESSED" in worse.output and "step time" in worse.output
    report = json.loads(runner.invoke(app, ["check", str(tmp_path), "--json", "--tolerance", "0.5"]).stdout)
    assert report["failed"] is False and all(r["relative_change"] > 0.02 for r in report["results"])


def test_committed_example_plans_pass_check():
    """examples/plans were made by `planner plan`/`estimate` (examples/README.md); today's planner must agree."""
    examples = Path(__file__).resolve().parents[2] / "examples" / "plans"
    result = runner.invoke(app, ["check", str(examples)])
    assert result.exit_code == 0, result.output
    assert "passed: 3 plan(s), 0 failing" in result.output
