"""`planner models list|show` through typer's CliRunner against the real app."""

import json
from pathlib import Path

from typer.testing import CliRunner

from planner.cli import app
from planner.models import list_presets

HF_DIR = Path(__file__).resolve().parents[1] / "data" / "hf"
runner = CliRunner()


def test_list_table_names_every_preset():
    result = runner.invoke(app, ["models", "list"], terminal_width=120)
    assert result.exit_code == 0, result.output
    for name in list_presets():
        assert name in result.output
    assert "46.70B" in result.output and "12.88B" in result.output  # mixtral-8x7b total and active


def test_list_json():
    result = runner.invoke(app, ["models", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == set(list_presets())
    ds = rows["deepseek-v3"]
    assert (ds["num_experts"], ds["top_k"], ds["num_layers"], ds["hidden_size"]) == (256, 8, 61, 7168)
    assert rows["llama3-70b"]["num_kv_heads"] == 8 and rows["llama3-70b"]["top_k"] is None
    assert rows["tinyllama-1.1b"]["total_params"] == 1_100_048_384


def test_show_preset_table():
    result = runner.invoke(app, ["models", "show", "mixtral-8x7b"], terminal_width=120)
    assert result.exit_code == 0, result.output
    assert "moe_expert_params" in result.output and "46,702,792,704" in result.output


def test_show_hf_config_json():
    result = runner.invoke(app, ["models", "show", str(HF_DIR / "qwen3-8b" / "config.json"), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["spec"]["qk_norm"] is True and report["spec"]["name"] == "qwen3-8b"
    params = report["params"]
    assert params["total"] == params["embedding"] + params["layers_total"] + params["head"]


def test_bad_input_exits_2_with_one_line():
    result = runner.invoke(app, ["models", "show", "llama3-8"])
    assert result.exit_code == 2
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and "llama3-8b" in lines[0]
    assert "Traceback" not in result.output


def test_unknown_model_type_exits_2(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5"}))
    result = runner.invoke(app, ["models", "show", str(path)])
    assert result.exit_code == 2 and "model_type='t5'" in result.output and "Traceback" not in result.output


def test_help_has_example():
    result = runner.invoke(app, ["models", "--help"])
    assert result.exit_code == 0 and "planner models show" in result.output
