"""The practice rule (planner.search.practice): within the ranking band of the fastest plan the search prefers one
inside the framework's practice, never leaves the band for it, never counts a dimension the user fixed as a
deviation, finds the same practice plan as an exhaustive search of the practice, and says so in the plan."""

from types import SimpleNamespace

import pytest

from planner.api import build_request, explain, plan
from planner.schemas.plan import SearchLimits
from planner.search import practice
from planner.search.driver import make_cost_model, search
from planner.search.options import Options
from planner.search.outcome import Scored

LIMITS = SearchLimits(max_microbatch_size=2, top_k=3)


def request_for(framework="megatron-core", limits=LIMITS, **extra):
    fields = dict(model="llama3-8b", topology="dgx-a100-40g", gpus=16, global_batch_size=128, seq_len=4096)
    return build_request(**{**fields, **extra}, framework=framework, search=limits)


def scored(step_s, **fields):
    cand = SimpleNamespace(**{**dict(dp=8, tp=1, pp=1, cp=1, ep=1, vpp=1, sp=False, zero_stage=1, schedule="1f1b",
                                     recompute="none", tp_overlap="none", microbatch_size=1, axis_order=()), **fields})
    return Scored(key=(step_s,), cand=cand, ev=SimpleNamespace(step_time_s=step_s))


def test_deviations_name_what_leaves_the_practice():
    opts = Options.from_request(request_for())
    assert practice.deviations(scored(1.0).cand, opts, 32) == ()
    devs = practice.deviations(scored(1.0, zero_stage=3, tp=2, sp=False, pp=2, vpp=16, schedule="interleaved").cand, opts, 32)
    assert [d.split()[0] for d in devs] == ["zero_stage", "tp=2", "vpp=16:"]


def test_a_dimension_the_user_fixed_is_never_a_deviation():
    opts = Options.from_request(request_for(limits=LIMITS.model_copy(update={"zero_stages": (3,), "sp": False})))
    assert practice.deviations(scored(1.0, zero_stage=3, tp=2, sp=False).cand, opts, 32) == ()
    assert practice.practice_options(Options.from_request(request_for(framework="planner"))) is None


def test_choose_within_and_beyond_the_band():
    opts = Options.from_request(request_for())
    fastest, inside = scored(1.00, zero_stage=3), scored(1.04)
    ranked, decision = practice.choose([fastest, scored(1.2)], [inside], band=0.05, opts=opts, num_layers=32, calibration="x")
    assert ranked[0] is inside and decision.chosen is inside and len(ranked) == 2
    assert "zero_stage 3" in decision.why_not(fastest) and "4.0% faster" in decision.why_not(fastest)
    ranked, decision = practice.choose([fastest], [scored(1.06)], band=0.05, opts=opts, num_layers=32, calibration="x")
    assert ranked[0] is fastest and decision.chosen is None and "beyond" in decision.note()
    ranked, decision = practice.choose([inside, fastest], [], band=0.05, opts=opts, num_layers=32, calibration="x")
    assert ranked[0] is inside and "inside the stack's practice" in decision.note()
    ranked, decision = practice.choose([fastest], [], band=0.05, opts=opts, num_layers=32, calibration="x", timed_out=True)
    assert ranked[0] is fastest and "time limit" in decision.note()


def test_plan_prefers_the_practice_within_the_band_and_matches_an_exhaustive_practice_search():
    # on 80 GB A100s megatron-core's practice (ZeRO-1, TP with SP) comes within the derived ranking band of the
    # fastest plan (ZeRO-3); on 40 GB ones it is 3.4% slower, beyond ampere's band of 3.2%
    request = request_for(topology="dgx-a100-80g")
    fastest = search(request).ranked[0]
    opts = Options.from_request(request)
    assert practice.deviations(fastest.cand, opts, 32)  # this request's fastest plan leaves megatron-core's practice
    band = make_cost_model(request).cal.ranking_band
    chosen = plan(request)
    par = chosen.parallelism
    assert par.zero_stage in (0, 1) and (par.tp == 1 or par.sp)
    assert fastest.ev.step_time_s <= chosen.prediction.step_time_s <= fastest.ev.step_time_s * (1 + band)
    narrow = practice.practice_options(opts)
    reference = [s for s in search(request, opts=narrow, exhaustive=True).ranked
                 if not practice.deviations(s.cand, opts, 32)][0]
    assert chosen.prediction.step_time_s == pytest.approx(reference.ev.step_time_s, rel=1e-12)
    assert any(n.startswith("practice (megatron-core): chose this plan") for n in chosen.notes)
    assert "ranking band" in chosen.alternatives[0].why_not
    assert explain(chosen).reasons[0].startswith("practice (megatron-core): chose this plan")


def test_prefer_practice_false_takes_the_fastest():
    request = request_for(limits=LIMITS.model_copy(update={"prefer_practice": False}))
    assert plan(request).prediction.step_time_s == pytest.approx(search(request).ranked[0].ev.step_time_s, rel=1e-12)


def test_every_plan_carries_its_error_band():
    chosen = plan(request_for())
    cal = make_cost_model(request_for()).cal
    assert chosen.prediction.error_band == cal.error_band and 0 < cal.ranking_band < cal.error_band
