"""Under fp8 the matmuls every stack keeps in 16 bits run at the bf16 rate (compute.Gemm.fp8): the LM head and the
MoE router (Megatron-Core's output_layer and router_gating_linear are not Transformer Engine modules, core_v0.16.1
gpt_model.py / moe/router.py; torchtitan's configs filter "output"/"lm_head" and "router.gate" from float8;
DeepSeek-V3 Sec. 3.3.1 keeps "the output head, MoE gating modules" in BF16/FP32; planner/executor/fp8.py skips the
head) and the chunked delta rule, a 16-bit kernel; everything else at the measured fp8 rate."""

import dataclasses

import pytest

from planner import api
from planner.cost import compute, layer_terms
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import options_for
from planner.models import counting
from planner.schemas.model import ModelSpec, MoESpec

SPEC = ModelSpec(name="l", num_layers=2, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32, num_kv_heads=8,
                 vocab_size=128256, seq_len=4096, activation="swiglu", moe=MoESpec(num_experts=8, top_k=2,
                                                                                expert_ffn_hidden_size=14336))


def _env(precision: str, **kw) -> layer_terms.Env:
    request = api.build_request(model=SPEC, gpus=8, precision=precision, framework="megatron-core", seq_len=4096,
                                global_batch_size=8)
    model = CostModel(request)
    cand = Candidate(dp=8, tp=1, pp=1, microbatch_size=1, num_microbatches=1, zero_stage=1)
    return layer_terms.Env(spec=SPEC, device=model.device, cal=model.cal, precision=precision, shape=model.shape(cand),
                           links=model.links(cand), tp_overlap="none", **kw)


def test_head_and_router_at_the_bf16_rate_under_fp8():
    fp8, bf16 = _env("fp8"), _env("bf16")
    head = compute.head_gemms(SPEC, fp8.shape)
    router = [g for g in compute.mlp_gemms(SPEC, fp8.shape, moe=counting.moe_params(SPEC)) if g.name == "router"]
    assert head[0].fp8 is False and router and router[0].fp8 is False
    for gemms in (head, router):
        assert layer_terms.gemm_times(fp8, gemms) == pytest.approx(layer_terms.gemm_times(bf16, gemms))
    fc1 = [compute.Gemm("fc1", 2 * 4096 * 4096 * 14336)]
    assert layer_terms.gemm_times(fp8, fc1)[0] < 0.7 * layer_terms.gemm_times(bf16, fc1)[0]  # fp8's rate elsewhere
    off = _env("fp8", fp8_16bit_gemms=False)  # the ablation: the head at the fp8 rate
    assert layer_terms.gemm_times(off, head)[0] < 0.7 * layer_terms.gemm_times(fp8, head)[0]


def test_an_fp8_step_carries_its_16_bit_head():
    request = api.build_request(model="llama3-8b", gpus=8, precision="fp8", framework="megatron-core", seq_len=8192,
                                global_batch_size=64)
    cand = Candidate(dp=8, tp=1, pp=1, microbatch_size=1, num_microbatches=8, zero_stage=1)
    step = CostModel(request).evaluate(cand).step_time_s
    fast = CostModel(request, options=dataclasses.replace(options_for("megatron-core", "fp8"),
                                                          fp8_16bit_gemms=False)).evaluate(cand).step_time_s
    assert 1.01 < step / fast < 1.06  # the head is ~6% of Llama-3 8B's FLOPs, at half the fp8 rate
