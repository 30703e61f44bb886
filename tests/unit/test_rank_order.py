"""A plan made for a stack with a fixed rank layout (Megatron-Core: tp-cp-ep-dp-pp, megatron/core/parallel_state.py;
torchtitan: [pp, dp_replicate, dp_shard, cp, tp], torchtitan/distributed/parallel_dims.py) is placed in that order and
its links are priced for it; our executor keeps choosing among orders."""

import pytest

from planner import api
from planner.frameworks import load_framework
from planner.schemas.plan import SearchLimits
from planner.topology.placement import axis_link, rank_map

FAST = SearchLimits(max_microbatch_size=2, top_k=4, time_limit_s=30)


@pytest.mark.parametrize("framework", ["megatron-core", "torchtitan"])
def test_the_stacks_own_order_is_the_only_one_planned(framework):
    order = load_framework(framework).capabilities.rank_order.axes
    request = api.build_request(model="llama3-70b", topology="dgx-h100", nodes=16, global_batch_size=512, seq_len=8192,
                                framework=framework, search=FAST)
    plan = api.plan(request)
    assert plan.parallelism.axis_order == order
    assert all(a.parallelism.axis_order == order for a in plan.alternatives)
    assert any("links priced in that order" in note for note in plan.notes)
    # the priced placement: every rank's coordinates follow the stack's order (tp innermost, pp outermost)
    par = plan.parallelism
    sizes = {"pp": par.pp, "dp": par.dp, "cp": par.cp, "tp": par.tp, "ep": par.ep}
    for entry in plan.ranks:
        expected = list(rank_map(request.topology, sizes, order))[entry.rank]
        assert entry.coords == expected.coords
    # and the links the cost model priced are those of that layout: TP inside a node when tp <= 8
    if par.tp > 1:
        assert axis_link(request.topology, sizes, order, "tp").num_nodes == 1


def test_the_executor_keeps_its_freedom():
    request = api.build_request(model="llama3-70b", topology="dgx-h100", nodes=16, global_batch_size=512, seq_len=8192,
                                framework="planner", search=FAST.model_copy(update={"fixed": {"pp": 4, "tp": 8}}))
    plan = api.plan(request)
    assert load_framework("planner").capabilities.rank_order is None
    assert any(note.startswith("placement (axis order, outermost first) compared") for note in plan.notes)
