"""torch's schedule names (interleaved-zero-bubble, zbv, dualpipev) priced by the cost model (planner.schedules:
Qi et al. 2024 ZB-V; DeepSeek-V3 Table 2 for DualPipe(V)), placed in a V as the executor places them, accepted by
`planner estimate` for every name the `planner` profile lists, and re-derived by the plan check."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.cost import Candidate, CostModel
from planner.schedules import schedule as S
from planner.frameworks import load_framework

RUNNER = CliRunner()
PP, M = 4, 32


@pytest.fixture(scope="module")
def model() -> CostModel:
    return CostModel(api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096))


def cand(schedule: str, vpp: int = 2, **kw) -> Candidate:
    base = dict(dp=1, tp=4, pp=PP, vpp=vpp, sp=True, microbatch_size=2, num_microbatches=M, zero_stage=1,
                recompute="selective", schedule=schedule)
    return Candidate(**{**base, **kw})


def test_formulas():
    t = 1.0
    assert S("zbv").bubble_s(pp=8, vpp=2, rank_time_s=t) == 0.0  # ZB-V at F = B = W
    assert S("dualpipev").bubble_s(pp=8, vpp=2, rank_time_s=t) == pytest.approx((8 / 2 - 1) * t / 3)
    assert S("dualpipev").bubble_s(pp=2, vpp=2, rank_time_s=t) == 0.0
    for vpp in (1, 2, 4):
        assert S("interleaved-zero-bubble").bubble_s(pp=8, vpp=vpp, rank_time_s=t) == S("zero-bubble").bubble_s(pp=8, vpp=vpp, rank_time_s=t)
    for stage in range(PP):
        assert S("zbv").inflight_microbatches(pp=PP, stage=stage, num_microbatches=M, vpp=2) == PP
        assert S("dualpipev").inflight_microbatches(pp=PP, stage=stage, num_microbatches=M, vpp=2) == PP + 1
    assert S("dualpipev").inflight_microbatches(pp=PP, stage=0, num_microbatches=3, vpp=2) == 3
    assert S("zbv").p2p_transfers(pp=PP, vpp=2, num_microbatches=M) == 2 * M + PP - 1  # 2x 1F1B's volume


def test_one_placement_for_the_cost_model_the_executor_and_the_cli():
    """The V placement is spelled once (planner.schedules.Schedule.stage_rank): the façade's stage_rank, which the
    CLI tables and the executor's report read, is the schedule's."""
    for schedule in ("zbv", "dualpipev", "interleaved", "zero-bubble"):
        for stage in range(2 * PP):
            assert api.stage_rank(stage, pp=PP, schedule=schedule) == S(schedule).stage_rank(stage, pp=PP)
    assert [S("zbv").stage_rank(s, pp=PP) for s in range(2 * PP)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert S("zbv").loss_rank(pp=PP, vpp=2) == 0 and S("interleaved").loss_rank(pp=PP, vpp=2) == PP - 1


def _rank_time(evaluation) -> float:
    b = evaluation.breakdown
    return (b.compute_s + b.recompute_s + b.tp_comm_exposed_s + b.ep_comm_s + b.cp_comm_s) / M


def test_evaluated_bubbles_follow_the_formulas(model):
    zbv, dual, izb = (model.evaluate(cand(s)) for s in ("zbv", "dualpipev", "interleaved-zero-bubble"))
    assert zbv.breakdown.bubble_s == 0.0
    assert _rank_time(dual) == pytest.approx(_rank_time(zbv), rel=1e-12)  # same V placement, same rank times
    assert dual.breakdown.bubble_s == pytest.approx((PP / 2 - 1) * _rank_time(dual) / 3, rel=1e-9)
    assert izb.step_time_s == pytest.approx(model.evaluate(cand("zero-bubble")).step_time_s, rel=1e-12)
    assert zbv.breakdown.pp_comm_s == pytest.approx(model.evaluate(cand("interleaved")).breakdown.pp_comm_s, rel=1e-12)


def test_v_memory_and_stage_placement(model):
    """Rank 0 runs stage 0 (embedding) and stage 2pp-1 (head): their stage memory is one rank's; DualPipeV holds
    p + 1 micro-batches of activations where ZB-V holds p (one parameter copy each)."""
    from planner.plan import build_launch_plan

    c = cand("zbv")
    plan = build_launch_plan(model, c, model.evaluate(c), kind="estimate")
    assert plan.stages[0].memory == plan.stages[2 * PP - 1].memory
    assert plan.stages[1].memory == plan.stages[2 * PP - 2].memory
    zbv, dual = model.evaluate(cand("zbv")), model.evaluate(cand("dualpipev"))
    for z, d in zip(zbv.stage_memory, dual.stage_memory):
        assert d.activations_bytes == pytest.approx(z.activations_bytes * (PP + 1) / PP, rel=1e-9)
        assert d.params_bytes == z.params_bytes


def test_v_needs_two_stages_per_rank(model):
    assert any("exactly 2 stages per rank" in r for r in model.validity_reasons(cand("zbv", vpp=3)))
    assert any("exactly 2 stages per rank" in r for r in model.validity_reasons(cand("dualpipev", vpp=1)))


@pytest.mark.parametrize("name", load_framework("planner").schedule_names())
def test_estimate_accepts_every_schedule_the_planner_profile_lists(name, tmp_path):
    from planner.io import load_file
    from planner.plan_verify import differences, rederived
    from planner.schemas.plan import LaunchPlan

    vpp = "2" if name in ("interleaved", "interleaved-zero-bubble", "zbv", "dualpipev") else "1"
    out = tmp_path / "plan.json"
    args = ["estimate", "--model", "tinyllama-1.1b", "--gpus", "8", "--pp", "2", "--tp", "2", "--vpp", vpp,
            "--schedule", name, "--global-batch-size", "64", "-o", str(out), "--json"]
    if name == "2bw":
        args += ["--zero", "0"]
    result = RUNNER.invoke(app, args)
    assert result.exit_code in (0, 1), result.output
    plan = json.loads(result.output)
    assert plan["schedule"] == name and plan["prediction"]["step_time_s"] > 0
    stated = load_file(LaunchPlan, out)
    assert differences(stated, rederived(stated)) == []


def test_dualpipev_needs_2pp_microbatches():
    result = RUNNER.invoke(app, ["estimate", "--model", "tinyllama-1.1b", "--gpus", "8", "--pp", "4", "--vpp", "2",
                                 "--schedule", "dualpipev", "--global-batch-size", "4"])
    assert result.exit_code == 2, result.output  # dp 2: 2 micro-batches
    assert "schedule=dualpipev needs num_microbatches=2 >= pp*vpp=8 (ScheduleDualPipeV" in result.output
    assert "gives at least 2*pp=8 micro-batches" in result.output and len(result.output.strip().splitlines()) == 1


ALL = ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev")


def _small_request(fixed: dict, schedules=ALL, gpus: int = 8, gbs: int = 16):
    from pathlib import Path

    from planner.schemas.model import ModelSpec
    from planner.schemas.plan import SearchLimits

    small = ModelSpec(name="small", num_layers=8, hidden_size=512, ffn_hidden_size=1536, num_attention_heads=8,
                      num_kv_heads=4, vocab_size=8000, seq_len=1024, activation="swiglu", norm="rmsnorm",
                      tied_embeddings=True)
    everything = str(Path(__file__).resolve().parents[1] / "data" / "frameworks" / "everything.yaml")
    limits = SearchLimits(max_microbatch_size=2, zero_stages=(0, 1, 3), top_k=3, tp_overlap=("none",), schedules=schedules,
                          fixed=fixed)
    return api.build_request(model=small, topology="dgx-h100", gpus=gpus, global_batch_size=gbs, seq_len=1024,
                             search=limits, framework=everything)


@pytest.mark.parametrize("schedules", [ALL, ("zbv", "dualpipev"), ("interleaved-zero-bubble",)])
@pytest.mark.parametrize("fixed", [{"pp": 2, "tp": 1}, {"pp": 4}, {}])
def test_search_with_torch_schedules_equals_exhaustive(fixed, schedules):
    """With the three names asked for (SearchLimits.schedules) and run by the stack, the pruned search keeps the
    same ranking as evaluating everything: the V placement's bounds (rank of each module, memory, pp and dp
    keys) stay below what evaluate returns (a tied model: the V keeps no tied copy)."""
    from planner.search.driver import search

    request = _small_request(fixed, schedules)
    pruned, full = search(request), search(request, exhaustive=True)
    summary = lambda r: [(s.key, s.stage_layers, s.full_recompute_layers) for s in r.ranked]  # noqa: E731
    assert pruned.ranked and summary(pruned) == summary(full)
    assert pruned.considered == full.considered
    if fixed.get("pp", 1) > 1 and schedules != ALL:
        assert {s.cand.schedule for s in full.ranked} <= set(schedules)
        assert all(s.cand.vpp == 2 for s in full.ranked if s.cand.schedule in ("zbv", "dualpipev"))


def test_search_proposes_v_schedules_only_when_asked():
    from planner.search.driver import search

    asked = search(_small_request({"pp": 2, "tp": 1}, schedules=("zbv",)))
    assert asked.ranked and all(s.cand.schedule == "zbv" and s.cand.vpp == 2 for s in asked.ranked)
    default = search(_small_request({"pp": 2, "tp": 1}, schedules=("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble")))
    assert all(s.cand.schedule not in ("zbv", "dualpipev", "interleaved-zero-bubble") for s in default.ranked)


def test_bounds_of_torch_schedule_variants_are_below_evaluate():
    from test_search_driver import bounded_members

    request = _small_request({"pp": 2}, schedules=("interleaved-zero-bubble", "zbv", "dualpipev"))
    checked = 0
    for cost, lower, cand in bounded_members(request):
        assert lower <= cost.evaluate(cand).step_time_s * (1 + 1e-9)
        checked += 1
    assert checked > 20
