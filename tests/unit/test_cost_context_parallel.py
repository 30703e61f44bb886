"""Context parallelism's communication per flavour (planner.cost.context_parallel) against the formulas of the
stacks' implementations: ring p2p beside the blockwise attention, all-gather of K/V, all-to-all by heads."""

import pytest

from planner import api
from planner.cost import comm, context_parallel
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import options_for
from planner.topology.groups import GroupLink

LINK = GroupLink(size=8, num_nodes=1, ranks_per_node=8, inter_bandwidth_GBps=45.0, inter_latency_s=0.0,
                 intra_bandwidth_GBps=100.0, intra_latency_s=0.0)
KV, Q = 1e9, 2e9


def test_ring_hides_behind_the_attention_core():
    fwd, bwd = context_parallel.ring_s(kv_bytes=KV, cp=8, group=LINK, core_fwd_s=0.03, core_bwd_s=0.1)
    assert fwd == pytest.approx(7 * KV / 100e9 - 0.03) and bwd == pytest.approx(max(0.0, 7 * 2 * KV / 100e9 - 0.1))


def test_allgather_hides_only_behind_the_local_block():
    fwd, bwd = context_parallel.allgather_s(kv_bytes=KV, cp=8, group=LINK, core_fwd_s=0.08, core_bwd_s=0.16)
    gather = comm.all_gather_s(8 * KV, group=LINK)
    assert fwd == pytest.approx(gather - 0.01)
    assert bwd == pytest.approx(gather + comm.reduce_scatter_s(8 * KV, group=LINK) - 0.02)


def test_heads_all_to_all_is_exposed_and_needs_divisible_heads():
    one = comm.all_to_all_s(2 * Q + KV, group=LINK)
    assert context_parallel.heads_s(q_bytes=Q, kv_bytes=KV, group=LINK) == (one, one)
    only_heads = context_parallel.exposed_s(("a2a",), q_bytes=Q, kv_bytes=KV, cp=8, heads=32, kv_heads=8, group=LINK,
                                            core_fwd_s=1.0, core_bwd_s=1.0)
    assert only_heads == (one, one)
    undivisible = context_parallel.exposed_s(("ulysses",), q_bytes=Q, kv_bytes=KV, cp=8, heads=32, kv_heads=4,
                                             group=LINK, core_fwd_s=1.0, core_bwd_s=1.0)
    assert undivisible == context_parallel.ring_s(kv_bytes=KV, cp=8, group=LINK, core_fwd_s=0.0, core_bwd_s=0.0)


def test_the_stacks_flavours_and_the_least_is_taken():
    assert options_for("megatron-core", "bf16").cp_flavours == ("p2p", "all_gather", "a2a", "a2a+p2p")
    assert options_for("torchtitan", "bf16").cp_flavours == ("allgather",)  # torchtitan 0.3: torch's default
    both = context_parallel.exposed_s(("allgather", "alltoall"), q_bytes=Q, kv_bytes=KV, cp=8, heads=32, kv_heads=8,
                                      group=LINK, core_fwd_s=0.08, core_bwd_s=0.16)
    ring = context_parallel.ring_s(kv_bytes=KV, cp=8, group=LINK, core_fwd_s=0.08, core_bwd_s=0.16)
    gather = context_parallel.allgather_s(kv_bytes=KV, cp=8, group=LINK, core_fwd_s=0.08, core_bwd_s=0.16)
    assert both == min(ring, gather, key=sum)


def test_long_context_step_has_a_cp_term():
    """Llama 3 8B at 16k tokens, cp 16 over two nodes: the breakdown carries the exposed CP communication, the
    least of megatron-core's flavours (each one's own term is no smaller), and it adds to the step."""
    import dataclasses

    m = CostModel(api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=1,
                                    seq_len=16384, framework="megatron-core"))
    cand = Candidate(dp=1, tp=1, pp=1, cp=16, microbatch_size=1, num_microbatches=1, recompute="full", zero_stage=1)
    least = m.evaluate(cand)

    def alone(flavour):
        return CostModel(m.request, options=dataclasses.replace(m.options, cp_flavours=(flavour,))).evaluate(cand)

    ring, gathered, heads = alone("p2p"), alone("all_gather"), alone("a2a")
    assert 0.0 < least.breakdown.cp_comm_s == min(x.breakdown.cp_comm_s for x in (ring, gathered, heads))
    assert heads.step_time_s - least.step_time_s == pytest.approx(
        heads.breakdown.cp_comm_s - least.breakdown.cp_comm_s + heads.breakdown.recompute_s - least.breakdown.recompute_s, rel=1e-6)


# ---- the flavour each stack's default calls, carried by the plan and written by the export -----------------------

def test_an_unpriced_flavour_is_left_out_not_priced_as_ring():
    """TE's a2a+p2p (hierarchical) has no pricing here: it is not a choice (it used to fall back to ring)."""
    from planner.cost import context_parallel as C

    kw = dict(q_bytes=Q, kv_bytes=KV, cp=8, heads=32, kv_heads=8, group=LINK, core_fwd_s=0.0, core_bwd_s=0.0)
    assert set(C.options(("p2p", "a2a+p2p"), **kw)) == {"p2p"}
    assert C.choose(("p2p",), **kw)[0] == "p2p"
    assert C.choose(("p2p",), **{**kw, "cp": 1}) == (None, 0.0, 0.0)


def test_torchtitan_runs_torchs_allgather_rotation():
    """torchtitan 0.3 has no rotate-method setting; torch's context parallel defaults to ALL_GATHER."""
    from planner.frameworks import load_framework

    assert load_framework("torchtitan").capabilities.context_parallel.flavours == ("allgather",)
    attention = pytest.importorskip("torch.distributed.tensor.experimental._attention")
    assert attention._cp_options.rotate_method == attention._RotateMethod.ALL_GATHER
    configs = pytest.importorskip("torchtitan.config.configs")
    assert not any("rotate" in name for name in configs.ParallelismConfig.__dataclass_fields__)


def test_the_plan_carries_the_cp_flavour_and_megatron_writes_it():
    from planner import api
    from planner.export import export_plan
    from planner.schemas.plan import Configuration, Parallelism

    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=16, seq_len=32768,
                                framework="megatron-core")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=2, tp=2, pp=1, cp=4, sp=True, zero_stage=1),
                                               schedule="1f1b"))
    assert plan.parallelism.cp_comm_type in ("p2p", "all_gather", "a2a")
    assert f"--cp-comm-type {plan.parallelism.cp_comm_type}" in export_plan(plan, "megatron").text
    titan = api.estimate(api.build_request(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=16,
                                           seq_len=32768, framework="torchtitan"),
                         Configuration(parallelism=Parallelism(dp=2, tp=2, pp=1, cp=4, sp=True, zero_stage=2), schedule="1f1b"))
    assert titan.parallelism.cp_comm_type == "allgather"
