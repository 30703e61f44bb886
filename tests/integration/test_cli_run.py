"""`planner launch` and `planner run` through the real typer app."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from executor_plans import make_plan, write_plan

from planner.cli import app


def invoke(*args, env=None):
    return CliRunner().invoke(app, [str(a) for a in args], env=env)


def two_node_plan(tmp_path):
    """dp2 x tp2 x pp2 over 2 nodes of 4 processes (rank r on node r // 4)."""
    plan = make_plan(dp=2, tp=2, pp=2, num_microbatches=2)
    from planner.schemas.topology import InterNodeFabric

    fabric = InterNodeFabric(kind="ethernet", nics_per_node=1, nic_bandwidth_GBps=1.0, latency_s=1e-4)
    topology = plan.request.topology.model_copy(update={"gpus_per_node": 4, "num_nodes": 2, "inter_node": fabric})
    ranks = tuple(r.model_copy(update={"node": r.rank // 4, "local_rank": r.rank % 4}) for r in plan.ranks)
    two_nodes = plan.model_copy(update={"ranks": ranks, "request": plan.request.model_copy(update={"topology": topology})})
    return write_plan(two_nodes, tmp_path / "plan.json")


def test_launch_prints_one_torchrun_per_host_and_writes_scripts(tmp_path):
    path = two_node_plan(tmp_path)
    out = tmp_path / "launch"
    result = invoke("launch", path, "--hosts", "gpu-a,gpu-b", "--master-port", "29600", "--steps", "50", "--out-dir", out)
    assert result.exit_code == 0, result.output
    for node, host in ((0, "gpu-a"), (1, "gpu-b")):
        line = (f"torchrun --nnodes 2 --nproc-per-node 4 --node-rank {node} --master-addr gpu-a --master-port 29600 "
                f"-m planner.executor.runtime {path} --steps 50")
        assert line in result.output
        assert f"node {node}: run on {host}" in result.output
        script = (out / f"node-{node}.sh").read_text()
        assert line in script and "export CUDA_DEVICE_MAX_CONNECTIONS=1" in script
    sbatch = (out / "job.sbatch").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "#SBATCH --nodelist=gpu-a,gpu-b" in sbatch and "#SBATCH --gpus-per-node=4" in sbatch
    assert "--node-rank $SLURM_NODEID" in sbatch and "srun --kill-on-bad-exit=1" in sbatch


def test_launch_json_and_refusals(tmp_path):
    import json

    path = two_node_plan(tmp_path)
    result = invoke("launch", path, "--hosts", "a,b", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output)
    assert [n["host"] for n in payload["nodes"]] == ["a", "b"] and payload["nnodes"] == 2 and payload["nproc_per_node"] == 4
    wrong = invoke("launch", path, "--hosts", "a,b,c")
    assert wrong.exit_code == 2 and "give exactly 2 hosts" in wrong.output
    twobw = write_plan(make_plan(pp=2, dp=2, zero_stage=1, schedule="2bw"), tmp_path / "2bw.json")
    refused = invoke("launch", twobw)
    assert refused.exit_code == 2 and "schedule=2bw with zero_stage=1" in refused.output and "Traceback" not in refused.output


def test_run_failing_rank_is_one_line_exit_1_and_no_report(tmp_path):
    path = write_plan(make_plan(pp=2, num_microbatches=2), tmp_path / "plan.json")
    report = tmp_path / "run.json"
    result = invoke("run", path, "--steps", "2", "--timeout-s", "60", "--report", report, env={"PLANNER_FAIL_RANK": "0"})
    assert result.exit_code == 1, result.output
    assert "rank 0 failed: RuntimeError: injected failure (PLANNER_FAIL_RANK=0) at step 1" in result.output
    assert "Traceback" not in result.output
    assert not report.exists()


def test_run_bad_options_exit_2(tmp_path):
    path = write_plan(make_plan(pp=2), tmp_path / "plan.json")
    result = invoke("run", path, "--resume")
    assert result.exit_code == 2 and "--checkpoint-dir" in result.output
