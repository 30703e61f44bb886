"""The cost model's terms for the search's bounds (planner.cost.bounds): the single terms equal evaluate's, the
floors are at most the candidate's under every axis order and micro-batch size."""

import dataclasses
import itertools

import numpy as np
import pytest

from planner.api import build_request
from planner.cost import bounds
from planner.cost.arrays import moe_batch_overlap
from planner.cost.model import Candidate, CostModel
from planner.cost.p2p import pp_comm_s
from planner.schemas.model import GatedDeltaNetSpec, MambaSpec, ModelSpec, MoESpec
from planner.search.refine import rank_of_modules, split_for
from planner.schemas.dims import ParallelDims
from planner.search.space import axis_orders

SMALL = ModelSpec(name="small", num_layers=6, hidden_size=512, ffn_hidden_size=1536, num_attention_heads=8,
                  num_kv_heads=4, vocab_size=8000, seq_len=1024, activation="swiglu", norm="rmsnorm")
MOE = SMALL.model_copy(update=dict(name="small-moe", moe=MoESpec(num_experts=16, top_k=2, expert_ffn_hidden_size=512)))


def _candidates(gpus: int, moe: bool):
    for tp, pp, cp in itertools.product((1, 2, 4), (1, 2, 3), (1, 2, 4)):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        for ep in ((1, 2, 4, 8, 16) if moe else (1,)):
            if (dp * cp) % ep or 16 % ep:
                continue
            for order in axis_orders(ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)):
                yield dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, axis_order=order, sp=tp > 1,
                           tp_overlap="domino" if tp > 1 else "none")


HYBRID = MOE.model_copy(update=dict(  # Gated DeltaNet, attention and Mamba layers (planner.cost.mixers)
    name="small-hybrid", layer_types=("linear", "full", "mamba", "linear", "full", "mamba"),
    linear_attention=GatedDeltaNetSpec(num_key_heads=4, num_value_heads=8, key_head_dim=32, value_head_dim=64),
    mamba=MambaSpec(d_inner=1024, dt_rank=32)))
CASES = [(SMALL, "dgx-h100", "bf16"), (MOE, "dgx-h100", "bf16"), (MOE, "mi300x-8", "fp8"), (SMALL, "dgx-a100-40g", "amp-bf16"),
         (HYBRID, "dgx-h100", "bf16")]


@pytest.mark.parametrize("model,topology,precision", CASES)
def test_floors_are_below_the_candidates_costs(model, topology, precision):
    stack = {"framework": "pytorch-fsdp"} if model is HYBRID else {}  # our executor does not build its mixers
    request = build_request(model=model, topology=topology, gpus=48, global_batch_size=96, seq_len=1024,
                            precision=precision, **stack)
    cost = CostModel(request)
    checked = 0
    for fields in _candidates(48, model.moe is not None):
        for mbs, recompute in ((1, "none"), (2, "selective"), (3, "full")):
            cand = Candidate(**fields, microbatch_size=mbs, num_microbatches=96 // (fields["dp"] * mbs) or 1,
                             recompute=recompute, schedule="1f1b")
            lc, floor = cost.layer_costs(cand), bounds.floor_costs(cost, cand)
            times = lc.forward_s + lc.backward_s + lc.recompute_s
            assert np.all(floor.forward_s + floor.backward_s + floor.recompute_s <= times * (1 + 1e-12))
            assert np.all(floor.full_recompute_s <= lc.full_recompute_s * (1 + 1e-12))
            assert np.array_equal(floor.activation_bytes, lc.activation_bytes)
            assert np.all(lc.recompute_s >= 0) and np.all(lc.full_recompute_s >= 0)  # family bounds drop recompute
            sample = bounds.per_sample_floor_s(cost, cand) * mbs
            assert sample <= float((lc.forward_s + lc.backward_s).sum()) * (1 + 1e-12)
            assert bounds.pp_comm_floor_s(cost, cand) <= pp_comm_s(cost, cand) * (1 + 1e-12)
            assert np.all(bounds.held_static_bytes(cost, cand) <= lc.static_bytes)
            ranks = rank_of_modules(split_for(model.num_layers, cand), cand.pp)
            for zero in (0, 1, 2, 3):
                staged = dataclasses.replace(cand, zero_stage=zero)
                floor = bounds.dp_exposed_s(cost, staged, ranks, floor=True)
                assert floor <= bounds.dp_exposed_s(cost, staged, ranks) * (1 + 1e-12)
            checked += 1
    assert checked > 50


def test_single_terms_equal_evaluate():
    request = build_request(model=MOE, topology="dgx-h100", gpus=48, global_batch_size=96, seq_len=1024)
    cost = CostModel(request)
    for fields in itertools.islice(_candidates(48, True), 0, None, 7):
        for zero, schedule in ((0, "1f1b"), (2, "gpipe"), (3, "zero-bubble")):
            cand = Candidate(**fields, microbatch_size=1, num_microbatches=96 // fields["dp"], zero_stage=zero,
                             schedule=schedule)
            ev = cost.evaluate(cand)
            if ev.raw_breakdown:  # a valid candidate
                ranks = rank_of_modules(split_for(MOE.num_layers, cand), cand.pp)
                assert pp_comm_s(cost, cand) == pytest.approx(ev.raw_breakdown["pp_comm_s"], rel=1e-12, abs=1e-15)
                assert bounds.dp_exposed_s(cost, cand, ranks) == pytest.approx(ev.raw_breakdown["dp_comm_exposed_s"],
                                                                               rel=1e-12, abs=1e-15)
                assert np.array_equal(cost.other_per_rank(cand), [cost.stage_other_bytes(cand, r) for r in range(cand.pp)])
                assert np.array_equal(cost.inflight_per_rank(cand),
                                      [cost.inflight_microbatches(cand, r) for r in range(cand.pp)])


def test_floor_is_shared_by_the_axis_orders_and_zero_with_a_profile():
    request = build_request(model=SMALL, topology="dgx-h100", gpus=48, global_batch_size=96, seq_len=1024)
    cost = CostModel(request)
    a = Candidate(dp=4, tp=2, pp=3, cp=2, microbatch_size=1, num_microbatches=24, axis_order=("pp", "dp", "cp", "tp"))
    b = dataclasses.replace(a, axis_order=("cp", "dp", "pp", "tp"))
    assert bounds.floor_costs(cost, a) is bounds.floor_costs(cost, b)
    profiled = CostModel(request, profile=None)
    profiled.profile = object()  # any measured profile: its times follow no formula
    assert bounds.per_sample_floor_s(profiled, a) == 0.0


def test_single_node_topology_without_a_fabric_plans():
    """`cpu` has one node and no inter-node fabric (bandwidth 0): the floors consider only the footprints a
    group can have there (one node), never a link with no bandwidth (it once divided by zero)."""
    from planner import api

    request = build_request(model="profiles/specs/small-llama.yaml", topology="cpu", gpus=4, global_batch_size=8,
                            seq_len=256, precision="fp32")
    cost = CostModel(request)
    for pp in (2, 4):
        cand = Candidate(dp=4 // pp, tp=1, pp=pp, microbatch_size=1, num_microbatches=8, recompute="none", schedule="1f1b")
        assert 0 < bounds.pp_comm_floor_s(cost, cand) <= pp_comm_s(cost, cand) * (1 + 1e-12)
    plan = api.plan(request)
    assert plan.parallelism.dp * plan.parallelism.tp * plan.parallelism.pp == 4


def test_floors_stay_below_where_the_stack_moe_overlap_depends_on_the_layout():
    """megatron-core runs its EP overlap only with virtual stages when pp > 1 and without full recompute
    (planner.cost.moe_comm.batch_overlap_applies): the floors, shared by every vpp of a shape, take the overlap
    wherever the stack has it, so they stay below every member's costs (the members' own arrays are kept per
    overlap: planner.search.members.order_arrays)."""
    request = build_request(model=MOE, topology="dgx-h100", gpus=48, global_batch_size=96, seq_len=1024,
                            framework="megatron-core")
    cost = CostModel(request)
    checked = overlapped = 0
    for fields in itertools.islice(_candidates(48, True), 0, None, 3):
        if fields["ep"] == 1 or fields["cp"] > 1:
            continue
        for vpp, recompute in ((1, "none"), (2, "none"), (1, "full"), (2, "selective")):
            if vpp > 1 and fields["pp"] == 1:
                continue
            cand = Candidate(**fields, microbatch_size=1, num_microbatches=96 // fields["dp"], recompute=recompute,
                             vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b")
            lc = cost.layer_costs(cand)
            times = lc.forward_s + lc.backward_s + lc.recompute_s
            for floor in (bounds.floor_costs(cost, dataclasses.replace(cand, vpp=1, recompute="none", schedule="1f1b")),
                          bounds.floor_costs(cost, dataclasses.replace(cand, vpp=1, schedule="1f1b"))):
                assert np.all(floor.forward_s + floor.backward_s <= (lc.forward_s + lc.backward_s) * (1 + 1e-12))
                assert np.all(floor.full_recompute_s <= lc.full_recompute_s * (1 + 1e-12))
            assert bounds.per_sample_floor_s(cost, cand) <= float((lc.forward_s + lc.backward_s).sum()) * (1 + 1e-12)
            overlapped += moe_batch_overlap(cost, cand)
            checked += times.size > 0
    assert checked > 20 and 0 < overlapped < checked


def test_batched_floors_equal_one_variant_at_a_time():
    """The search asks the pp and dp floors of every (schedule, vpp) variant of a group in one call
    (pp_comm_floors_s, dp_exposed_floors_s): each value is the one-variant function's, to the bit."""
    request = build_request(model=MOE, topology="dgx-h100", gpus=48, global_batch_size=96, seq_len=1024)
    cost = CostModel(request)
    variants = [("gpipe", 1), ("1f1b", 1), ("zero-bubble", 1), ("interleaved", 2), ("zbv", 2), ("dualpipev", 2)]
    checked = 0
    for fields in itertools.islice(_candidates(48, True), 0, None, 3):
        if fields["pp"] == 1:
            continue
        base = Candidate(**fields, microbatch_size=1, num_microbatches=96 // fields["dp"])
        one = [bounds.pp_comm_floor_s(cost, dataclasses.replace(base, schedule=s, vpp=v)) for s, v in variants]
        assert bounds.pp_comm_floors_s(cost, base, variants) == one
        for zero in (0, 1, 2, 3):
            cands = [dataclasses.replace(base, zero_stage=zero, schedule=s, vpp=v) for s, v in variants]
            splits = [rank_of_modules(split_for(MOE.num_layers, c), c.pp, c.schedule in ("zbv", "dualpipev")) for c in cands]
            single = [bounds.dp_exposed_s(cost, c, ranks, floor=True) for c, ranks in zip(cands, splits)]
            assert bounds.dp_exposed_floors_s(cost, cands[0], bounds.dp_split_rows(cost, cands, splits)) == single
            checked += 1
    assert checked > 10
