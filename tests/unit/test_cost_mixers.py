"""Gated DeltaNet and Mamba layers in the cost model (planner.cost.mixers, planner.cost.mixer_layers): the terms
against hand-computed values for Qwen3-Next-80B-A3B and Jamba-v0.1, linear growth with the sequence, the tp split,
what validity refuses, and a plan of each model."""

import dataclasses
from pathlib import Path

import pytest

from planner import api
from planner.cost import mixers
from planner.cost.compute import Shape
from planner.cost.model import Candidate, CostModel
from planner.models import counting, load_model

HF = Path(__file__).resolve().parents[1] / "data" / "hf"
QWEN3_NEXT = load_model(str(HF / "qwen3-next-80b-a3b"))  # h 2048; GDN Hk 16, Hv 32, dk = dv = 128, kernel 4
JAMBA = load_model(str(HF / "jamba-v0.1"))  # h 4096; d_inner 8192, N 16, dt_rank 256, d_conv 4


def test_layer_kinds_follow_the_configs():
    assert QWEN3_NEXT.layer_types[:4] == ("linear", "linear", "linear", "full") and QWEN3_NEXT.layer_types.count("full") == 12
    assert QWEN3_NEXT.attention_output_gate and QWEN3_NEXT.rotary_percent == 0.25
    assert JAMBA.layer_types[:8] == ("mamba",) * 4 + ("full",) + ("mamba",) * 3 and JAMBA.position == "none"
    assert [JAMBA.is_moe_layer(i) for i in range(4)] == [False, True, False, True]


def test_mixer_parameters_by_hand():
    # in_proj_qkvz 2048*(2*2048 + 2*4096), in_proj_ba 2048*64, conv (2*2048 + 4096)*4, dt_bias + A_log 64, norm 128, out 4096*2048
    assert counting.mixer_params(QWEN3_NEXT, "linear") == 25_165_824 + 131_072 + 32_768 + 64 + 128 + 8_388_608
    # in_proj 4096*16384, conv 8192*4 + 8192, x_proj 8192*288, dt_proj 256*8192 + 8192, A_log 8192*16, D 8192,
    # out_proj 8192*4096, dt/B/C norms 256 + 32
    assert counting.mixer_params(JAMBA, "mamba") == (67_108_864 + 40_960 + 2_359_296 + 2_105_344 + 131_072 + 8192
                                                    + 33_554_432 + 288)
    # gated attention: q_proj 2048 -> 16*256*2, k and v 2048 -> 2*256, o 4096 -> 2048, q/k norms 256 each
    assert counting.attention_params(QWEN3_NEXT) == 2048 * 8192 + 2 * 2048 * 512 + 4096 * 2048 + 2 * 256


def test_delta_rule_flops_by_hand():
    # per value head: 6*dk*dv + 2*C*(3*dk + 2*dv) + C^2 = 98,304 + 81,920 + 4,096 = 184,320; 32 heads
    forward, recompute = mixers.delta_rule_flops_per_token(QWEN3_NEXT)
    assert forward == 32 * 184_320
    assert recompute == 32 * (2 * 64 * 256 + 4 * 128 * 128)


def test_gemms_and_non_gemm_flops_by_hand():
    shape = Shape(microbatch_size=1, seq_len=4096)
    gdn = {g.name: g for g in mixers.mixer_gemms(QWEN3_NEXT, shape, "linear")}
    assert gdn["in_proj"].flops == 2 * 4096 * 2048 * (2 * 2048 + 2 * 4096 + 64)
    assert gdn["out_proj"].flops == 2 * 4096 * 4096 * 2048
    assert gdn["delta_rule"].flops == 4096 * 32 * 184_320
    assert gdn["delta_rule"].backward_factor == pytest.approx(2 + (2 * 64 * 256 + 4 * 128 * 128) / 184_320)
    mamba = {g.name: g.flops for g in mixers.mixer_gemms(JAMBA, shape, "mamba")}
    assert mamba == {"in_proj": 2 * 4096 * 4096 * 16384, "x_proj": 2 * 4096 * 8192 * 288,
                     "dt_proj": 2 * 4096 * 256 * 8192, "out_proj": 2 * 4096 * 8192 * 4096}
    assert mixers.non_gemm_flops(JAMBA, 4096, "mamba") == 4096 * 8192 * (2 * 4 + 9 * 16)  # conv1d + selective scan
    assert mixers.non_gemm_flops(QWEN3_NEXT, 4096, "linear") == 4096 * 2 * 4 * 8192  # conv1d over q, k, v
    halved = {g.name: g.flops for g in mixers.mixer_gemms(JAMBA, dataclasses.replace(shape, tp=2), "mamba")}
    assert all(halved[name] == flops / 2 for name, flops in mamba.items())  # d_inner split by tp


def test_saved_activations_are_linear_in_the_sequence_and_split_by_tp():
    for spec, mixer in ((QWEN3_NEXT, "linear"), (JAMBA, "mamba")):
        one = mixers.mixer_activation_bytes(spec, Shape(microbatch_size=1, seq_len=4096), mixer)
        assert mixers.mixer_activation_bytes(spec, Shape(microbatch_size=1, seq_len=32768), mixer) == pytest.approx(8 * one)
        assert mixers.mixer_bytes(spec, Shape(microbatch_size=1, seq_len=32768), mixer) == pytest.approx(
            8 * mixers.mixer_bytes(spec, Shape(microbatch_size=1, seq_len=4096), mixer))
    # GDN per token: conv in/out 4*(2*2048 + 4096), z 2*4096, a/b 4*32, g/beta fp32 8*32, A 2*32*64, o 2*4096, out_proj input 2*4096
    per_token = 4 * 8192 + 2 * 4096 + 128 + 256 + 4096 + 2 * 4096 + 2 * 4096
    assert mixers.mixer_activation_bytes(QWEN3_NEXT, Shape(microbatch_size=2, seq_len=1024), "linear") == 2048 * per_token
    assert mixers.mixer_activation_bytes(QWEN3_NEXT, Shape(microbatch_size=2, seq_len=1024, tp=4), "linear") == 2048 * per_token / 4


def _cost(spec, *, seq_len, tp=1, framework="pytorch-fsdp"):
    request = api.build_request(model=spec, topology="dgx-h100", gpus=8, global_batch_size=8, seq_len=seq_len,
                                framework=framework)
    cand = Candidate(dp=8 // tp, tp=tp, pp=1, cp=1, ep=1, sp=tp > 1, microbatch_size=1, num_microbatches=1,
                     recompute="none", schedule="1f1b")
    return CostModel(request), cand


def test_a_hybrid_layer_keeps_no_quadratic_term():
    """Saved bytes of a Gated DeltaNet layer double with the sequence; an attention layer without a fused kernel
    (its s x s scores) grows by more: the two kinds are costed apart (planner.cost.arrays.layer_kinds)."""
    small = QWEN3_NEXT.model_copy(update={"moe": None, "ffn_hidden_size": 5120})
    acts = {}
    for seq_len in (4096, 8192):
        cost, cand = _cost(small, seq_len=seq_len, framework="deepspeed")
        lc = cost.layer_costs(cand)
        acts[seq_len] = (lc.activation_bytes[1], lc.activation_bytes[4])  # layers.0 linear, layers.3 full attention
    assert acts[8192][0] == pytest.approx(2 * acts[4096][0])
    assert acts[4096][0] != acts[4096][1]


def test_validity_names_the_mixer_splits():
    request = api.build_request(model=QWEN3_NEXT, topology="dgx-h100", gpus=64, global_batch_size=64, seq_len=4096,
                                framework="deepspeed")
    cand = Candidate(dp=2, tp=32, pp=1, cp=1, ep=1, microbatch_size=1, num_microbatches=32, recompute="none", schedule="1f1b")
    assert any("linear_attention.num_key_heads=16" in r for r in CostModel(request).validity_reasons(cand))
    cand = Candidate(dp=32, tp=1, pp=1, cp=2, ep=1, microbatch_size=1, num_microbatches=2, recompute="none", schedule="1f1b")
    assert any("cp=2 with linear layers" in r for r in CostModel(request).validity_reasons(cand))


@pytest.mark.parametrize("folder", ["qwen3-next-80b-a3b", "jamba-v0.1"])
def test_each_hybrid_model_is_planned(folder):
    spec = load_model(str(HF / folder))
    plan = api.plan(api.build_request(model=spec, topology="dgx-h100", gpus=64, global_batch_size=128, seq_len=4096,
                                      framework="pytorch-fsdp"))
    assert plan.feasible and plan.parallelism.cp == 1
    assert any("layers priced from their FLOPs" in note and "not measured" in note for note in plan.notes)
    if "linear" in spec.layer_types:
        assert spec.linear_attention.num_key_heads % plan.parallelism.tp == 0


@pytest.mark.parametrize("folder", ["qwen3-next-80b-a3b", "jamba-v0.1"])
def test_hybrid_moe_layers_are_priced_with_expert_parallelism(folder):
    """The MoE layers of a hybrid stack are module types of their own (linear_moe_decoder, mamba_moe_decoder): the
    MoE FFN is priced as an attention layer's (moe_comm.choose), and the dispatcher the plan carries is read from
    whichever MoE type the model has."""
    spec = load_model(str(HF / folder))
    request = api.build_request(model=spec, topology="dgx-h100", gpus=64, global_batch_size=64, seq_len=4096,
                                framework="deepspeed")
    cand = Candidate(dp=64, tp=1, pp=1, cp=1, ep=4, microbatch_size=1, num_microbatches=1, recompute="full",
                     schedule="1f1b", zero_stage=2)
    model = CostModel(request)
    assert not model.validity_reasons(cand)
    assert model.evaluate(cand).step_time_s > 0
    plan = api.plan(request)
    assert plan.feasible and plan.parallelism.ep > 1 and plan.parallelism.moe_dispatcher == "alltoall"


def test_linear_attention_is_cheaper_than_full_attention_at_long_sequences():
    """Ablation: Qwen3-Next with every layer full (gated) attention against its 3:1 Gated DeltaNet stack at 64k tokens."""
    dense = QWEN3_NEXT.model_copy(update={"moe": None, "ffn_hidden_size": 5120})
    full = dense.model_copy(update={"layer_types": None, "linear_attention": None})
    times = {}
    for name, spec in (("hybrid", dense), ("full", full)):
        cost, cand = _cost(spec, seq_len=65536, tp=8)
        lc = cost.layer_costs(cand)
        times[name] = float((lc.forward_s + lc.backward_s).sum())
    assert times["hybrid"] < 0.7 * times["full"]


@pytest.mark.parametrize(("framework", "folder", "piece"), [
    ("megatron-core", "qwen3-next-80b-a3b", "Gated DeltaNet linear-attention layers .* the export writes none of its flags yet"),
    ("megatron-core", "jamba-v0.1", "Mamba-1 selective-scan layers .* builds Mamba-2 mixers"),
    ("megatron-lm", "jamba-v0.1", "Mamba-1 selective-scan layers"),
    ("torchtitan", "qwen3-next-80b-a3b", "Gated DeltaNet .* qwen3_5 model only"),
    ("torchtitan", "jamba-v0.1", "torchtitan 0.3 has no Mamba layers"),
    ("planner", "jamba-v0.1", "Mamba-1 selective-scan layers .* reference decoder"),
])
def test_stacks_that_cannot_build_the_mixers_refuse_in_one_line(framework, folder, piece):
    from planner.errors import BadInputError

    with pytest.raises(BadInputError, match=piece) as caught:
        api.build_request(model=load_model(str(HF / folder)), gpus=8, framework=framework)
    assert "\n" not in str(caught.value)


def test_the_executor_check_names_the_mixers():
    from planner.models.support import reference_refusal

    assert "Gated DeltaNet ('linear') layers" in reference_refusal(QWEN3_NEXT.model_copy(update={"moe": None}))
    assert "Mamba layers" in reference_refusal(JAMBA)


@pytest.mark.parametrize(("folder", "patch", "message"), [
    ("qwen3-next-80b-a3b", {"linear_num_value_heads": 24}, "num_value_heads=24 must be a multiple of num_key_heads=16"),
    ("qwen3-next-80b-a3b", {"layer_types": ["sliding_attention"] * 48}, "layer kinds \\['sliding_attention'\\] are not modelled"),
    ("jamba-v0.1", {"mamba_expand": 0}, "d_inner: Input should be greater than 0"),
    ("jamba-v0.1", {"attn_layer_offset": 9}, "attn_layer_offset=9 .* smaller than attn_layer_period=8"),
])
def test_hybrid_configs_the_schema_cannot_express_are_one_line(folder, patch, message):
    import json

    from planner.errors import BadInputError
    from planner.models.hf import spec_from_hf_config

    config = {**json.loads((HF / folder / "config.json").read_text()), **patch}
    with pytest.raises(BadInputError, match=message) as caught:
        spec_from_hf_config(config)
    assert "\n" not in str(caught.value)
