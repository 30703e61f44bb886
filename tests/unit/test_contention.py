"""Compute contention (planner.cost.contention): ranks sharing a node's compute slots (CPU cores)."""

import pytest

from planner import api
from planner.cost.contention import node_compute_bound_s, ranks_per_node
from planner.schemas.plan import Configuration, Parallelism


def test_bound_is_total_work_over_slots_plus_tail():
    assert node_compute_bound_s(0.5, ranks=4, slots=2, tail_s=0.1) == pytest.approx(4 * 0.5 / 2 + 0.1)


def test_no_bound_with_a_slot_per_rank_or_no_limit():
    assert node_compute_bound_s(0.5, ranks=2, slots=2, tail_s=0.1) == 0.0
    assert node_compute_bound_s(0.5, ranks=8, slots=None) == 0.0


def test_ranks_per_node_fill_the_first_node():
    assert ranks_per_node(4, 8) == 4 and ranks_per_node(16, 8) == 8


def _step(slots):
    topo = api.load_topology("cpu").model_copy(update={"compute_slots_per_node": slots})
    request = api.build_request(model="profiles/specs/small-llama.yaml", topology=topo, gpus=4, global_batch_size=8,
                                seq_len=256, precision="fp32")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=4, tp=1, pp=1), microbatch_size=1))
    return plan.prediction


def test_oversubscribed_node_stretches_compute_and_the_breakdown_adds_up():
    free, shared = _step(None), _step(2)
    assert shared.step_time_s > 1.5 * free.step_time_s
    assert sum(shared.breakdown.model_dump().values()) == pytest.approx(shared.step_time_s)
    assert shared.breakdown.compute_s > free.breakdown.compute_s


def test_gpu_topologies_have_no_slot_limit():
    assert api.load_topology("dgx-h100").compute_slots_per_node is None
    assert api.load_topology("cpu").compute_slots_per_node == 2
