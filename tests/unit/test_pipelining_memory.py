"""planner.cost.pipelining_memory against torch's own ZB1P action lists: the chunk-micro-batches whose graph a rank
holds (forward done, W pass not yet) and those whose weight-gradient inputs it holds (B done, W not yet), at most,
walking the order torch 2.13's ScheduleInterleavedZeroBubble builds (schedules.py _get_warmup_ops,
_get_1f1b_rank_ops with enable_zero_bubble). Skips without torch."""

import pytest

from planner.cost import pipelining_memory as pm

schedules = pytest.importorskip("torch.distributed.pipelining.schedules")


def _rank_ops(pp: int, rank: int, m: int, vpp: int):
    """The actions of `rank` as ScheduleInterleavedZeroBubble._calculate_single_rank_operations makes them."""
    rounds = max(1, m // pp)
    per_round = m // rounds
    warmup = schedules._get_warmup_ops(rank, vpp, per_round, pp, m, multiply_factor=1)
    total = vpp * m
    fwd_bwd = total - warmup

    def fwd_index(step):
        return ((step // per_round) % vpp) * pp + rank

    def bwd_index(step):
        return (vpp - 1 - ((step - warmup) // per_round) % vpp) * pp + rank

    return schedules._get_1f1b_rank_ops(vpp, pp, warmup, fwd_bwd, total - fwd_bwd, rank, fwd_index, bwd_index,
                                        rank, enable_zero_bubble=True)


def _held(ops):
    """(most chunk-micro-batches with a live graph, most with weight-gradient inputs held) over the action list."""
    graph = inputs = 0
    most_graph = most_inputs = 0
    for op in ops:
        if op is None:
            continue
        kind = op.computation_type.value
        if kind in ("F", "FORWARD"):
            graph += 1
        elif kind in ("I", "BACKWARD_INPUT"):
            inputs += 1
        elif kind in ("W", "BACKWARD_WEIGHT"):
            graph -= 1
            inputs -= 1
        most_graph, most_inputs = max(most_graph, graph), max(most_inputs, inputs)
    return most_graph, most_inputs


@pytest.mark.parametrize("pp, vpp, m", [(2, 1, 8), (4, 1, 8), (4, 1, 32), (4, 2, 8), (8, 1, 16), (2, 2, 4)])
def test_held_counts_follow_torch_zb1p(pp, vpp, m):
    for rank in range(pp):
        graph, inputs = _held(_rank_ops(pp, rank, m, vpp))
        assert pm.zb_inflight(pp, rank, m, vpp) * vpp == graph, (rank, graph)
        assert pm.zb_weight_grad_held(pp, rank, m, vpp) * vpp == inputs, (rank, inputs)


def test_receive_buffers_per_microbatch():
    """1F1B: rank 0 a gradient buffer per micro-batch, middle ranks both, the last an activation buffer (s*b*h bf16
    each); interleaved: per local stage; none for a stack without the fact."""
    from planner import api
    from planner.cost.model import Candidate, CostModel

    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=8192,
                                framework="planner")
    model = CostModel(request)
    one = 8192 * 4096 * 2
    cand = Candidate(dp=2, tp=1, pp=4, microbatch_size=1, num_microbatches=32, schedule="1f1b")
    assert pm.recv_buffer_bytes(model, cand).tolist() == [32 * one, 64 * one, 64 * one, 32 * one]
    looped = Candidate(dp=2, tp=1, pp=4, vpp=2, microbatch_size=1, num_microbatches=32, schedule="interleaved")
    assert pm.recv_buffer_bytes(model, looped).tolist() == [96 * one, 128 * one, 128 * one, 96 * one]
    megatron = CostModel(request.model_copy(update={"framework": "megatron-core"}))
    assert not pm.recv_buffer_bytes(megatron, cand).any()
