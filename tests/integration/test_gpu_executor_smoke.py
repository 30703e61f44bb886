"""benchmarks/gpu_executor.py --smoke: the GPU truth loop's code path on the CPU (gloo, tiny shapes): it plans through
planner.api, runs each plan with the executor (planner run), and writes the report format that --derive and
benchmarks/executor_h100_accuracy.py read: every row a superset of validation/h100_executor_runs.json's rows."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytest.importorskip("torch")


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_failures_are_classified():
    gpu = _module("gpu_executor")
    assert gpu.classify_failure("rank 0: OutOfMemoryError: CUDA out of memory. Tried to allocate 7.81 GiB") == "oom"
    assert gpu.classify_failure("rank 0: RuntimeError: NCCL error") == "error"


def test_the_h100_matrix_covers_what_the_issue_asks():
    cases = _module("gpu_executor").h100_matrix()
    models = {c.name.split("_")[0] for c in cases}
    assert models == {"tl", "ll", "mx", "qw"}  # TinyLlama, wider dense, Mixtral-style and fine-grained MoE
    assert {c.precision for c in cases} == {"bf16", "amp-bf16"} and {c.recompute for c in cases} == {"none", "selective", "full"}
    assert {c.microbatch_size for c in cases} >= {None, 1, 2, 4, 8}  # None: the planner's first choice


@pytest.mark.slow
def test_smoke_run_writes_the_validation_row_format(tmp_path):
    out = tmp_path / "executor-smoke.json"
    assert _module("gpu_executor").main(["--smoke", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["command"].startswith("python benchmarks/gpu_executor.py --smoke") and report["device"] == "cpu"
    validation = json.loads((ROOT / "validation" / "h100_executor_runs.json").read_text())
    required = set().union(*(set(r) for r in validation if r["status"] == "ok" and r["preset"])) - {"preset", "hf_config_json"}
    rows = report["rows"]
    assert [r["status"] for r in rows] == ["ok"] * 3 and any(r["chosen_by_plan"] for r in rows)
    for row in rows:
        assert required <= set(row), required - set(row)
        assert row["recipe"] in ("autocast", "bf16-params") and row["peak_bytes"] > 0 and row["step_time_s"] > 0
    accuracy = _module("executor_h100_accuracy")
    assert all(accuracy.evaluate_row(r)["predicted_step_time_s"] > 0 for r in accuracy.load_rows(out))
