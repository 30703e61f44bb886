"""`planner profile` and `planner profile comm` through typer's CliRunner: a tiny model profiled end to end,
partial results kept on interrupt, bad input (no CUDA, unknown model type, missing output) as exit 2,
a 2-process gloo calibration, and `estimate --profile` using the measured numbers."""

import json

import pytest
from typer.testing import CliRunner

pytest.importorskip("torch")

from planner.cli import app  # noqa: E402
from planner.profiling.calibration import CommCalibration  # noqa: E402
from planner.schemas.profile import Profile  # noqa: E402

runner = CliRunner()
TINY = """name: tiny-cli
num_layers: 2
hidden_size: 32
ffn_hidden_size: 64
num_attention_heads: 4
num_kv_heads: 2
vocab_size: 128
seq_len: 16
activation: swiglu
norm: rmsnorm
position: rope
"""
FAST = ["--seq-len", "16", "--repeats", "1", "--warmup", "0", "--no-ops", "--threads", "1"]


@pytest.fixture
def tiny_spec(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


def test_profile_writes_a_valid_profile(tiny_spec, tmp_path):
    out = tmp_path / "p.json"
    result = runner.invoke(app, ["profile", "--model", tiny_spec, "--microbatch-size", "1,2", "--tp", "1,2", *FAST, "-o", str(out)])
    assert result.exit_code == 0, result.output
    profile = Profile.model_validate_json(out.read_text())
    assert len(profile.entries) == 3 * 2 * 2 and all(e.status == "ok" for e in profile.entries)
    assert profile.command.startswith("planner profile --model") and profile.device.startswith("cpu")
    assert f"wrote {out}" in result.stdout


def test_interrupt_keeps_the_measured_shapes(tiny_spec, tmp_path, monkeypatch):
    from planner.profiling import measure

    real, calls = measure.profile_shape, []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(measure, "profile_shape", interrupted)
    out = tmp_path / "partial.json"
    result = runner.invoke(app, ["profile", "--model", tiny_spec, *FAST, "-o", str(out)])
    assert result.exit_code == 130
    assert len(Profile.model_validate_json(out.read_text()).entries) == 1


def test_cuda_without_gpu_unknown_model_type_and_missing_output_are_bad_input(tiny_spec, tmp_path):
    import torch

    if not torch.cuda.is_available():
        result = runner.invoke(app, ["profile", "--model", tiny_spec, "--device", "cuda", "-o", str(tmp_path / "x.json")])
        assert result.exit_code == 2
        assert "CUDA requested but torch.cuda.is_available() is False: use --device cpu" in result.output
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "mamba", "hidden_size": 64}))
    result = runner.invoke(app, ["profile", "--model", str(config), "-o", str(tmp_path / "y.json")])
    assert result.exit_code == 2 and "mamba" in result.output
    result = runner.invoke(app, ["profile", "--model", tiny_spec])
    assert result.exit_code == 2 and "--output" in result.output
    result = runner.invoke(app, ["profile", "--model", tiny_spec, "--tp", "3", "-o", str(tmp_path / "z.json")])
    assert result.exit_code == 2 and "tp=[3]" in result.output


def test_comm_calibration_with_two_gloo_processes(tmp_path):
    out = tmp_path / "comm.json"
    result = runner.invoke(app, ["profile", "comm", "--nprocs", "2", "--sizes", "4096,262144", "--collectives",
                                 "all_reduce,all_gather,send_recv", "--repeats", "2", "--warmup", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    calibration = CommCalibration.model_validate_json(out.read_text())
    assert [f.collective for f in calibration.fits] == ["all_reduce", "all_gather", "send_recv"]
    for fit in calibration.fits:
        assert [p.message_bytes for p in fit.points] == [4096, 262144]
        assert all(p.time_s > 0 for p in fit.points) and fit.bus_bandwidth_GBps > 0
    assert calibration.backend == "gloo" and calibration.world_size == 2


def test_estimate_uses_the_profile(tiny_spec, tmp_path):
    out = tmp_path / "p.json"
    assert runner.invoke(app, ["profile", "--model", tiny_spec, "--microbatch-size", "1,2", *FAST, "-o", str(out)]).exit_code == 0
    args = ["estimate", "--model", tiny_spec, "--topology", "cpu", "--gpus", "1", "--microbatch-size", "2",
            "--global-batch-size", "2", "--seq-len", "16", "--json"]
    measured = json.loads(runner.invoke(app, [*args, "--profile", str(out)]).stdout)
    analytic = json.loads(runner.invoke(app, args).stdout)
    assert any("compute measured" in note and "decoder(tp=1" in note for note in measured["notes"])
    assert not any("compute measured" in note for note in analytic["notes"])
    assert measured["prediction"]["step_time_s"] != analytic["prediction"]["step_time_s"]
    uncovered = json.loads(runner.invoke(app, [*args[:-3], "--seq-len", "8", "--json", "--profile", str(out)]).stdout)
    assert any("compute analytic for decoder" in note for note in uncovered["notes"])


def test_profile_the_huggingface_implementation(tiny_spec, tmp_path):
    pytest.importorskip("transformers")
    out = tmp_path / "hf.json"
    result = runner.invoke(app, ["profile", "--hf", "--model", tiny_spec, "--layer-types", "decoder,head", *FAST, "-o", str(out)])
    assert result.exit_code == 0, result.output
    profile = Profile.model_validate_json(out.read_text())
    decoder, head = profile.entries
    assert decoder.layer_type == "decoder" and "selective recompute not measured" in decoder.message
    # the HF Llama layer has the same parameters as planner.nn's: 2 norms, q/k/v/o, gate/up/down
    h, f, kv_dim = 32, 64, 2 * 8
    assert decoder.params_bytes == 4 * (2 * h + h * h + 2 * h * kv_dim + h * h + 3 * h * f)
    assert head.params_bytes == 4 * (h + 128 * h)
