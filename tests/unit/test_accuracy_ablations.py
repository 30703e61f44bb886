"""The ablation table of benchmarks/accuracy.py names real switches: each row is a CostOptions field, a reading
rule of the conversion, or the shared collective formula, whose swap is undone on exit."""

import sys
from pathlib import Path

import pytest

from planner.cost import comm
from planner.topology.groups import GroupLink

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import accuracy_views as V  # noqa: E402
import published_runs as P  # noqa: E402


def test_every_ablation_row_switches_something_real():
    fields = V.field_names()
    for label, field, _ in V.ABLATIONS:
        assert field in fields or field in P.READING_RULES or field in V.SWAPS, label


def test_the_new_mechanisms_switch_off_for_every_stack():
    for field in ("fp8_casts", "zero3_layer_collectives"):
        assert set(V.ablation_overrides(field, False)) == set(V.STACKS)


def test_ring_latency_ablation_counts_per_node_and_restores():
    link = GroupLink(size=64, num_nodes=8, ranks_per_node=8, inter_bandwidth_GBps=25.0, inter_latency_s=5e-6,
                     intra_bandwidth_GBps=230.0, intra_latency_s=3e-6)
    shipped = comm.all_gather_s(1e6, group=link)
    with V.ring_latency_per_node():
        assert comm.half_ring_latency_s(link) == pytest.approx(7 * 3e-6 + 7 * 5e-6)
        assert comm.all_gather_s(1e6, group=link) == pytest.approx(shipped - (56 - 7) * 3e-6)
    assert comm.half_ring_latency_s(link) == pytest.approx(56 * 3e-6 + 7 * 5e-6)
    assert comm.all_gather_s(1e6, group=link) == shipped


def test_mtp_slot_ablation_puts_the_mtp_layer_on_top_and_restores():
    from planner import api
    from planner.cost import evaluate
    from planner.cost.model import Candidate, CostModel

    spec = api.load_model("deepseek-v3").model_copy(update={"mtp_num_layers": 1})
    request = api.build_request(model=spec, topology="dgx-h100", gpus=1024, global_batch_size=1024, seq_len=4096,
                                framework="megatron-core")
    cand = Candidate(dp=64, tp=1, pp=16, ep=64, microbatch_size=1, num_microbatches=16, zero_stage=1, recompute="full")
    shipped = CostModel(request).evaluate(cand)
    with V.mtp_on_top():
        plain = CostModel(request).evaluate(cand)
    assert shipped.stage_layers[-1] == 2 and plain.stage_layers[-1] == 3 and plain.step_time_s > shipped.step_time_s
    assert evaluate.balanced_split(61, 16, last_slots=1)[-1] == 2
