"""`planner topology list|show|validate` through typer's CliRunner against the real app."""

import json

import yaml
from typer.testing import CliRunner

from planner.cli import app
from planner.topology import list_topologies, load_topology

runner = CliRunner()


def test_list_table_and_json():
    result = runner.invoke(app, ["topology", "list"], terminal_width=160)
    assert result.exit_code == 0, result.output
    for name in list_topologies():
        assert name in result.output
    result = runner.invoke(app, ["topology", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.output)}
    assert set(rows) == set(list_topologies())
    assert rows["dgx-h100"]["intra_bandwidth_GBps"] == 360.0 and rows["dgx-h100"]["nic_share_GBps"] == 45.0
    assert rows["aws-p4d"]["nic_share_GBps"] == 5.5
    assert rows["gb200-nvl72"]["gpus_per_node"] == 72


def test_show_reports_tp_and_dp_links():
    result = runner.invoke(app, ["topology", "show", "dgx-h100", "--nodes", "4", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["num_gpus"] == 32 and report["topology"]["num_nodes"] == 4
    groups = {row["group"]: row for row in report["groups"]}
    assert groups["tp=8"]["bandwidth_GBps"] == 360.0 and groups["tp=8"]["num_nodes"] == 1
    assert groups["dp=4 (tp=8)"]["bandwidth_GBps"] == 45.0 and groups["dp=4 (tp=8)"]["num_nodes"] == 4
    table = runner.invoke(app, ["topology", "show", "mi300x-8"], terminal_width=160)
    assert table.exit_code == 0, table.output
    assert "MI300X" in table.output and "infinity_fabric" in table.output and "tp=2" in table.output


def test_show_unknown_preset_exits_2_with_suggestion():
    result = runner.invoke(app, ["topology", "show", "dgx-a100"])
    assert result.exit_code == 2
    assert "did you mean" in result.output and "dgx-a100-80g" in result.output
    assert "Traceback" not in result.output


def test_validate_good_and_bad_files(tmp_path):
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(load_topology("aws-p5").model_dump(mode="json")))
    result = runner.invoke(app, ["topology", "validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid topology 'aws-p5'" in result.output
    data = load_topology("aws-p5").model_dump(mode="json")
    data["intra_node"]["bandwidth_GBps"] = -5
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["topology", "validate", str(bad)])
    assert result.exit_code == 2
    assert "intra_node.bandwidth_GBps" in result.output and "-5" in result.output and "fix:" in result.output
    malformed = tmp_path / "malformed.yaml"
    malformed.write_text("name: [x\n")
    result = runner.invoke(app, ["topology", "validate", str(malformed)])
    assert result.exit_code == 2 and "malformed YAML" in result.output


def test_help_has_examples():
    result = runner.invoke(app, ["topology", "--help"], terminal_width=160)
    assert result.exit_code == 0
    assert "planner topology show dgx-h100 --nodes 4" in result.output
