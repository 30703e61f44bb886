"""The Schedule objects (planner/schedules.py) against the papers' formulas, their placement and their refusals, and
the stacks' profiles against the names the objects give them."""

from __future__ import annotations

import numpy as np
import pytest

from planner.errors import BadInputError
from planner.frameworks import load_framework
from planner.schedules import ALL, DEFAULT, EXECUTOR_CLASSES, NAMES, SEARCHED_BY_DEFAULT, V_PLACED, schedule
from planner.schemas.plan import SearchLimits

SHAPES = [(pp, vpp, m) for pp in (1, 2, 4, 8) for vpp in (1, 2, 4) for m in (1, 3, 8, 32)]


@pytest.mark.parametrize("pp, vpp, m", SHAPES)
def test_bubbles_are_the_papers(pp, vpp, m):
    """GPipe/1F1B (p - 1) t; interleaved (p - 1) t / v; ZB-H1 (and torch's interleaved ZB) (p - 1) t / 3; 2BW and ZB-V
    none; DualPipeV (p/2 - 1) t / 3 (planner/schedules.py docstring for the sources); nothing without a pipeline."""
    t = 0.37
    expected = {"gpipe": (pp - 1) * t, "1f1b": (pp - 1) * t, "interleaved": (pp - 1) * t / vpp, "2bw": 0.0,
                "zero-bubble": (pp - 1) * t / 3, "interleaved-zero-bubble": (pp - 1) * t / 3, "zbv": 0.0,
                "dualpipev": max(0.0, pp / 2 - 1) * t / 3}
    assert set(expected) == set(NAMES)
    for name, bubble in expected.items():
        s = schedule(name)
        assert s.bubble_s(pp=pp, vpp=vpp, rank_time_s=t) == pytest.approx(bubble if pp > 1 else 0.0, abs=1e-15)
        assert s.bubble_fraction(pp=pp, vpp=vpp, num_microbatches=m) == pytest.approx(
            s.bubble_s(pp=pp, vpp=vpp, rank_time_s=1.0) / m)


@pytest.mark.parametrize("pp, vpp, m", [s for s in SHAPES if s[0] > 1])
def test_inflight_microbatches_are_the_papers(pp, vpp, m):
    for stage in range(pp):
        one_f_one_b = min(pp - stage, m)
        warm = min(m * vpp, (pp - stage - 1) * 2 + (vpp - 1) * pp + 1) / vpp if vpp > 1 else one_f_one_b
        expected = {"gpipe": m, "1f1b": one_f_one_b, "2bw": one_f_one_b, "interleaved": warm, "zero-bubble": warm,
                    "interleaved-zero-bubble": warm, "zbv": min(pp, m), "dualpipev": min(pp + 1, m)}
        for name, count in expected.items():
            assert schedule(name).inflight_microbatches(pp=pp, stage=stage, num_microbatches=m, vpp=vpp) == count, name


@pytest.mark.parametrize("pp, vpp, m", SHAPES)
def test_p2p_transfers_cross_every_chunk_of_chunked_schedules(pp, vpp, m):
    for s in ALL:
        chunks = vpp if s.name in ("interleaved", "zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev") else 1
        assert s.p2p_transfers(pp=pp, vpp=vpp, num_microbatches=m) == (m * chunks + pp - 1 if pp > 1 else 0)
        assert s.p2p_transfers(pp=pp, vpp=vpp, num_microbatches=m, overlapped=True) == max(pp - 1, 0)


def test_v_placement_and_the_loss_rank():
    for pp in (2, 3, 4):
        v = [r for r in range(pp)] + [r for r in reversed(range(pp))]
        for s in ALL:
            ranks = [s.stage_rank(stage, pp=pp) for stage in range(2 * pp)]
            assert ranks == (v if s.name in ("zbv", "dualpipev") else [stage % pp for stage in range(2 * pp)])
            assert s.loss_rank(pp=pp, vpp=2) == (0 if s.v_placed else pp - 1)
    assert {s.name for s in V_PLACED} == {"zbv", "dualpipev"}


@pytest.mark.parametrize("name", NAMES)
def test_rank_sums_follow_the_placement(name):
    """rank_sums (vectorised over rows) adds each virtual stage's value to the rank stage_rank places it on."""
    s, pp, rng = schedule(name), 4, np.random.default_rng(0)
    for vpp in ((2,) if s.v_placed else (1, 2, 3)):
        rows = rng.random((3, pp * vpp))
        expected = np.zeros((3, pp))
        for stage in range(pp * vpp):
            expected[:, s.stage_rank(stage, pp=pp)] += rows[:, stage]
        assert np.allclose(s.rank_sums(rows, pp=pp, vpp=vpp), expected)


def test_validity_refusals():
    assert schedule("interleaved").vpp_reasons(pp=4, vpp=1) == [
        "the interleaved schedule needs pp>1 and vpp>1 (got pp=4, vpp=1): use 1f1b or raise vpp"]
    assert schedule("interleaved").vpp_reasons(pp=4, vpp=2) == []
    assert schedule("zero-bubble").vpp_reasons(pp=4, vpp=3) == [] and schedule("zero-bubble").vpp_reasons(pp=1, vpp=2)
    assert "exactly 2 stages per rank in a V" in schedule("zbv").vpp_reasons(pp=4, vpp=3)[0]
    assert schedule("dualpipev").vpp_reasons(pp=4, vpp=2) == []
    assert schedule("1f1b").vpp_reasons(pp=4, vpp=2) == [
        "vpp=2 needs schedule=interleaved, zero-bubble or interleaved-zero-bubble (zbv, dualpipev: vpp=2 with pp>1) "
        "(got 1f1b)"]
    assert schedule("2bw").min_microbatches(pp=4, vpp=1) == 4 and schedule("dualpipev").min_microbatches(pp=4, vpp=2) == 8
    assert schedule("1f1b").min_microbatches(pp=4, vpp=1) == 1
    assert [s.name for s in ALL if s.weight_versions == 2] == ["2bw"] == [s.name for s in ALL if s.stale_weights]
    assert [s.name for s in ALL if s.executor_class is None] == ["2bw"]  # the executor's own send/recv loop
    assert {s.name for s in ALL if s.splits_backward} == {"zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev"}


def test_search_proposes_the_vpps_of_each_schedule():
    assert [list(schedule(n).searched_vpps(4)) for n in NAMES] == [
        [1], [1], [2, 3, 4], [1], [1], [1, 2, 3, 4], [2], [2]]
    assert list(schedule("zbv").searched_vpps(1)) == []


def test_lookup_and_names():
    assert schedule("1f1b") is DEFAULT and schedule("ZB-H1") is schedule("zero-bubble")
    with pytest.raises(BadInputError, match=r"^schedule='1F1B-fast' is unknown: choose one of gpipe, 1f1b, .*dualpipev$"):
        schedule("1F1B-fast")
    assert SearchLimits().schedules == SEARCHED_BY_DEFAULT == ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble")
    assert len({s.tie_rank for s in ALL}) == len(ALL)
    aliases = [a for s in ALL for a in s.aliases]
    assert len(set(aliases) | set(NAMES)) == len(aliases) + len(NAMES)  # no alias is another's name


def test_the_stacks_profiles_name_schedules_as_their_objects_do():
    """The profiles (data) and the objects agree: the executor builds torch's class, torchtitan takes the class
    without `Schedule`, Megatron-Core and DeepSpeed their functions / classes."""
    for stack, attribute in (("planner", "executor_class"), ("torchtitan", "torchtitan_name"),
                             ("megatron-core", "megatron"), ("deepspeed", "deepspeed")):
        profile = load_framework(stack)
        for name in profile.schedule_names():
            expected = getattr(schedule(name), attribute)
            if expected is not None:  # the executor's 2BW loop has no torch class
                assert profile.native_schedule(name) == expected, (stack, name)
    assert set(EXECUTOR_CLASSES) == set(NAMES) - {"2bw"}
