"""HSDP (dp_replicate > 1) priced as it runs (Zhao et al. 2023, PyTorch FSDP sec. 3.2.2; FSDP2 fully_shard on a
(replicate, shard) mesh, torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce): ZeRO-2/3 state
sharded over the dp/dp_replicate ranks of a shard group, its collectives on the shard group's link, plus an
all-reduce of the 1/dp_shard gradient shard across the replicas; reachable from `planner estimate` and `planner plan`
(--dp-replicate), re-derived by the plan check, refused where it cannot run."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.cost import comm, memory
from planner.cost.model import Candidate, CostModel

RUNNER = CliRunner()


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(api.build_request(model="llama3-8b", topology="dgx-h100", nodes=2))


def cand(zero: int, dp_replicate: int = 1, dp: int = 16) -> Candidate:
    return Candidate(dp=dp, tp=1, pp=1, zero_stage=zero, microbatch_size=1, num_microbatches=1024 // dp,
                     dp_replicate=dp_replicate)


def test_shard_and_replicate_links_follow_the_placement(model):
    """dp=16 over 2 nodes of 8, tp=1: a shard group is 8 consecutive dp coordinates (one node), a replicate group
    takes one rank of each node; plain FSDP's dp group spans both nodes."""
    plain, hsdp = model.links(cand(3)), model.links(cand(3, 2))
    assert (plain.dp.size, plain.dp.num_nodes, plain.dp_replicate) == (16, 2, None)
    assert (hsdp.dp.size, hsdp.dp.num_nodes, hsdp.dp.ranks_per_node) == (8, 1, 8)
    assert (hsdp.dp_replicate.size, hsdp.dp_replicate.num_nodes, hsdp.dp_replicate.ranks_per_node) == (2, 2, 1)


@pytest.mark.parametrize("zero", [2, 3])
def test_memory_per_rank_is_sharded_over_the_shard_group(model, zero):
    """Gradients, optimizer states (and ZeRO-3 weights) per rank: params x bytes / (dp / dp_replicate)."""
    hsdp, plain = model.detail(cand(zero, 2)), model.detail(cand(zero))
    dense = hsdp.dense_params
    w, g, o = memory.static_split(dense, model.recipe, zero_stage=zero, dp=8)
    np.testing.assert_allclose(hsdp.grad_bytes, g, rtol=1e-12)
    np.testing.assert_allclose(hsdp.optimizer_bytes, o, rtol=1e-12)
    np.testing.assert_allclose(hsdp.grad_bytes, 2 * plain.grad_bytes, rtol=1e-12)
    np.testing.assert_allclose(hsdp.optimizer_bytes, 2 * plain.optimizer_bytes, rtol=1e-12)
    if zero == 3:
        assert hsdp.weight_bytes.sum() > plain.weight_bytes.sum()


def test_zero2_comm_is_shard_group_collectives_plus_replica_all_reduce(model):
    """ZeRO-2 HSDP: m reduce-scatters and one all-gather on the shard link, m all-reduces of grads/dp_shard over
    the replicate link (foreach_reduce: reduce_scatter then all_reduce per backward)."""
    from planner.cost.evaluate import dp_comm_s

    c = cand(2, 2)
    links, params, m = model.links(c), 1e9, c.num_microbatches
    reduce_bytes = model.recipe.grad_reduce_bytes if model.options.grad_reduce_fp32 else min(model.recipe.grad_reduce_bytes, 2)
    grads, weights = params * reduce_bytes, params * model.recipe.gather_bytes
    expected = (m * comm.reduce_scatter_s(grads, group=links.dp) + comm.all_gather_s(weights, group=links.dp)
                + m * comm.ring_all_reduce_s(grads / 8, group=links.dp_replicate))
    assert dp_comm_s(model, c, params, 0.0) == pytest.approx(expected, rel=1e-12)
    assert expected != pytest.approx(dp_comm_s(model, cand(2), params, 0.0), rel=1e-3)


def test_zero3_comm_adds_the_replica_all_reduce_to_the_shard_groups_fsdp(model):
    from planner.cost.evaluate import dp_comm_s

    c = cand(3, 2)
    links, params, m = model.links(c), 1e9, c.num_microbatches
    reduce_bytes = model.recipe.grad_reduce_bytes if model.options.grad_reduce_fp32 else min(model.recipe.grad_reduce_bytes, 2)
    without = dp_comm_s(model, c, params, 0.0, links=dataclasses.replace(links, dp_replicate=None))
    expected = without + m * comm.ring_all_reduce_s(params * reduce_bytes / 8, group=links.dp_replicate)
    assert dp_comm_s(model, c, params, 0.0) == pytest.approx(expected, rel=1e-12)
    assert expected > without > 0


def _estimate(*extra: str) -> dict:
    result = RUNNER.invoke(app, ["estimate", "--model", "tinyllama-1.1b", "--gpus", "16", "--zero", "3", "--json", *extra])
    assert result.exit_code in (0, 1), result.output
    return json.loads(result.output)


def test_estimate_with_dp_replicate_differs_from_fsdp_as_the_formula_says():
    plain, hsdp = _estimate(), _estimate("--dp-replicate", "2")
    assert "dp_replicate" not in plain["parallelism"] and hsdp["parallelism"]["dp_replicate"] == 2
    p, h = plain["memory"]["per_stage"][0], hsdp["memory"]["per_stage"][0]
    for part in ("grads_bytes", "optimizer_bytes"):
        assert h[part] == pytest.approx(2 * p[part], rel=1e-9), part  # ZeRO-3: sharded over 8 ranks, not 16
    assert hsdp["prediction"]["breakdown"]["dp_comm_exposed_s"] != plain["prediction"]["breakdown"]["dp_comm_exposed_s"]


def test_plan_with_dp_replicate_keeps_it_and_rederives_to_itself(tmp_path):
    from planner.io import load_file
    from planner.launch_spec.runnable import check_runnable
    from planner.plan_verify import differences, rederived, verify_plan
    from planner.schemas.plan import LaunchPlan

    out = tmp_path / "plan.json"
    result = RUNNER.invoke(app, ["plan", "--model", "tinyllama-1.1b", "--gpus", "16", "--dp-replicate", "2",
                                 "--time-limit", "30", "--top-k", "1", "-o", str(out)])
    assert result.exit_code == 0, result.output
    plan = load_file(LaunchPlan, out)
    assert plan.parallelism.dp_replicate == 2 and plan.parallelism.zero_stage in (2, 3)
    assert all(alt.parallelism.dp_replicate == 2 for alt in plan.alternatives)
    assert differences(plan, rederived(plan)) == []
    verify_plan(plan, source=str(out))
    assert any("HSDP: dp=16 runs as 2 replicas x 8 FSDP shards" in note for note in check_runnable(plan))
    checked = RUNNER.invoke(app, ["check", str(out)])  # recomputed from its request: the search keeps dp_replicate
    assert checked.exit_code == 0, checked.output


@pytest.mark.parametrize(("args", "message"), [
    (["estimate", "--gpus", "4", "--zero", "3", "--dp-replicate", "3"], "dp_replicate=3 must divide dp=4"),
    (["plan", "--gpus", "4", "--dp", "4", "--dp-replicate", "3"], "dp_replicate=3 must divide dp=4"),
    (["estimate", "--gpus", "4", "--zero", "0", "--dp-replicate", "2", "--framework", "torchtitan"],
     "zero_stage=0 has no shards; use zero_stage 2 or 3"),
    (["estimate", "--gpus", "4", "--zero", "1", "--dp-replicate", "2"], "dp_replicate=2 (HSDP) shards with FSDP2"),
    (["estimate", "--gpus", "4", "--zero", "3", "--dp-replicate", "0"], "--dp-replicate=0 must be at least 1"),
])
def test_hostile_dp_replicate_is_one_line_exit_2(args, message):
    result = RUNNER.invoke(app, [*args, "--model", "tinyllama-1.1b"])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("command", ["estimate", "plan"])
def test_a_stack_without_hsdp_is_refused(tmp_path, command):
    from pathlib import Path

    import planner

    yaml_text = (Path(planner.__file__).parent / "data" / "frameworks" / "torchtitan.yaml").read_text()
    assert "hsdp: true" in yaml_text
    profile = tmp_path / "no-hsdp.yaml"
    profile.write_text(yaml_text.replace("hsdp: true", "hsdp: false"))
    extra = ["--zero", "3"] if command == "estimate" else []
    result = RUNNER.invoke(app, [command, "--model", "tinyllama-1.1b", "--gpus", "4", "--dp-replicate", "2",
                                 "--framework", str(profile), *extra])
    assert result.exit_code == 2, result.output
    assert "has no hybrid sharding (HSDP)" in result.output and len(result.output.strip().splitlines()) == 1


@pytest.mark.parametrize("fixed", [{}, {"pp": 2}])
def test_search_with_dp_replicate_equals_exhaustive(fixed):
    """dp_replicate fixed by the request: every member the search keeps is HSDP over ZeRO-2/3 with dp a multiple
    of it, and the pruned search ranks as evaluating everything does (two nodes: shard and replicate groups)."""
    from pathlib import Path

    from planner.schemas.model import ModelSpec
    from planner.schemas.plan import SearchLimits
    from planner.search.driver import search

    small = ModelSpec(name="small", num_layers=8, hidden_size=512, ffn_hidden_size=1536, num_attention_heads=8,
                      num_kv_heads=4, vocab_size=8000, seq_len=1024, activation="swiglu", norm="rmsnorm")
    everything = str(Path(__file__).resolve().parents[1] / "data" / "frameworks" / "everything.yaml")
    limits = SearchLimits(max_microbatch_size=2, top_k=3, tp_overlap=("none",), dp_replicate=2, fixed=fixed)
    request = api.build_request(model=small, topology="dgx-h100", gpus=16, global_batch_size=32, seq_len=1024,
                                search=limits, framework=everything)
    pruned, full = search(request), search(request, exhaustive=True)
    summary = lambda r: [(s.key, s.stage_layers, s.full_recompute_layers) for s in r.ranked]  # noqa: E731
    assert pruned.ranked and summary(pruned) == summary(full)
    assert all(s.cand.dp_replicate == 2 and s.cand.zero_stage in (2, 3) and s.cand.dp % 2 == 0 for s in full.ranked)


def test_exports_write_hsdp_or_refuse_it(tmp_path):
    """torchtitan spells HSDP (data_parallel_replicate_degree x data_parallel_shard_degree, mesh [pp, dp_replicate,
    dp_shard, cp, tp]); the Megatron and DeepSpeed exporters write no hybrid-sharding flags, so they refuse."""
    out = tmp_path / "plan.json"
    made = RUNNER.invoke(app, ["estimate", "--model", "tinyllama-1.1b", "--gpus", "16", "--zero", "3", "--dp-replicate", "2",
                               "--framework", "torchtitan", "-o", str(out)])
    assert made.exit_code == 0, made.output
    exported = RUNNER.invoke(app, ["export", str(out), "--to", "torchtitan"])
    assert exported.exit_code == 0, exported.output
    assert "--parallelism.data_parallel_replicate_degree 2" in exported.output
    assert "--parallelism.data_parallel_shard_degree 8" in exported.output
    for target in ("megatron", "deepspeed"):
        refused = RUNNER.invoke(app, ["export", str(out), "--to", target])
        assert refused.exit_code == 2 and "dp_replicate=2 (HSDP)" in refused.output, refused.output
