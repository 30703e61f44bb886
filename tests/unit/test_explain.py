"""explain and the pictures: the schedule simulator against closed forms, the explanation against the plan."""

from __future__ import annotations

import pytest

from planner.explain import TIME_PARTS, explain
from planner.plot import plot_plan, rank_order, simulate
from planner.schemas.plan import Alternative, Batch, Breakdown, Parallelism, StageTime
from planner.search.outcome import BREAKDOWN_WORDS
from test_export import make_plan


def timed(plan, forward_s=1.0, backward_s=2.0, per_stage=None):
    stages = []
    for stage in plan.stages:
        f, b = per_stage[stage.stage] if per_stage else (forward_s, backward_s)
        stages.append(stage.model_copy(update={"time": StageTime(forward_s=f, backward_s=b)}))
    return plan.model_copy(update={"stages": tuple(stages)})


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe"])
def test_flush_schedules_take_m_plus_pp_minus_1_stage_times(schedule):
    plan = timed(make_plan(dp=1, tp=2, pp=4, gbs=8, schedule=schedule))
    slots, m = simulate(plan)
    assert m == 8
    assert max(s.end_s for s in slots) == pytest.approx((8 + 4 - 1) * 3.0)


def test_interleaved_bubble_shrinks_by_vpp():
    plan = timed(make_plan(dp=1, tp=2, pp=4, vpp=2, schedule="interleaved", gbs=8), 0.5, 1.0)  # half-size chunks
    slots, m = simulate(plan)
    work = m * 2 * 1.5  # each rank runs vpp chunks per micro-batch
    bubble = (4 - 1) * 1.5  # (pp - 1) chunk times = (pp - 1) / vpp of a whole-stage time (Narayanan et al. 2021)
    assert max(s.end_s for s in slots) == pytest.approx(work + bubble)


def test_timeline_respects_dependencies_and_1f1b_memory_bound():
    plan = timed(make_plan(dp=1, tp=2, pp=4, gbs=16, counts=[6, 10, 8, 8]), per_stage={0: (1, 2), 1: (1.5, 3), 2: (1, 2), 3: (1.2, 2.5)})
    slots, m = simulate(plan)
    end = {(s.op.kind, s.op.microbatch, s.op.stage): s for s in slots}
    for s in slots:
        if s.op.kind == "F" and s.op.stage > 0:
            assert s.start_s >= end[("F", s.op.microbatch, s.op.stage - 1)].end_s
        if s.op.kind == "B" and s.op.stage < 3:
            assert s.start_s >= end[("B", s.op.microbatch, s.op.stage + 1)].end_s
    for rank in range(4):
        mine = sorted((s for s in slots if s.rank == rank), key=lambda s: s.start_s)
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(mine, mine[1:]))
        in_flight = peak = 0
        for s in mine:
            in_flight += 1 if s.op.kind == "F" else -1
            peak = max(peak, in_flight)
        assert peak == 4 - rank  # 1F1B keeps at most pp - rank micro-batches of activations
    assert max(s.end_s for s in slots) >= m * 4.5  # the slowest stage bounds the step


def test_drawn_microbatches_are_capped():
    plan = timed(make_plan(dp=1, tp=2, pp=2, gbs=64))
    slots, m = simulate(plan)
    assert m == 8 and plan.batch.num_microbatches == 64 and len(slots) == 2 * 2 * 8


def test_interleaved_order_visits_every_chunk_and_microbatch_once():
    ops = rank_order("interleaved", rank=1, pp=4, vpp=3, m=8)
    forwards = sorted((o.microbatch, o.stage) for o in ops if o.kind == "F")
    assert forwards == sorted((mb, v * 4 + 1) for mb in range(8) for v in range(3))
    assert len(ops) == 2 * 8 * 3


def with_alternative(plan):
    alt = Alternative(parallelism=Parallelism(dp=4, tp=2, pp=2, zero_stage=1), batch=Batch(global_batch_size=64, microbatch_size=1, num_microbatches=16, seq_len=8192),
                      schedule="1f1b", recompute="selective", step_time_s=1.25, peak_bytes=70 * 2**30, why_not="25% slower: exposed DP all-reduce")
    prediction = plan.prediction.model_copy(update={"breakdown": Breakdown(compute_s=0.7, bubble_s=0.2, tp_comm_exposed_s=0.1)})
    return plan.model_copy(update={"alternatives": (alt,), "pruned": {"does_not_fit": 40, "heads_not_divisible_by_tp": 7}, "prediction": prediction})


def test_explanation_names_degrees_time_memory_and_runner_up():
    ex = explain(with_alternative(timed(make_plan(dp=2, tp=4, pp=2))))
    assert any(r.startswith("tp=4") for r in ex.reasons) and any(r.startswith("pp=2") for r in ex.reasons)
    assert {t.part for t in ex.time} == {"compute", "bubble", "tp_comm_exposed"}
    assert sum(t.fraction for t in ex.time) == pytest.approx(1.0)
    assert ex.runner_up is not None and ex.runner_up.slower_by == pytest.approx(0.25) and "DP all-reduce" in ex.runner_up.why_not
    assert list(ex.pruned) == ["does_not_fit", "heads_not_divisible_by_tp"]
    assert ex.to_dict()["runner_up"]["degrees"].startswith("dp=4 tp=2 pp=2")
    assert ex.runner_up.differs == "dp 2->4, tp 4->2, sp True->False, recompute none->selective"


def test_plot_writes_a_png(tmp_path):
    out = plot_plan(with_alternative(timed(make_plan(dp=2, tp=4, pp=2, gbs=16))), tmp_path / "plan.png")
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000
    assert [p.name for p in tmp_path.iterdir()] == ["plan.png"]


def test_real_plan_explained_and_drawn(tmp_path):
    """The real search and cost model: the account and the picture agree with the plan's own numbers."""
    from planner import api
    from planner.schemas.plan import SearchLimits

    narrow = SearchLimits(schedules=("1f1b", "interleaved"), zero_stages=(1,), recompute_modes=("selective",), tp_overlap=("none",), max_microbatch_size=2)
    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096, search=narrow)
    plan = api.plan(request)
    ex = api.explain(plan)
    assert ex.summary["degrees"].startswith(f"dp={plan.parallelism.dp} tp={plan.parallelism.tp} pp={plan.parallelism.pp}")
    assert sum(t.seconds for t in ex.time) == pytest.approx(plan.prediction.step_time_s, rel=0.02)
    assert [round(r.peak_gib, 6) for r in ex.memory] == [round(s.peak_bytes / 2**30, 6) for s in plan.memory.per_stage]
    assert ex.runner_up is not None and ex.runner_up.slower_by >= 0
    assert plot_plan(plan, tmp_path / "real.png").stat().st_size > 20_000


def test_real_estimate_timeline_matches_the_flush_formula():
    """For a 1F1B estimate with one stage time, the simulated window matches (m + pp - 1) stage times."""
    from planner import api
    from planner.schemas.plan import Configuration

    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=16, seq_len=4096,
                                framework="megatron-core")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=1, tp=4, pp=4, sp=True, zero_stage=1), recompute="selective"))
    slots, m = simulate(plan)
    times = [s.time for s in plan.stages]
    slowest = max(t.forward_s + t.backward_s for t in times)
    window = max(s.end_s for s in slots)
    assert m == 8 and m * slowest <= window <= (m + 4 - 1) * slowest + 1e-9


def test_every_breakdown_part_is_shown_and_worded():
    """explain's parts are the schema's fields, and why_not has words for each (search.outcome.BREAKDOWN_WORDS),
    so a new part of the breakdown (grad_accum_s) cannot be left out of either."""
    assert TIME_PARTS == tuple(Breakdown.model_fields)
    assert set(BREAKDOWN_WORDS) == set(Breakdown.model_fields)
