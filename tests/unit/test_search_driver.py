"""The search driver: pruned search equals exhaustive search, bounds are sound, structural pruning is counted,
infeasible requests explain themselves."""

from pathlib import Path

import numpy as np
import pytest

from planner.api import build_request
from planner.errors import BadInputError, InfeasibleError
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import SearchLimits
from planner.search import bounds
from planner.search.driver import _Search, make_cost_model, search
from planner.search.options import Options
from planner.search.space import Space

SMALL = ModelSpec(name="small", num_layers=6, hidden_size=512, ffn_hidden_size=1536, num_attention_heads=8,
                  num_kv_heads=4, vocab_size=8000, seq_len=1024, activation="swiglu", norm="rmsnorm")
SMALL_MOE = SMALL.model_copy(update=dict(name="small-moe", moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=512)))
SMALL_MTP = SMALL_MOE.model_copy(update=dict(name="small-mtp", mtp_num_layers=1))
NARROW = SearchLimits(max_microbatch_size=2, zero_stages=(0, 1, 3), top_k=2, tp_overlap=("none",))


EVERYTHING = str(Path(__file__).resolve().parents[1] / "data" / "frameworks" / "everything.yaml")  # the whole priced space


def small_request(model=SMALL, gpus=8, gbs=16, limits=NARROW, topology="dgx-h100", framework=EVERYTHING):
    return build_request(model=model, topology=topology, gpus=gpus, global_batch_size=gbs, seq_len=model.seq_len, search=limits,
                         framework=framework)


def _summary(result):
    return [(s.key, s.stage_layers, s.full_recompute_layers) for s in result.ranked]


@pytest.mark.parametrize("model,gpus,gbs,fixed", [
    (SMALL, 8, 16, {}), (SMALL_MOE, 4, 16, {}), (SMALL, 8, 16, {"pp": 2, "tp": 1}),
    (SMALL_MOE, 16, 32, {}), (SMALL, 16, 32, {"cp": 2}),  # two nodes: cp, ep and dp groups across them
    (SMALL_MTP, 8, 16, {}), (SMALL_MTP, 8, 16, {"pp": 4, "tp": 1}),  # an MTP layer on the last stage (planner.cost.mtp)
])
def test_pruned_search_equals_exhaustive(model, gpus, gbs, fixed):
    request = small_request(model=model, gpus=gpus, gbs=gbs, limits=NARROW.model_copy(update=dict(fixed=fixed)))
    pruned = search(request)
    full = search(request, exhaustive=True)
    assert pruned.ranked and full.ranked
    assert _summary(pruned) == _summary(full)
    assert pruned.evaluated < full.evaluated
    assert pruned.considered == full.considered
    if fixed.get("pp", 1) > 1:
        assert pruned.counters.dp_calls > 0  # the winners were re-split by the partition DP


def test_every_configuration_is_accounted_for():
    result = search(small_request())
    fitting = result.evaluated - result.pruned.get("does_not_fit", 0)
    assert fitting + sum(result.pruned.values()) == result.considered
    space = Space(small_request(), Options.from_request(small_request()))
    total = sum(space.fact_count(f) for f in space.factorisations())
    assert total == result.considered


def bounded_members(request):
    """(cost model, variant bound, candidate) for every valid member of the request's space: what a bound must stay
    below (the search's variant bound, computed as the branch and bound computes it)."""
    from planner.cost.model import Candidate

    cost = make_cost_model(request)
    space = Space(request, Options.from_request(request))
    state = _Search(request, cost, Options.from_request(request), exhaustive=False, progress=None)
    for group in space.groups():
        for schedule, vpp, _ in space.variants(group):
            variant_lower = state.variant_bound(group, schedule, vpp)
            for member in space.members(group, schedule, vpp):
                cand = Candidate(**group.candidate_fields(), zero_stage=member.zero_stage, schedule=schedule, vpp=vpp,
                                 axis_order=member.axis_order)
                if not cost.validity_reasons(cand):
                    yield cost, variant_lower, cand


@pytest.mark.parametrize("model", [SMALL, SMALL_MTP])
def test_bounds_are_below_evaluate(model):
    checked = 0
    for cost, variant_lower, cand in bounded_members(small_request(model=model, gpus=8 if model is SMALL else 4)):
        lc = cost.layer_costs(cand)
        ev = cost.evaluate(cand)
        times = lc.forward_s + lc.backward_s + lc.recompute_s
        end = max(times[0], times[-1]) + min(times[1:-1])
        lower = bounds.step_time_lower_bound_s(float(times.sum()), cand.num_microbatches, cand.pp, cand.schedule,
                                               cand.vpp, end)
        assert lower <= ev.step_time_s * (1 + 1e-9)
        assert variant_lower <= ev.step_time_s * (1 + 1e-9)
        act = float(np.sum(np.minimum(lc.activation_bytes, lc.full_recompute_activation_bytes)))
        other = min(cost.stage_other_bytes(cand, s) for s in range(cand.pp))
        mem = bounds.memory_lower_bound_bytes(float(np.sum(lc.static_bytes)), act, cand.pp, other)
        assert mem <= ev.peak_bytes * (1 + 1e-9)
        checked += 1
    assert checked > 100


def test_structural_pruning_is_counted_by_reason():
    model = SMALL.model_copy(update=dict(num_attention_heads=6, num_kv_heads=6, hidden_size=384))
    result = search(small_request(model=model, gpus=8, gbs=12))
    assert result.pruned["heads_not_divisible_by_tp"] > 0  # tp=4, 8 do not divide 6 heads
    assert result.pruned["global_batch_not_divisible_by_dp"] > 0  # dp=8 does not divide 12
    assert all(s.cand.tp in (1, 2) for s in result.ranked)


def test_fixed_degrees_narrow_the_space():
    limits = NARROW.model_copy(update=dict(fixed={"tp": 2, "pp": 2}))
    result = search(small_request(limits=limits))
    assert {(s.cand.tp, s.cand.pp) for s in result.ranked} == {(2, 2)}
    with pytest.raises(BadInputError, match="tp=3 must divide gpus=8"):
        search(small_request(limits=NARROW.model_copy(update=dict(fixed={"tp": 3}))))


def test_runnable_excludes_what_the_executor_refuses():
    """--runnable = --framework planner: 2BW only when stale weights are allowed and then with zero_stage 0
    (planner/data/frameworks/planner.yaml), Domino only without SP/MoE."""
    limits = SearchLimits(max_microbatch_size=1, zero_stages=(0, 1), runnable=True, top_k=5)
    result = search(small_request(limits=limits, framework="planner"))
    assert result.ranked and all(s.cand.schedule != "2bw" and not (s.cand.tp_overlap == "domino" and s.cand.sp)
                                 for s in result.ranked)
    stale = search(small_request(limits=limits.model_copy(update={"allow_stale_weights": True}), framework="planner"))
    assert stale.ranked and all(not (s.cand.schedule == "2bw" and s.cand.pp > 1 and s.cand.zero_stage > 0)
                                for s in stale.ranked)


def test_nothing_fits_says_how_far_and_what_to_do():
    from planner.search.entry import plan

    big = ModelSpec(name="big", num_layers=8, hidden_size=16384, ffn_hidden_size=65536, num_attention_heads=128,
                    vocab_size=32000, seq_len=4096)
    request = build_request(model=big, topology="dgx-h100", gpus=1, global_batch_size=1, seq_len=4096,
                            search=SearchLimits(max_microbatch_size=1))
    with pytest.raises(InfeasibleError) as info:
        plan(request)
    message = str(info.value)
    assert "GiB over" in message and "more GPUs" in message and "shorter sequence" in message
    assert info.value.shortfall_bytes > 0


WIDE = NARROW.model_copy(update=dict(top_k=100000, schedules=("1f1b", "interleaved"), max_microbatch_size=2))


@pytest.fixture(scope="module")
def whole_space():
    """Every configuration of the small instance, evaluated (exhaustive search keeping all of them)."""
    return search(small_request(limits=WIDE), exhaustive=True)


@pytest.mark.parametrize("fixed", [
    dict(sp=True), dict(vpp=3, schedules=("interleaved",)), dict(microbatch_size=2), dict(recompute_modes=("selective",)),
    dict(fixed={"tp": 2, "pp": 2}, zero_stages=(1,)), dict(fixed={"dp": 2}, sp=False, microbatch_size=1),
])
def test_fixed_dimensions_give_the_best_plan_that_keeps_them(fixed, whole_space):
    """`plan` with any dimension fixed = the best, by brute force over the whole space, of the configurations
    that keep those dimensions."""

    def keeps(c) -> bool:
        ok = all(getattr(c, k) == v for k, v in fixed.get("fixed", {}).items())
        ok &= fixed.get("sp", c.sp) == c.sp and fixed.get("vpp", c.vpp) == c.vpp
        ok &= fixed.get("microbatch_size", c.microbatch_size) == c.microbatch_size
        ok &= c.recompute in fixed.get("recompute_modes", (c.recompute,)) and c.zero_stage in fixed.get("zero_stages", (c.zero_stage,))
        return ok and c.schedule in fixed.get("schedules", (c.schedule,))

    reference = [s for s in whole_space.ranked if keeps(s.cand)]
    assert reference, "the brute-force space must hold configurations that keep the fixed dimensions"
    found = search(small_request(limits=WIDE.model_copy(update=dict(fixed, top_k=2))))
    assert found.ranked and keeps(found.ranked[0].cand)
    assert found.ranked[0].ev.step_time_s == pytest.approx(reference[0].ev.step_time_s, rel=1e-9)
    assert found.ranked[0].cand == reference[0].cand


@pytest.mark.parametrize("framework", ["torchtitan", "megatron-core", EVERYTHING])
def test_the_space_reads_its_stack_once_and_answers_as_the_stack_does(framework):
    """The rules the space reads once from the profile when it is built (planner.search.stack_rules) give, for every
    pp of the space and num_microbatches divisible by pp or not, the variants and per-degree rules the stack's own
    judges give when asked one group at a time (planner.frameworks.interleaved_split_reason, the structural checks)."""
    from planner.frameworks import interleaved_split_reason, load_framework
    from planner.search.space import schedule_variants

    limits = SearchLimits(schedules=("gpipe", "1f1b", "interleaved", "zero-bubble", "interleaved-zero-bubble", "zbv",
                                     "dualpipev"), max_microbatch_size=2)
    request = small_request(model=SMALL_MOE.model_copy(update=dict(num_layers=10)), gpus=32, gbs=96, limits=limits,
                            framework=framework)
    profile = load_framework(framework)
    space = Space(request, Options.from_request(request, framework=profile))
    assert space.opts.profile is profile  # the object handed in, not read again
    for pp in (1, 2, 4, 8):
        for m in range(1, 3 * pp + 1):
            asked = [(s, v) for s, v in schedule_variants(pp, 10, space.opts) if v == 1 or interleaved_split_reason(
                profile, num_layers=10, pp=pp, vpp=v, num_microbatches=m) is None]
            assert list(space.rules.valid_variants(pp, m)) == asked
    for tp in (1, 2, 4, 8, 16, 32):
        heads = SMALL_MOE.num_attention_heads % tp or SMALL_MOE.kv_heads % tp or SMALL_MOE.ffn_hidden_size % tp
        assert (space.rules.axis["tp"][tp] is not None) == bool(heads)
    assert space.rules.axis["ep"][8] == "experts_not_divisible_by_ep" and space.rules.axis["ep"][4] is None


def test_a_plan_reads_its_stack_profile_once(monkeypatch):
    """api.plan resolves the request's framework profile once and hands the object down (search, space, cost
    model, plan assembly): one read of the profile file per plan, however many stages ask what the stack runs."""
    import planner.frameworks as frameworks
    from planner import api

    reads, real = [], frameworks.load_file

    def counting(kind, path, *args, **kwargs):
        if kind is frameworks.FrameworkProfile:
            reads.append(str(path))
        return real(kind, path, *args, **kwargs)

    request = small_request(framework="torchtitan", limits=NARROW.model_copy(update=dict(top_k=1)))
    monkeypatch.setattr(frameworks, "load_file", counting)
    api.plan(request)
    assert len(reads) == 1 and reads[0].endswith("torchtitan.yaml")
