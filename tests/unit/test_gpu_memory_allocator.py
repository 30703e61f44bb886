"""benchmarks/gpu_memory_allocator.py's CPU parts: the dry path says in one line that nothing was measured, the
workload trains (Megatron-style buffers, hooks, optimizer shard) on CPU at tiny sizes, each child process gets only
its setting's allocator variables, and benchmarks/allocator_constants.py derives calibration.yaml's entries from a
synthetic results file by the envelope rule (and refuses what it cannot derive from)."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_memory_allocator.py"
GiB = 2**30


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_help_and_dry_run_need_no_gpu():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    done = subprocess.run([sys.executable, str(SCRIPT), "--dry-run"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.splitlines()[-1] == "dry run: nothing measured (no CUDA device here)"
    assert len(done.stdout.splitlines()) == 1 + 2 * 4  # every (setting, case), then the one line
    help_run = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert help_run.returncode == 0 and "--derive" in help_run.stdout
    measured = subprocess.run([sys.executable, str(SCRIPT), "-o", "unused.json"], capture_output=True, text=True,
                              timeout=120)
    assert measured.returncode == 2 and measured.stderr.count("\n") == 1 and "no CUDA device here" in measured.stderr
    assert "Traceback" not in measured.stderr


def test_workload_trains_like_megatron_on_cpu():
    """Gradients land in the fp32 main-gradient buffer (bf16 .grad freed by the hook); the step updates the
    optimizer's shard of the bf16 buffer and zeroes the main gradients."""
    torch = pytest.importorskip("torch")
    m = _module("gpu_memory_allocator")
    for shape in ("dense", "moe"):
        size = m.QUICK[shape]
        buffers = m.Buffers(torch, size, "cpu")
        before = buffers.param.clone()
        ids = torch.randint(0, size["vocab"], (2, 16))
        m.micro_batch_loss(torch, buffers, size, ids, "full").backward()
        assert all(p.grad is None for p in buffers.weights.values())
        assert buffers.main_grad.abs().sum() > 0
        buffers.step(torch)
        assert not torch.equal(buffers.param[buffers.shard], before[buffers.shard])
        assert torch.equal(buffers.param[buffers.shard.stop:], before[buffers.shard.stop:])  # other ranks' shards
        assert buffers.main_grad.abs().sum() == 0


def test_each_child_gets_only_its_setting(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "garbage_collection_threshold:0.5")  # the caller's, not ours
    out = tmp_path / "quick.json"
    done = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--quick", "--cases", "moe-skewed-routing",
                           "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = {r["allocator"]: r for r in json.loads(out.read_text())["rows"]}
    assert all(r["status"] == "ok" for r in rows.values())
    assert rows["default"]["env"] == {"PYTORCH_CUDA_ALLOC_CONF": None, "PYTORCH_ALLOC_CONF": None}
    assert set(rows["expandable_segments"]["env"].values()) == {"expandable_segments:True"}
    derived = subprocess.run([sys.executable, str(SCRIPT), "--derive", str(out)], capture_output=True, text=True,
                             timeout=120)
    assert derived.returncode == 2 and "no CUDA statistics" in derived.stderr  # a CPU run derives nothing


def _row(setting: str, case: str, allocated_gib: float, reserved_gib: float, **extra) -> dict:
    return {"allocator": setting, "case": case, "status": "ok", "peak_allocated_bytes": int(allocated_gib * GiB),
            "peak_reserved_bytes": int(reserved_gib * GiB), "quick": False,
            "expandable_segments_seen": setting == "expandable_segments", **extra}


def _synthetic(tmp_path) -> Path:
    rows = [_row("default", "a", 40.0, 45.0), _row("default", "b", 50.0, 60.0),  # needs 0.1 and 0.18
            _row("expandable_segments", "a", 40.0, 41.5), _row("expandable_segments", "b", 50.0, 50.5),  # 0.0125, 0
            {"allocator": "expandable_segments", "case": "c", "status": "oom"}]
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"device": "NVIDIA H100 80GB HBM3", "rows": rows}))
    return path


def test_derivation_is_the_envelope_rule(tmp_path):
    c = _module("allocator_constants")
    results = json.loads(_synthetic(tmp_path).read_text())
    derived = c.derive(results, GiB)
    assert derived["default"]["fraction"] == 0.18 and derived["default"]["worst"] == "b"
    assert derived["expandable_segments"]["fraction"] == 0.013  # 0.0125 rounded up, never down
    assert derived["expandable_segments"]["needs"]["b"] == 0.0  # reserved under allocated + fixed: needs nothing
    assert derived["expandable_segments"]["left_out"] == ["c: oom"]
    for setting, rows in (("default", results["rows"][:2]), ("expandable_segments", results["rows"][2:4])):
        f = derived[setting]["fraction"]
        assert all(r["peak_allocated_bytes"] * (1 + f) + GiB >= r["peak_reserved_bytes"] for r in rows)


def test_write_sets_expandable_and_only_raises_default(tmp_path):
    calibration = tmp_path / "calibration.yaml"
    shutil.copy(ROOT / "planner" / "cost" / "calibration.yaml", calibration)
    results = _synthetic(tmp_path)
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "allocator_constants.py"), str(results), "--write",
                           "--calibration", str(calibration)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    memory = yaml.safe_load(calibration.read_text())["memory"]
    assert memory["expandable_segments"]["fragmentation_fraction"] == 0.013
    assert memory["expandable_segments"]["source"].startswith("measured: envelope of 2 rows")
    assert memory["default"]["fragmentation_fraction"] == 0.18  # raised: the new rows need more than 0.094
    assert memory["default"]["fragmentation_fixed_bytes"] == memory["expandable_segments"]["fragmentation_fixed_bytes"] == GiB
    before = yaml.safe_load((ROOT / "planner" / "cost" / "calibration.yaml").read_text())
    after = yaml.safe_load(calibration.read_text())
    assert {k: v for k, v in after.items() if k != "memory"} == {k: v for k, v in before.items() if k != "memory"}


@pytest.mark.parametrize("mutate, message", [
    (lambda rows: [dict(r, expandable_segments_seen=False) for r in rows], "expandable_segments_seen"),
    (lambda rows: [r for r in rows if r["allocator"] == "default"] + [
        {"allocator": "expandable_segments", "case": "a", "status": "error"}], "allocator='expandable_segments': no row ran"),
    (lambda rows: [], "rows: missing or empty"),
])
def test_derivation_refuses_in_one_line(tmp_path, mutate, message):
    path = _synthetic(tmp_path)
    data = json.loads(path.read_text())
    data["rows"] = mutate(data["rows"])
    path.write_text(json.dumps(data))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "allocator_constants.py"), str(path)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr and done.stderr.count("\n") == 1, done.stderr
