"""Multi-token prediction (planner.cost.mtp): its parameters, FLOPs and time on the last stage against the module's
definition (DeepSeek-V3 sec. 2.2; Megatron-Core multi_token_prediction.py), the default split with the MTP slot
against Megatron's DeepSeek-V3 layout, the Megatron export judged by megatron-core, and the stacks that refuse it."""

import dataclasses

import numpy as np
import pytest

from planner import api
from planner.cost import arrays, compute, mtp
from planner.cost.layer_terms import Env, gemm_times
from planner.cost.layers import module_params
from planner.check import configuration_of
from planner.cost.model import Candidate, CostModel
from planner.frameworks import load_framework, model_refusal
from planner.frameworks_split import balanced_split, megatron_flags, megatron_layout
from planner.models import counting
from planner.schemas.model import ModelSpec

DSV3 = api.load_model("deepseek-v3")
DSV3_MTP = DSV3.model_copy(update={"mtp_num_layers": 1})


def _model(spec, framework="megatron-core", gpus=1024):
    request = api.build_request(model="deepseek-v3", topology="dgx-h100", gpus=gpus, global_batch_size=1024,
                                seq_len=4096, framework=framework)
    return CostModel(request.model_copy(update={"model": spec}))


PP16 = Candidate(dp=64, tp=1, pp=16, ep=64, microbatch_size=1, num_microbatches=16, zero_stage=1, recompute="full")


def test_mtp_parameters_are_norms_projection_and_one_more_last_layer_on_the_last_stage():
    n, h = DSV3.num_layers, DSV3.hidden_size
    for tp, ep, tied_copy in ((1, 64, True), (2, 8, False)):
        dense0, expert0 = module_params(DSV3, tp=tp, ep=ep, tied_copy=tied_copy)
        dense1, expert1 = module_params(DSV3_MTP, tp=tp, ep=ep, tied_copy=tied_copy)
        assert np.array_equal(dense0[:-1], dense1[:-1]) and np.array_equal(expert0[:-1], expert1[:-1])
        embedding_copy = counting.embedding_params(DSV3) / tp if tied_copy else 0.0  # gpt_model.py: mtp_process
        want = 3 * counting.norm_params(DSV3) + 2 * h * h / tp + dense0[n] + embedding_copy
        assert dense1[-1] - dense0[-1] == pytest.approx(want)
        assert expert1[-1] - expert0[-1] == pytest.approx(expert0[n])  # the MTP layer is an MoE layer like the last


def test_mtp_flops_are_its_layer_projection_and_head_once_more():
    f0 = arrays.flops_per_sequence(_model(DSV3))
    f1 = arrays.flops_per_sequence(_model(DSV3_MTP))
    shape = compute.Shape(microbatch_size=1, seq_len=4096)
    proj = compute.gemms_flops(mtp.projection_gemms(DSV3, shape, full=True))
    assert proj == pytest.approx(2 * 4096 * 2 * DSV3.hidden_size * DSV3.hidden_size)
    for before, after in zip(f0[:2], f1[:2]):  # model and hardware FLOPs
        assert np.array_equal(before[:-1], after[:-1])
        assert after[-1] - before[-1] == pytest.approx(before[-2] + proj + before[-1])


def test_the_head_column_carries_the_mtp_layer_and_a_second_head():
    m0, m1 = _model(DSV3), _model(DSV3_MTP)
    t0, t1 = arrays.module_table(m0, PP16), arrays.module_table(m1, PP16)
    col = {f: i for i, f in enumerate(arrays.MODULE_FIELDS)}
    assert np.array_equal(t0[:, :-1], t1[:, :-1])
    layer, head0, head1 = t0[:, -2], t0[:, -1], t1[:, -1]
    env = Env(spec=m1.spec, device=m1.device, cal=m1.cal, precision=m1.request.precision, shape=m1.shape(PP16),
              links=m1.links(PP16), tp_overlap="none")
    proj = gemm_times(env, mtp.projection_gemms(m1.spec, m1.shape(PP16)))[:2]  # the 2h -> h projection
    for field, proj_s in zip(("compute_fwd_s", "compute_bwd_s"), proj):
        extra = head1[col[field]] - head0[col[field]] - layer[col[field]] - head0[col[field]]
        assert proj_s > 0 and extra == pytest.approx(proj_s)
    for field in ("ep_fwd_s", "ep_bwd_s", "act_full", "act_none"):
        assert head1[col[field]] >= head0[col[field]] + layer[col[field]]
    assert head0[col["full_recompute_s"]] == 0.0 and head1[col["full_recompute_s"]] == pytest.approx(layer[col["full_recompute_s"]])


def test_mtp_makes_the_step_slower_and_the_last_stage_heavier():
    e0, e1 = _model(DSV3).evaluate(PP16), _model(DSV3_MTP).evaluate(PP16)
    assert e1.step_time_s > e0.step_time_s
    assert e1.stage_layers == (3,) + (4,) * 14 + (2,)  # the default split counts the MTP layer on the last stage
    assert e0.stage_layers == (3,) + (4,) * 13 + (3, 3)


@pytest.mark.parametrize("layers, stages, slots, want", [
    (61, 32, 1, (1,) + (2,) * 30 + (0,)),  # Megatron's DeepSeek-V3 layout "Et|(tt|)*30mL" at pp 16 x vpp 2
    (61, 16, 1, (3,) + (4,) * 14 + (2,)),
    (61, 16, 0, (3,) + (4,) * 13 + (3, 3)),
    (4, 4, 1, (1, 2, 1, 0)),  # the last stage may hold only the MTP layer and the loss ("...|mL")
    (2, 4, 1, (0, 1, 1, 0)),  # no slot left for the MTP layer on the last stage: the plain split
])
def test_balanced_split_counts_mtp_slots_on_the_last_stage(layers, stages, slots, want):
    assert balanced_split(layers, stages, last_slots=slots) == want and sum(want) == layers


def test_megatron_layout_places_mtp_before_the_loss():
    counts = (1,) + (2,) * 30 + (0,)
    assert megatron_layout(counts, mtp=1) == "Et|" + "|".join(["t*2"] * 30) + "|mL"
    assert megatron_flags(61, 16, 2, counts, mtp=1) == ["--pipeline-model-parallel-layout", megatron_layout(counts, 1)]


def test_megatron_export_of_an_mtp_plan_is_accepted_by_megatron_core():
    pytest.importorskip("megatron.core")
    from planner.export.judges_megatron import megatron_core_verdict
    from planner.schemas.plan import Configuration, Parallelism

    request = api.build_request(model="deepseek-v3", topology="dgx-h100", gpus=2048, global_batch_size=4096,
                                seq_len=4096, framework="megatron-core")
    request = request.model_copy(update={"model": DSV3_MTP})
    for vpp in (1, 2):
        config = Configuration(parallelism=Parallelism(dp=64, tp=2, pp=16, ep=64, vpp=vpp, sp=True), microbatch_size=1,
                               schedule="interleaved" if vpp > 1 else "1f1b", recompute="full")
        plan = api.estimate(request, config)
        args = api.export(plan, "megatron").text
        assert "--mtp-num-layers 1" in args
        stages = [sum(name.startswith("layers.") for name in s.layers) for s in sorted(plan.stages, key=lambda s: s.stage)]
        if vpp == 2:
            assert "mL" in args and stages == [1] + [2] * 30 + [0]
    base = ["--num-layers", "61", "--hidden-size", "256", "--ffn-hidden-size", "512", "--num-attention-heads", "4",
            "--seq-length", "128", "--max-position-embeddings", "128", "--vocab-size", "1000",
            "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "16", "--micro-batch-size", "1",
            "--global-batch-size", "64", "--mtp-num-layers", "1", "--pipeline-model-parallel-layout"]
    counts = [1] + [2] * 30 + [0]
    assert megatron_core_verdict(base + [megatron_layout(counts, mtp=1)], 32, counts).accepted
    refused = megatron_core_verdict(base + [megatron_layout(counts)], 32, counts)  # a layout without "m"
    assert not refused.accepted and "mtp" in refused.reason.lower()


@pytest.mark.parametrize("framework, refused", [("planner", True), ("torchtitan", True), ("megatron-lm", True),
                                                ("pytorch-fsdp", True), ("megatron-core", False), ("hai-llm", False)])
def test_stacks_that_build_no_mtp_refuse_it(framework, refused):
    reason = model_refusal(load_framework(framework), DSV3_MTP)
    assert (reason is not None and "multi-token prediction" in reason) == refused
    assert model_refusal(load_framework(framework), DSV3) is None or framework in ("planner", "megatron-lm", "pytorch-fsdp")


def test_mtp_depth_is_bounded_and_named():
    with pytest.raises(ValueError, match="mtp_num_layers"):
        ModelSpec(**{**DSV3.model_dump(), "mtp_num_layers": 10**6})
    with pytest.raises(ValueError, match="mtp_num_layers"):
        ModelSpec(**{**DSV3.model_dump(), "mtp_num_layers": -1})


def test_the_search_plans_an_mtp_model_on_megatron_core():
    from planner.schemas.plan import SearchLimits

    request = api.build_request(model=DSV3_MTP, topology="dgx-h100", gpus=1024, global_batch_size=1024, seq_len=4096,
                                framework="megatron-core", search=SearchLimits(time_limit_s=20))
    plan = api.plan(request)
    assert plan.request.model.mtp_num_layers == 1 and plan.prediction.step_time_s > 0
    again = api.estimate(request.model_copy(update={"model": DSV3}), configuration_of(plan))
    assert plan.prediction.step_time_s > again.prediction.step_time_s  # the same configuration without MTP is faster


def test_mtp_parameters_equal_megatron_cores_mtp_block():
    """counting.mtp_params against the MultiTokenPredictionBlock megatron-core builds from --mtp-num-layers (meta
    device, one rank), for a dense and an MoE model; module_params' last column adds the same at tp = ep = 1."""
    pytest.importorskip("megatron.core")
    from planner.export.judges_megatron import megatron_core_params
    from planner.schemas.model import MoESpec

    dense = ModelSpec(name="s", num_layers=4, hidden_size=256, ffn_hidden_size=512, num_attention_heads=4,
                      vocab_size=1000, seq_len=128, activation="swiglu", norm="rmsnorm")
    moe = dense.model_copy(update={"moe": MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=128)})
    flags = ["--num-layers", "4", "--hidden-size", "256", "--ffn-hidden-size", "512", "--num-attention-heads", "4",
             "--seq-length", "128", "--max-position-embeddings", "128", "--vocab-size", "1000", "--swiglu",
             "--normalization", "RMSNorm", "--untie-embeddings-and-output-weights", "--disable-bias-linear",
             "--position-embedding-type", "rope", "--micro-batch-size", "1", "--global-batch-size", "8"]
    moe_flags = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "128"]
    for spec, extra in ((dense, []), (moe, moe_flags)):
        for depth in (1, 2):
            with_mtp = spec.model_copy(update={"mtp_num_layers": depth})
            built = megatron_core_params(flags + extra + ["--mtp-num-layers", str(depth)]) - megatron_core_params(flags + extra)
            assert built == counting.mtp_params(with_mtp) > 0
            d0, e0 = module_params(spec, tp=1, ep=1, tied_copy=False)
            d1, e1 = module_params(with_mtp, tp=1, ep=1, tied_copy=False)
            assert (d1 + e1).sum() - (d0 + e0).sum() == pytest.approx(built)
