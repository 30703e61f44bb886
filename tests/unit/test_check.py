"""`planner check`: classification and diffs (fast, on hand-built plans), plus the real cost model made
deliberately worse (monkeypatched) failing the check while the unchanged one passes."""

from __future__ import annotations

import pytest

from planner import check as check_module
from planner.check import check_plans, configuration_of
from planner.errors import BadInputError, InfeasibleError
from planner.io import canonical_json
from test_export import make_plan


def write(tmp_path, plan, name="plan.json"):
    path = tmp_path / name
    path.write_text(canonical_json(plan))
    return path


def scaled(plan, factor):
    prediction = plan.prediction.model_copy(update={"step_time_s": plan.prediction.step_time_s * factor})
    return plan.model_copy(update={"prediction": prediction})


@pytest.mark.parametrize(
    "factor, status, failed",
    [(1.0, "ok", False), (1.019, "ok", False), (1.03, "regressed", True), (0.9, "improved", False)],
)
def test_step_time_tolerance(tmp_path, monkeypatch, factor, status, failed):
    plan = make_plan()
    monkeypatch.setattr(check_module, "recompute_plan", lambda old: scaled(old, factor))
    report = check_plans(write(tmp_path, plan), tolerance=0.02)
    assert report.results[0].status == status and report.failed is failed


def test_configuration_change_fails_unless_allowed(tmp_path, monkeypatch):
    old, new = make_plan(dp=2, tp=4, pp=2), make_plan(dp=4, tp=4, pp=1)
    monkeypatch.setattr(check_module, "recompute_plan", lambda _: new)
    path = write(tmp_path, old)
    report = check_plans(path)
    assert report.results[0].status == "changed" and report.failed
    moved = {d.what: (d.old, d.new) for d in report.results[0].differences if d.old != d.new}
    assert moved["degrees"][0].startswith("dp=2 tp=4 pp=2") and moved["degrees"][1].startswith("dp=4 tp=4 pp=1")
    assert "stages (decoder layers)" in moved
    assert not check_plans(path, allow_change=True).failed


def test_no_longer_fits(tmp_path, monkeypatch):
    plan = make_plan()
    memory = plan.memory.model_copy(update={"fits": False, "peak_bytes": plan.memory.capacity_bytes + 1})
    monkeypatch.setattr(check_module, "recompute_plan", lambda old: old.model_copy(update={"memory": memory}))
    assert check_plans(write(tmp_path, plan)).results[0].status == "no_longer_fits"

    def raise_infeasible(_):
        raise InfeasibleError("no plan fits in 80.0 GiB")

    monkeypatch.setattr(check_module, "recompute_plan", raise_infeasible)
    result = check_plans(write(tmp_path, plan)).results[0]
    assert result.status == "no_longer_fits" and "80.0 GiB" in result.messages[0]


def test_bad_inputs(tmp_path):
    with pytest.raises(BadInputError, match="no such file"):
        check_plans(tmp_path / "missing")
    with pytest.raises(BadInputError, match="no \\*.json plans"):
        check_plans(tmp_path)
    (tmp_path / "x.json").write_text('{"kind": "plan"}')
    with pytest.raises(BadInputError, match="x.json: request: Field required"):
        check_plans(tmp_path)


def test_configuration_of_keeps_the_stage_split():
    config = configuration_of(make_plan(dp=1, tp=2, pp=4, counts=[7, 9, 9, 7], gbs=32))
    assert config.stage_layers == (7, 9, 9, 7) and config.parallelism.pp == 4


# ---- the real thing: api.estimate / api.plan with the real cost model --------------------------------------

def real_estimate_plan():
    from planner import api
    from planner.schemas.plan import Configuration, Parallelism

    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="megatron-core")
    config = Configuration(parallelism=Parallelism(dp=2, tp=4, pp=2, sp=True, zero_stage=1), microbatch_size=1, schedule="1f1b", recompute="selective")
    return api.estimate(request, config)


def slower_gemms(monkeypatch, factor):
    """Make the cost model deliberately worse: every GEMM takes `factor` times longer."""
    from planner.cost import compute

    original = compute.gemm_time_s
    monkeypatch.setattr(compute, "gemm_time_s", lambda *args, **kwargs: factor * original(*args, **kwargs))


def test_real_estimate_passes_unchanged_and_fails_on_a_worse_cost_model(tmp_path, monkeypatch):
    plan = real_estimate_plan()
    assert plan.kind == "estimate" and plan.feasible
    path = write(tmp_path, plan)
    unchanged = check_plans(path)
    assert not unchanged.failed and unchanged.results[0].relative_change == pytest.approx(0.0, abs=1e-9)
    slower_gemms(monkeypatch, 1.10)
    worse = check_plans(path)
    result = worse.results[0]
    assert worse.failed and result.status == "regressed" and result.relative_change > 0.02
    assert "predicted step time +" in result.messages[0]
    assert {d.what for d in result.differences} >= {"degrees", "stages (decoder layers)", "peak memory", "step time"}


def test_real_search_plan_recomputed_by_check(tmp_path, monkeypatch):
    from planner import api
    from planner.schemas.plan import SearchLimits

    narrow = SearchLimits(schedules=("1f1b",), zero_stages=(1, 2), recompute_modes=("none", "selective"), tp_overlap=("none",), max_microbatch_size=4)
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=2048, search=narrow)
    plan = api.plan(request)
    path = write(tmp_path, plan)
    assert not check_plans(path).failed
    slower_gemms(monkeypatch, 1.5)
    report = check_plans(path, allow_change=True)
    assert report.failed and report.results[0].status == "regressed"
