"""A stated MoE dispatcher, MoE overlap and context-parallel flavour are priced as stated (planner.cost.pins), recorded
in the plan, re-derived from it, exported as the flags that run them, and refused in one line where the stack does
not run them; without a statement the cost prices the fastest (moe_comm.choose), one dispatcher for every MoE layer."""

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.cost import arrays, moe_comm
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import options_for
from planner.errors import BadInputError
from planner.export import export_plan
from planner.models import load_model
from planner.plan_verify import rederived
from planner.schemas.plan import Configuration, Parallelism, PlanRequest, SearchLimits

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
MIXTRAL = dict(model="mixtral-8x7b", topology="dgx-h100", gpus=64, global_batch_size=128, seq_len=4096,
               framework="megatron-core")


def _estimate(request_kw=None, **par):
    request = api.build_request(**(request_kw or MIXTRAL))
    fields = dict(dp=16, tp=1, pp=4, ep=8, vpp=2, zero_stage=1) | par
    config = Configuration(parallelism=Parallelism(**fields), microbatch_size=1,
                           schedule="interleaved" if fields["vpp"] > 1 else "1f1b")
    return api.estimate(request, config)


def test_the_fastest_unless_stated():
    free = _estimate()
    assert free.parallelism.moe_dispatcher in moe_comm.OVERLAPPED_DISPATCHERS and free.parallelism.moe_overlap == "batch"
    stated = _estimate(moe_dispatcher="alltoall", moe_overlap="none")
    assert (stated.parallelism.moe_dispatcher, stated.parallelism.moe_overlap) == ("alltoall", "none")
    assert stated.prediction.breakdown.ep_comm_s > free.prediction.breakdown.ep_comm_s
    assert stated.prediction.step_time_s > free.prediction.step_time_s
    for name in ("alltoall", "flex", "allgather"):  # each stated one is priced, none beats the free choice
        assert _estimate(moe_dispatcher=name).prediction.step_time_s >= free.prediction.step_time_s
    assert _estimate(moe_dispatcher="allgather").parallelism.moe_overlap == "none"  # it runs no batch overlap


def test_a_recorded_choice_re_derives_and_exports():
    for par in ({}, {"moe_dispatcher": "alltoall", "moe_overlap": "none"}, {"moe_dispatcher": "alltoall"}):
        plan = _estimate(**par)
        again = rederived(plan)
        assert again.prediction == plan.prediction and again.parallelism == plan.parallelism
    text = export_plan(_estimate(moe_dispatcher="alltoall", moe_overlap="none"), "megatron").text
    assert "--moe-token-dispatcher-type alltoall" in text and "--overlap-moe-expert-parallel-comm" not in text
    assert "--overlap-moe-expert-parallel-comm" in export_plan(_estimate(moe_dispatcher="alltoall"), "megatron").text


def _accepted(plan, export) -> bool:
    """Megatron-Core's own TransformerConfig judges the export (planner.export.judges), where installed."""
    pytest.importorskip("megatron.core")
    from planner.export.judges import judge
    from planner.export.verdicts import JudgeUnavailable

    try:
        return judge(plan, export).accepted
    except JudgeUnavailable as exc:
        pytest.skip(str(exc))


def test_shared_expert_overlap_stated():
    kw = dict(MIXTRAL, model=str(HF / "deepseek-v2-lite"), gpus=16, global_batch_size=32)
    plan = _estimate(kw, dp=16, pp=1, vpp=1, ep=16, moe_dispatcher="alltoall", moe_overlap="shared")
    assert plan.parallelism.moe_overlap == "shared"
    export = export_plan(plan, "megatron")
    assert "--moe-shared-expert-overlap" in export.text and _accepted(plan, export)
    none = _estimate(kw, dp=16, pp=1, vpp=1, ep=16, moe_dispatcher="alltoall", moe_overlap="none")
    assert none.prediction.breakdown.ep_comm_s > plan.prediction.breakdown.ep_comm_s
    export = export_plan(none, "megatron")
    assert "--moe-shared-expert-overlap" not in export.text and _accepted(none, export)
    batch = _estimate(kw, dp=16, pp=1, vpp=1, ep=16, moe_dispatcher="alltoall", moe_overlap="batch")
    export = export_plan(batch, "megatron")
    assert "--overlap-moe-expert-parallel-comm" in export.text and _accepted(batch, export)


@pytest.mark.parametrize("request_kw,par,words", [
    (dict(MIXTRAL, framework="torchtitan"), dict(moe_dispatcher="flex", pp=1, vpp=1, dp=64, ep=8, zero_stage=3),
     "moe_dispatcher='flex': torchtitan runs only alltoall"),
    (MIXTRAL, dict(moe_overlap="shared"), "the model has no shared experts"),
    (MIXTRAL, dict(moe_dispatcher="allgather", moe_overlap="batch"), "runs with the alltoall or flex dispatcher only"),
    (MIXTRAL, dict(moe_overlap="batch", vpp=1), "only with virtual stages when pp > 1"),
    (dict(MIXTRAL, framework="torchtitan"), dict(moe_overlap="batch", pp=1, vpp=1, dp=64, ep=8, zero_stage=3),
     "torchtitan does not run it"),
    (MIXTRAL, dict(moe_dispatcher="alltoall", ep=1), "needs an MoE model with ep > 1"),
    (MIXTRAL, dict(cp_comm_type="a2a"), "needs cp > 1"),
    (MIXTRAL, dict(cp=2, dp=8, ep=8, cp_comm_type="ring"), "cp_comm_type='ring': megatron-core runs p2p"),
])
def test_refused_in_one_line(request_kw, par, words):
    with pytest.raises(BadInputError) as err:
        _estimate(request_kw, **par)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_cli_flags():
    runner = CliRunner()
    base = ["estimate", "--model", "mixtral-8x7b", "--gpus", "64", "--pp", "4", "--vpp", "2", "--schedule", "interleaved",
            "--ep", "8", "--seq-len", "4096", "--global-batch-size", "128", "--zero", "1", "--framework", "megatron-core"]
    out = runner.invoke(app, base + ["--moe-dispatcher", "alltoall", "--moe-overlap", "none", "--json"])
    assert out.exit_code == 0, out.output
    assert json.loads(out.output)["parallelism"]["moe_overlap"] == "none"
    bad = runner.invoke(app, base + ["--moe-overlap", "sometimes"])
    assert bad.exit_code == 2 and "--moe-overlap=sometimes: choose one of batch, shared, none" in bad.output


def test_one_dispatcher_for_every_moe_layer():
    """Qwen3-Next's Gated DeltaNet and attention MoE layers price one dispatcher (a run has one
    --moe-token-dispatcher-type), the one of the least MoE communication over the model: the step of the free
    choice is the least of the steps with each dispatcher stated."""
    # megatron-core's profile refuses to export Gated DeltaNet; its MoE costs are what is compared here
    request = PlanRequest(model=load_model(str(HF / "qwen3-next-80b-a3b")), topology=api.load_topology("dgx-h100", gpus=32),
                          gpus=32, global_batch_size=64, seq_len=4096, framework="megatron-core")
    cand = Candidate(dp=32, tp=1, pp=1, ep=32, microbatch_size=1, num_microbatches=2, zero_stage=1)
    free = CostModel(request)
    kinds = arrays.kind_costs(free, cand, free.links(cand), arrays.moe_batch_overlap(free, cand))
    chosen = {cost.moe_dispatcher for cost in kinds.values() if cost.moe_dispatcher}
    assert len(chosen) == 1
    steps = {name: CostModel(request, options=dataclasses.replace(options_for("megatron-core", "bf16"),
                                                                  moe_dispatchers=(name,))).evaluate(cand).step_time_s
             for name in ("alltoall", "flex", "allgather")}
    assert free.evaluate(cand).step_time_s == pytest.approx(min(steps.values()))
    assert arrays.priced_choices(free, cand)[0] in chosen and chosen <= set(moe_comm.OVERLAPPED_DISPATCHERS) | {"allgather"}
    links, overlap = free.links(cand), arrays.moe_batch_overlap(free, cand)
    forced = arrays.one_dispatcher(free, cand, links, overlap, ["alltoall", "flex"])  # as where the kinds disagree
    assert len({cost.moe_dispatcher for cost in forced.values() if cost.moe_dispatcher}) == 1
    counts = {name: int(mask.sum()) for name, (_, _, mask) in arrays.layer_kinds(free).items()}

    def total(name):
        kinds = arrays.kinds_with(free, cand, links, overlap, (name,))
        return sum(counts.get(k, 0) * (c.ep_fwd_s + c.ep_bwd_s + c.selective_s) for k, c in kinds.items() if c.moe_dispatcher)

    assert next(c.moe_dispatcher for c in forced.values() if c.moe_dispatcher) == min(("alltoall", "flex"), key=total)


def test_a_search_runs_only_what_the_job_states():
    """`planner plan --moe-dispatcher/--moe-overlap` (SearchLimits): every configuration priced with them, the plan
    records them, and it re-derives."""
    limits = SearchLimits(time_limit_s=30, top_k=1, moe_dispatcher="alltoall", moe_overlap="none")
    request = api.build_request(**MIXTRAL, search=limits)
    plan = api.plan(request)
    assert (plan.parallelism.moe_dispatcher, plan.parallelism.moe_overlap) in (("alltoall", "none"), (None, None))
    assert rederived(plan).prediction == plan.prediction
    free = api.plan(api.build_request(**MIXTRAL, search=SearchLimits(time_limit_s=30, top_k=1)))
    assert free.prediction.step_time_s <= plan.prediction.step_time_s
    with pytest.raises(BadInputError, match="moe_overlap='shared': the model has no shared experts"):
        api.plan(api.build_request(**MIXTRAL, search=SearchLimits(moe_overlap="shared")))
    runner = CliRunner()
    bad = runner.invoke(app, ["plan", "--model", "mixtral-8x7b", "--gpus", "64", "--moe-dispatcher", "deepep"])
    assert bad.exit_code == 2 and "--moe-dispatcher='deepep': choose one of alltoall, flex, allgather" in bad.output


def test_the_dispatchers_a_stack_runs_are_its_expert_parallel_flavours():
    """One home: capabilities.expert_parallel.flavours is what the cost chooses among and a pin is checked against."""
    from pydantic import ValidationError

    from planner.cost.pins import dispatchers_run
    from planner.frameworks import load_framework
    from planner.schemas.framework import ExpertParallel

    for name in api.list_frameworks():
        profile = load_framework(name)
        ep = profile.capabilities.expert_parallel
        if ep.supported:
            assert set(dispatchers_run(options_for(profile, "bf16"))) == set(ep.flavours), name
    with pytest.raises(ValidationError, match="not token dispatchers"):
        ExpertParallel(supported=True, span="dp", flavours=("alltoall", "deepep"), source="x")
    with pytest.raises(ValidationError, match="list it"):
        ExpertParallel(supported=True, span="dp", flavours=("flex",), source="x")


def test_expert_load_is_a_flag():
    """--routing-skew / --capacity-factor set the model's MoESpec fields (planner.api.with_moe_fields): a skew slows
    the slowest EP rank, a capacity factor below 1 + skew caps it; a dense model or a bad value is one line."""
    base = api.build_request(**MIXTRAL)
    skewed = api.build_request(**MIXTRAL, moe=dict(routing_skew=0.3))
    capped = api.build_request(**MIXTRAL, moe=dict(routing_skew=0.3, capacity_factor=1.1))
    assert skewed.model.moe.routing_skew == 0.3 and capped.model.moe.capacity_factor == 1.1
    config = Configuration(parallelism=Parallelism(dp=16, tp=1, pp=4, ep=8, vpp=2, zero_stage=1), schedule="interleaved")
    times = [api.estimate(r, config).prediction.step_time_s for r in (base, skewed, capped)]
    assert times[0] < times[2] < times[1]
    with pytest.raises(BadInputError, match="--routing-skew given for llama3-8b, which has no experts"):
        api.build_request(model="llama3-8b", moe=dict(routing_skew=0.1))
    runner = CliRunner()
    bad = runner.invoke(app, ["estimate", "--model", "mixtral-8x7b", "--gpus", "8", "--ep", "8", "--capacity-factor", "0"])
    assert bad.exit_code == 2 and "capacity_factor" in bad.output and len(bad.output.strip().splitlines()) == 1


def test_the_service_estimate_takes_the_same_statements():
    """POST /v1/estimate (planner.service.worker.solve): the body's dispatcher, overlap and expert load reach the
    estimate; a pin the stack does not run is a 422 with one line."""
    from planner.service.worker import solve

    body = dict(model="mixtral-8x7b", topology="dgx-h100", gpus=64, global_batch_size=128, seq_len=4096,
                framework="megatron-core", dp=16, pp=4, vpp=2, ep=8, zero_stage=1, schedule="interleaved",
                moe_dispatcher="alltoall", moe_overlap="none", routing_skew=0.2)
    status, text = solve("estimate", json.dumps(body), 64)
    assert status == 200, text
    plan = json.loads(text)
    assert plan["parallelism"]["moe_overlap"] == "none" and plan["request"]["model"]["moe"]["routing_skew"] == 0.2
    assert "moe_dispatcher" not in plan["request"]["search"]  # an estimate states it in its Parallelism only
    status, text = solve("estimate", json.dumps(dict(body, framework="torchtitan", moe_dispatcher="flex", pp=1, vpp=1,
                                                     dp=64, zero_stage=3, schedule="1f1b", moe_overlap=None)), 64)
    detail = json.loads(text)["detail"]
    assert status == 422 and "moe_dispatcher='flex'" in detail and "\n" not in detail


def test_deepep_buffer_bytes_by_hand():
    """DeepEP csrc/legacy/config.hpp size hints with deep_ep's configurations (10 channels of Buffer.num_sms 20;
    per token hidden*2 + SourceMeta 8 + 128 int64 indices + 128 fp32 weights + 128 fp32 scales = h*2 + 2056):
    ep 64 (8 NVLink x 8 RDMA ranks): NVL 10*8*((2*8+3)*4 + 288*(14336+2056)); RDMA, recv 128 aligned to the
    dispatch's send 8 / combine's 8, 10*8*(18*2*4 + 128*(14336+2056+16)*2); intranode (8 ranks) NVL only."""
    from planner.cost import moe_comm

    nvl = 10 * 8 * ((2 * 8 + 3) * 4 + 288 * (7168 * 2 + 2056))
    rdma = 10 * 8 * (18 * 2 * 4 + 128 * (7168 * 2 + 2056 + 16) * 2)
    assert moe_comm.deepep_buffer_bytes(7168, 64) == -(-nvl // 128) * 128 + -(-rdma // 128) * 128
    assert moe_comm.deepep_buffer_bytes(4096, 8) == -(-(10 * 8 * ((2 + 3) * 4 + 256 * (4096 * 2 + 2056))) // 128) * 128
    assert moe_comm.deepep_buffer_bytes(7168, 16) > moe_comm.deepep_buffer_bytes(7168, 8)  # RDMA from 2 nodes on
    assert moe_comm.deepep_buffer_bytes(7168, 256) == 0 and not moe_comm.deepep_runs(256)


def test_flex_only_where_deepep_runs_and_its_buffers_held():
    """megatron-core's flex is DeepEP (behaviour.moe.flex_kernels): not offered for a tp x ep group DeepEP has no
    configuration for, a stated one refused; where priced, its buffers are in the rank's other bytes."""
    request = api.build_request(model="deepseek-v3", topology="dgx-h100", gpus=2048, global_batch_size=4096,
                                seq_len=4096, framework="megatron-core")
    wide = Candidate(dp=256, tp=1, pp=8, ep=256, microbatch_size=1, num_microbatches=16, zero_stage=1, recompute="full")
    model = CostModel(request)
    assert arrays.priced_choices(model, wide)[0] != "flex" and model.dispatch_buffer_bytes(wide) == 0
    hai = CostModel(request.model_copy(update={"framework": "hai-llm"}))
    assert "flex" in {c.moe_dispatcher for c in arrays.kind_costs(hai, wide, hai.links(wide), False).values()}
    narrow = dataclasses.replace(wide, dp=256, ep=64)
    pinned = CostModel(request, options=dataclasses.replace(options_for("megatron-core", "bf16"), moe_dispatchers=("flex",)))
    flat = CostModel(request, options=dataclasses.replace(options_for("megatron-core", "bf16"), moe_dispatchers=("alltoall",)))
    buffer = moe_comm.deepep_buffer_bytes(7168, 64)
    assert pinned.dispatch_buffer_bytes(narrow) == buffer and flat.dispatch_buffer_bytes(narrow) == 0
    assert pinned.stage_other_bytes(narrow, 0) - flat.stage_other_bytes(narrow, 0) == pytest.approx(buffer, abs=1)
    config = Configuration(parallelism=Parallelism(dp=256, tp=1, pp=8, ep=256, zero_stage=1, moe_dispatcher="flex"),
                           recompute="full")
    with pytest.raises(BadInputError, match="DeepEP's Buffer has no configuration for a tp x ep group of 256"):
        api.estimate(request, config)


def test_a_search_stated_flex_keeps_to_deepeps_group_sizes():
    """With flex stated, a candidate whose tp x ep group DeepEP has no configuration for is invalid (not priced with
    no dispatcher at all): the plan's group is one of DeepEP's sizes and the others are counted as pruned."""
    limits = SearchLimits(time_limit_s=60, top_k=1, moe_dispatcher="flex")
    plan = api.plan(api.build_request(model="deepseek-v3", topology="dgx-h100", gpus=2048, global_batch_size=8192,
                                      seq_len=4096, framework="megatron-core", search=limits))
    par = plan.parallelism
    assert par.moe_dispatcher == "flex" and moe_comm.deepep_runs(par.ep * par.tp)  # no MoE fold: tp x ep
    assert plan.pruned.get("moe_dispatcher_flex", 0) > 0


def test_the_service_plan_takes_the_same_statements():
    """POST /v1/plan: the body's dispatcher and overlap reach the search (SearchLimits), as `planner plan
    --moe-dispatcher/--moe-overlap` do; a pin the stack does not run is a 422 with one line."""
    from planner.service.worker import solve

    body = dict(model="mixtral-8x7b", topology="dgx-h100", gpus=64, global_batch_size=128, seq_len=4096,
                framework="megatron-core", time_limit_s=30, top_k=0, moe_dispatcher="alltoall", moe_overlap="none")
    status, text = solve("plan", json.dumps(body), 64)
    assert status == 200, text
    par = json.loads(text)["parallelism"]
    assert par["ep"] > 1 and (par["moe_dispatcher"], par["moe_overlap"]) == ("alltoall", "none")
    status, text = solve("plan", json.dumps(dict(body, framework="torchtitan", moe_dispatcher="flex",
                                                 moe_overlap=None)), 64)
    detail = json.loads(text)["detail"]
    assert status == 422 and "moe_dispatcher='flex'" in detail and "\n" not in detail
