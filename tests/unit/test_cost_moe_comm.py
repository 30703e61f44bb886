"""MoE dispatch as the stacks run it (planner.cost.moe_comm): the dispatcher, its overlap, and the slowest
expert-parallel rank's load under routing skew and a capacity factor."""

import dataclasses

import pytest

from planner import api
from planner.cost import comm, moe_comm
from planner.cost.arrays import priced_choices
from planner.cost.model import Candidate, CostModel
from planner.schemas.model import MoESpec

MOE = MoESpec(num_experts=64, top_k=8, expert_ffn_hidden_size=2048, num_shared_experts=1)


def test_load_factor_is_capacity_or_one_plus_skew():
    assert moe_comm.load_factor(MOE) == 1.0
    skewed = MOE.model_copy(update={"routing_skew": 0.3})
    assert moe_comm.load_factor(skewed) == pytest.approx(1.3) and moe_comm.dropped_fraction(skewed) == 0.0
    capped = skewed.model_copy(update={"capacity_factor": 1.1})  # padded to 1.1, the rest dropped
    assert moe_comm.load_factor(capped) == pytest.approx(1.1)
    assert moe_comm.dropped_fraction(capped) == pytest.approx(0.2 / 1.3)


def _ep_link(gpus=64, ep=64):
    m = CostModel(api.build_request(model="deepseek-v3", topology="hgx-h800", gpus=gpus, global_batch_size=gpus,
                                    seq_len=4096, framework="megatron-core"))
    cand = Candidate(dp=gpus, tp=1, pp=1, ep=ep, microbatch_size=1, num_microbatches=1, zero_stage=1)
    return m, cand, m.links(cand).ep


def test_dispatch_is_the_fastest_dispatcher_the_stack_runs():
    """GShard all-to-all of tokens * top_k * h; DeepEP's per-node dedup; Megatron's all-gather of all tokens."""
    _, _, link = _ep_link()
    tokens, h = 4096, 7168
    a2a = comm.all_to_all_s(tokens * 8 * h * 2, group=link)
    dedup = comm.hierarchical_all_to_all_s(tokens * 8 * h * 2, top_k=8, group=link)
    gather = comm.all_gather_s(tokens * link.size * h * 2, group=link)
    assert moe_comm.dispatch_s(tokens, MOE, h, group=link, hierarchical=False, allgather=False) == pytest.approx(a2a)
    assert moe_comm.dispatch_s(tokens, MOE, h, group=link, hierarchical=True, allgather=True) == pytest.approx(
        min(a2a, dedup, gather))
    assert dedup < a2a  # 8 nodes: a token's 8 copies cross the NICs to at most its distinct nodes


def test_overlap_hides_behind_another_micro_batch_or_the_shared_experts():
    assert moe_comm.exposed_s(5.0, layer_compute_s=3.0, shared_compute_s=1.0, batch_overlap=True, shared_overlap=True) == 2.0
    assert moe_comm.exposed_s(5.0, layer_compute_s=3.0, shared_compute_s=1.0, batch_overlap=False, shared_overlap=True) == 4.0
    assert moe_comm.exposed_s(5.0, layer_compute_s=3.0, shared_compute_s=1.0, batch_overlap=False, shared_overlap=False) == 5.0


def test_stack_overlap_and_skew_move_the_step():
    """megatron-core overlaps EP communication (its profile); switched off, more is exposed; a skewed router makes
    the slowest EP rank slower, a capacity factor caps it."""
    m, cand, _ = _ep_link()
    on = m.evaluate(cand)
    off = CostModel(m.request, options=dataclasses.replace(m.options, moe_overlap=False, moe_shared_overlap=False)).evaluate(cand)
    assert off.breakdown.ep_comm_s > on.breakdown.ep_comm_s and off.step_time_s > on.step_time_s
    moe = m.spec.moe
    skewed = m.request.model_copy(update={"model": m.spec.model_copy(update={"moe": moe.model_copy(update={"routing_skew": 0.5})})})
    capped = m.request.model_copy(update={"model": m.spec.model_copy(update={"moe": moe.model_copy(
        update={"routing_skew": 0.5, "capacity_factor": 1.0})})})
    t_skew, t_cap = CostModel(skewed).evaluate(cand).step_time_s, CostModel(capped).evaluate(cand).step_time_s
    assert t_skew > on.step_time_s and t_cap == pytest.approx(on.step_time_s, rel=1e-6)


def test_group_limited_routing_caps_the_nodes_a_token_reaches():
    """DeepSeek-V3's node-limited routing (n_group 8, topk_group 4; report Sec. 2.1.2): with EP64 over 8 nodes each
    node holds one group of 32 experts, so a token's 8 experts are on at most 4 nodes; fewer copies cross the NICs
    than with the 8 experts spread over all 8 nodes."""
    m, cand, link = _ep_link()
    cfg = m.spec.moe
    assert (cfg.num_groups, cfg.group_topk, link.num_nodes) == (8, 4, 8)
    assert moe_comm.routed_node_limit(cfg, link) == 4
    free = cfg.model_copy(update={"num_groups": None, "group_topk": None})
    assert moe_comm.routed_node_limit(free, link) is None
    limited = comm.hierarchical_all_to_all_s(1e9, top_k=8, group=link, max_nodes=4)
    spread = comm.hierarchical_all_to_all_s(1e9, top_k=8, group=link)
    assert limited < spread
    # the remote copies: 4 * (1 - (3/4)^8) nodes reached, 7/8 of them remote, against 8 * (1 - (7/8)^8) * 7/8
    reached, everywhere = 4 * (1 - 0.75 ** 8) * 7 / 8, 8 * (1 - 0.875 ** 8) * 7 / 8
    inter = link.inter_bandwidth_GBps * 1e9
    assert limited - spread == pytest.approx((reached - everywhere) * 1e9 / 8 / inter, rel=1e-6)
    # groups straddling nodes (16 nodes of 16 experts, groups of 32) limit nothing
    wide = dataclasses.replace(link, size=128, num_nodes=16)
    assert moe_comm.routed_node_limit(cfg, wide) is None


def test_megatron_ep_overlap_holds_one_more_microbatch():
    """Megatron-Core's combined 1F1B (--overlap-moe-expert-parallel-comm): one more warm-up forward of a model
    chunk with virtual stages (schedules.py get_pp_rank_microbatches, num_warmup_microbatches + 1), micro-batch
    i+1's forward beside micro-batch i's backward without a pipeline (combined_1f1b.py); nothing where the overlap
    does not run (full recompute, ep 1) or the stack has no such schedule."""
    def model(framework):
        return CostModel(api.build_request(model="mixtral-8x7b", topology="dgx-h100", gpus=16, global_batch_size=64,
                                           seq_len=4096, framework=framework))

    m = model("megatron-core")
    flat = Candidate(dp=16, tp=1, pp=1, ep=8, microbatch_size=1, num_microbatches=4, zero_stage=1)
    looped = Candidate(dp=8, tp=1, pp=2, ep=8, vpp=2, schedule="interleaved", microbatch_size=1, num_microbatches=8,
                       zero_stage=1)
    assert priced_choices(m, flat)[0] in moe_comm.OVERLAPPED_DISPATCHERS  # the overlap runs: alltoall or flex
    for cand, extra in ((flat, 1.0), (looped, 0.5)):
        base = m.schedule_inflight_per_rank(cand)
        assert m.ep_overlap_extra_microbatches(cand) == extra
        assert list(m.inflight_per_rank(cand)) == pytest.approx(list(base + extra))
        assert m.inflight_microbatches(cand, 0) == pytest.approx(base[0] + extra)
    assert m.ep_overlap_extra_microbatches(dataclasses.replace(flat, recompute="full")) == 0.0
    assert m.ep_overlap_extra_microbatches(dataclasses.replace(flat, ep=1)) == 0.0
    assert model("torchtitan").ep_overlap_extra_microbatches(flat) == 0.0
    held = m.evaluate(flat).stage_memory[0].activations_bytes
    off = CostModel(m.request, options=dataclasses.replace(m.options, moe_overlap_extra_microbatch=False))
    assert held > off.evaluate(flat).stage_memory[0].activations_bytes
