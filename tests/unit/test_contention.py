"""Compute contention (planner.cost.contention): ranks sharing a node's compute slots (CPU cores)."""

import pytest

from planner import api
from planner.cost.contention import fair_share_stretch, ranks_per_node
from planner.schemas.plan import Configuration, Parallelism


def test_stretch_is_ranks_over_slots():
    assert fair_share_stretch(ranks=4, slots=2) == pytest.approx(2.0)
    assert fair_share_stretch(ranks=3, slots=2) == pytest.approx(1.5)


def test_no_stretch_with_a_slot_per_rank_or_no_limit():
    assert fair_share_stretch(ranks=2, slots=2) == 1.0
    assert fair_share_stretch(ranks=8, slots=None) == 1.0


def test_ranks_per_node_fill_the_first_node():
    assert ranks_per_node(4, 8) == 4 and ranks_per_node(16, 8) == 8


def _step(slots, **par):
    topo = api.load_topology("cpu").model_copy(update={"compute_slots_per_node": slots})
    request = api.build_request(model="profiles/specs/small-llama.yaml", topology=topo, gpus=4, global_batch_size=8,
                                seq_len=256, precision="fp32")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(tp=1, **par), microbatch_size=1))
    return plan.prediction


@pytest.mark.parametrize("par", [{"dp": 4, "pp": 1}, {"dp": 1, "pp": 4}])
def test_oversubscribed_node_stretches_compute_and_bubble_not_comm(par):
    free, shared = _step(None, **par), _step(2, **par)
    f, s = free.breakdown, shared.breakdown
    stretched = f.compute_s + f.recompute_s + f.bubble_s + f.optimizer_s
    assert shared.step_time_s == pytest.approx(free.step_time_s + stretched)  # 4 ranks on 2 slots: twice as long
    assert sum(s.model_dump().values()) == pytest.approx(shared.step_time_s)
    assert (s.dp_comm_exposed_s, s.pp_comm_s, s.bubble_s) == pytest.approx((f.dp_comm_exposed_s, f.pp_comm_s, f.bubble_s))


def test_gpu_topologies_have_no_slot_limit():
    assert api.load_topology("dgx-h100").compute_slots_per_node is None
    assert api.load_topology("cpu").compute_slots_per_node == 2
