"""Compute contention (planner.cost.contention): ranks sharing a node's compute slots (CPU cores)."""

import pytest

from planner import api
from planner.cost.contention import fair_share_stretch, ranks_per_node, shared_step_s
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


def test_shared_step_is_node_work_over_slots_plus_comm_at_least_the_critical_path():
    topo = api.load_topology("cpu")  # 2 slots
    # 4 identical ranks: twice their work, plus the exposed communication
    assert shared_step_s(1.0, work_s=[0.8], comm_s=0.2, world_size=4, topology=topo) == pytest.approx(4 * 0.8 / 2 + 0.2)
    # a pipeline whose light ranks wait in the bubble: node work / slots is below the critical path
    assert shared_step_s(1.0, work_s=[0.2, 0.2, 0.2, 0.6], comm_s=0.0, world_size=4, topology=topo) == 1.0
    assert shared_step_s(1.0, work_s=[0.6, 0.6, 0.6, 0.6], comm_s=0.0, world_size=4, topology=topo) == pytest.approx(1.2)
    assert shared_step_s(1.0, work_s=[5.0], comm_s=0.0, world_size=2, topology=topo) == 1.0  # a slot per rank


def test_oversubscribed_data_parallel_doubles_compute_and_exposes_the_reduction():
    free, shared = _step(None, dp=4, pp=1), _step(2, dp=4, pp=1)
    f, s = free.breakdown, shared.breakdown
    work = f.compute_s + f.recompute_s + f.optimizer_s
    assert shared.step_time_s == pytest.approx(2 * work + s.dp_comm_exposed_s)  # 4 ranks on 2 slots
    assert s.dp_comm_exposed_s >= f.dp_comm_exposed_s  # gloo's copies need the cores: nothing overlaps
    assert sum(s.model_dump().values()) == pytest.approx(shared.step_time_s)


def test_oversubscribed_pipeline_lies_between_the_critical_path_and_the_stretched_one():
    free, shared = _step(None, dp=1, pp=4), _step(2, dp=1, pp=4)
    f, s = free.breakdown, shared.breakdown
    stretched = free.step_time_s + f.compute_s + f.recompute_s + f.bubble_s + f.optimizer_s
    assert free.step_time_s <= shared.step_time_s < stretched  # the bubble is idle time, not work
    assert sum(s.model_dump().values()) == pytest.approx(shared.step_time_s)
    assert (s.pp_comm_s, s.bubble_s) == pytest.approx((f.pp_comm_s, f.bubble_s))


def test_gpu_topologies_have_no_slot_limit():
    assert api.load_topology("dgx-h100").compute_slots_per_node is None
    assert api.load_topology("cpu").compute_slots_per_node == 2
