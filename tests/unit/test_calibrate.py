"""`planner calibrate`: the user's own runs in, a calibration overlay out, plans priced with it.

Fixtures: tests/data/runlogs (Megatron-LM and torchtitan logs in the frameworks' own formats, cited in its README,
with synthetic step times made by make_logs.py at a known GEMM ceiling of 0.55 and overhead of 0.10 s).
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner import api
from planner.calibrate import measured_runs
from planner.cli import app
from planner.errors import BadInputError

RUNLOGS = Path(__file__).resolve().parents[1] / "data" / "runlogs"
MEGATRON = [str(RUNLOGS / name) for name in ("megatron-tp2.log", "megatron-tp4-pp2.log", "megatron-dp16.log")]
TITAN = [str(RUNLOGS / name) for name in ("torchtitan-fsdp8.log", "torchtitan-tp2.log")]
TITAN_CONFIGS = [str(RUNLOGS / name) for name in ("torchtitan-fsdp8.toml", "torchtitan-tp2.toml")]
TRUE_CEILING = 0.55
runner = CliRunner()


def test_megatron_logs_give_their_configuration_step_time_and_memory():
    runs, _ = measured_runs(MEGATRON)
    tp4 = runs[1]
    assert (tp4.gpus, tp4.global_batch_size, tp4.seq_len, tp4.framework) == (16, 128, 4096, "megatron-core")
    par = tp4.configuration.parallelism
    assert (par.dp, par.tp, par.pp, par.vpp, par.sp, par.zero_stage) == (2, 4, 2, 2, True, 1)
    assert tp4.configuration.schedule == "interleaved" and runs[2].configuration.recompute == "full"
    assert tp4.model.num_kv_heads == 8 and tp4.model.vocab_size == 128256 and tp4.model.activation == "swiglu"
    # the first interval (start-up, 1.9x) is left out; the median of the others is the generator's step time
    steady = [float(line.split("elapsed time per iteration (ms): ")[1].split(" |")[0]) / 1000
              for line in Path(MEGATRON[0]).read_text().splitlines() if "elapsed time per iteration" in line]
    assert len(steady) == 6 and runs[0].step_time_s == pytest.approx(statistics.median(steady[1:]))
    reserved = [float(line.split("max reserved: ")[1]) for line in Path(MEGATRON[1]).read_text().splitlines() if "max reserved" in line]
    assert len(reserved) == 2 and runs[1].peak_memory_gib == pytest.approx(max(reserved) / 1024)  # largest over ranks, MB -> GiB


def test_torchtitan_logs_with_their_config():
    runs, _ = measured_runs(TITAN, configs=TITAN_CONFIGS)
    fsdp, tp2 = runs
    assert (fsdp.gpus, fsdp.framework, fsdp.configuration.parallelism.zero_stage, fsdp.global_batch_size) == (8, "torchtitan", 3, 16)
    assert (tp2.configuration.parallelism.tp, tp2.configuration.parallelism.dp, tp2.configuration.recompute) == (2, 4, "full")
    assert fsdp.peak_memory_gib == pytest.approx(61.23)
    line = next(l for l in Path(TITAN[0]).read_text().splitlines() if "step: 11" in l)
    tps = int(line.split("tps: ")[1].split()[0].replace(",", "").split("\x1b")[0])
    assert fsdp.step_time_s == pytest.approx(16 * 4096 / (tps * 8), rel=0.01)


def test_round_trip_logs_in_overlay_out_error_printed_and_plans_priced_with_it(tmp_path):
    overlay_file = tmp_path / "cluster.yaml"
    result = runner.invoke(app, ["calibrate", *MEGATRON, "--topology", "dgx-h100", "-o", str(overlay_file)])
    assert result.exit_code == 0, result.output
    assert "leave-one-run-out error: median" in result.output and "GEMM ceiling" in result.output
    overlay = api.load_calibration(overlay_file)
    assert (overlay.framework, overlay.device_family) == ("megatron-core", "hopper")
    assert overlay.matmul_ceiling_fraction == pytest.approx(TRUE_CEILING, abs=0.03)  # the known constant recovered
    assert overlay.leave_one_out.runs == 3 and overlay.leave_one_out.median_abs_error < 0.05
    assert all(abs(r.predicted_overlay_s / r.measured_step_s - 1) < 0.03 for r in overlay.runs)
    assert all(abs(r.predicted_shipped_s / r.measured_step_s - 1) > 0.05 for r in overlay.runs)  # what it corrects
    assert yaml.safe_load(overlay_file.read_text())["provenance"]["inputs"][0].startswith(MEGATRON[0])
    args = ["--model", "llama3-8b", "--gpus", "16", "--tp", "2", "--sp", "--zero", "1", "--framework", "megatron-core",
            "--seq-len", "4096", "--global-batch-size", "128", "--json"]
    shipped = json.loads(runner.invoke(app, ["estimate", *args]).output)
    mine = json.loads(runner.invoke(app, ["estimate", *args, "--calibration", str(overlay_file)]).output)
    run = overlay.runs[0]  # megatron-tp2.log: this very configuration
    assert shipped["prediction"]["step_time_s"] == pytest.approx(run.predicted_shipped_s, rel=1e-6)
    assert mine["prediction"]["step_time_s"] == pytest.approx(run.predicted_overlay_s, rel=1e-6)
    assert mine["request"]["calibration"]["matmul_ceiling_fraction"] == overlay.matmul_ceiling_fraction
    assert "calibration" not in shipped["request"]
    planned = runner.invoke(app, ["plan", "--model", "llama3-8b", "--gpus", "16", "--framework", "megatron-core",
                                  "--seq-len", "4096", "--global-batch-size", "128", "--json", "--calibration", str(overlay_file)])
    assert planned.exit_code == 0 and json.loads(planned.output)["prediction"]["step_time_s"] > shipped["prediction"]["step_time_s"]


def test_a_json_of_runs_and_the_overlay_as_json(tmp_path):
    runs, _ = measured_runs(MEGATRON)
    data = {"topology": "dgx-h100", "runs": [json.loads(r.model_dump_json()) | {"model": "llama3-8b"} for r in runs]}
    (tmp_path / "runs.json").write_text(json.dumps(data))
    result = runner.invoke(app, ["calibrate", str(tmp_path / "runs.json"), "-o", str(tmp_path / "o.json")])
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "o.json").read_text())["matmul_ceiling_fraction"] == pytest.approx(TRUE_CEILING, abs=0.03)


def one_line_exit_2(args: list[str], needle: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and needle in result.output, result.output


def test_hostile_inputs_are_one_line_exit_2(tmp_path):
    (tmp_path / "empty.log").write_text("")
    one_line_exit_2(["calibrate", str(tmp_path / "empty.log"), "--topology", "dgx-h100", "-o", str(tmp_path / "o.yaml")],
                    "is empty")
    lines = Path(MEGATRON[0]).read_text().splitlines()
    no_args = [l for l in lines if "iteration" in l and "elapsed" in l]
    (tmp_path / "noargs.log").write_text("\n".join(no_args))
    one_line_exit_2(["calibrate", str(tmp_path / "noargs.log"), "--topology", "dgx-h100", "-o", str(tmp_path / "o.yaml")],
                    "no Megatron-LM arguments block")
    nan = [l.replace("elapsed time per iteration (ms): ", "elapsed time per iteration (ms): nan ") if "elapsed" in l else l for l in lines]
    nan = [l.replace("(ms): nan ", "(ms): nan |X", 1).split("|X")[0] + " |" if "(ms): nan" in l else l for l in nan]
    (tmp_path / "nan.log").write_text("\n".join(nan))
    one_line_exit_2(["calibrate", str(tmp_path / "nan.log"), "--topology", "dgx-h100", "-o", str(tmp_path / "o.yaml")], "is nan")
    one_line_exit_2(["calibrate", TITAN[0], "--topology", "dgx-h100", "-o", str(tmp_path / "o.yaml")], "--config")
    titan = Path(TITAN[0]).read_text()
    (tmp_path / "titan-nan.log").write_text(titan.replace("tps: ", "tps: nan ", 2).replace("tps: nan ", "tps: ", 1))
    one_line_exit_2(["calibrate", str(tmp_path / "titan-nan.log"), "--config", TITAN_CONFIGS[0], "--topology", "dgx-h100",
                     "-o", str(tmp_path / "o.yaml")], "tps is nan")
    (tmp_path / "bad.toml").write_text(Path(TITAN_CONFIGS[0]).read_text().replace("tensor_parallel_degree = 1", 'tensor_parallel_degree = "x"'))
    one_line_exit_2(["calibrate", TITAN[0], "--config", str(tmp_path / "bad.toml"), "--topology", "dgx-h100",
                     "-o", str(tmp_path / "o.yaml")], "tensor_parallel_degree")
    one_line_exit_2(["calibrate", MEGATRON[0], "-o", str(tmp_path / "o.yaml")], "--topology")
    (tmp_path / "bad.yaml").write_text("kind: calibration-overlay\nmatmul_ceiling_fraction: 7\n")
    one_line_exit_2(["estimate", "--model", "llama3-8b", "--gpus", "8", "--calibration", str(tmp_path / "bad.yaml")], "bad.yaml")
    assert not (tmp_path / "o.yaml").exists()


def test_an_overlay_for_another_stack_or_gpu_is_refused(tmp_path):
    overlay_file = tmp_path / "cluster.yaml"
    assert runner.invoke(app, ["calibrate", *MEGATRON, "--topology", "dgx-h100", "-o", str(overlay_file)]).exit_code == 0
    one_line_exit_2(["plan", "--model", "llama3-8b", "--gpus", "8", "--framework", "torchtitan", "--calibration", str(overlay_file)],
                    "derived for megatron-core on hopper")
    one_line_exit_2(["estimate", "--model", "llama3-8b", "--topology", "dgx-a100-80g", "--gpus", "8", "--framework",
                     "megatron-core", "--calibration", str(overlay_file)], "ampere")
    with pytest.raises(BadInputError, match="neither"):
        shutil.copy(MEGATRON[0], tmp_path / "x.txt")
        (tmp_path / "x.txt").write_text("hello\n")
        measured_runs([str(tmp_path / "x.txt")])
