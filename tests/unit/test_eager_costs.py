"""The eager (amp-bf16) recipe: operator and byte counts per module, the max(device, host) phase rule, and the
derivation of its two calibration constants (planner.cost.eager, calibration.yaml)."""

from __future__ import annotations

import dataclasses

import pytest

from planner import api
from planner.cost import eager
from planner.cost.calibration import device_calibration
from planner.cost.compute import Shape
from planner.cost.derivation import implied_value
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import hf_eager_options  # HuggingFace's recipe: the planner stack without its executor facts
from planner.models import load_model
from planner.schemas.model import ModelSpec

TOKENS, H = 2048, 2048
E = TOKENS * H  # one T x h region of TinyLlama at micro-batch 1, seq 2048


def tinyllama() -> ModelSpec:
    return load_model("tinyllama-1.1b")


def test_tinyllama_layer_counts_match_the_dispatch_trace():
    """48 operators forward, 87 backward (benchmarks/eager_op_count.py on HF LlamaForCausalLM); bytes per T*h:
    106 + 36 * (q + k) / E + 10 * f / E forward, 294 + 58 * (q + k) / E + 18 * f / E backward."""
    layer = eager.decoder_ops(tinyllama(), Shape(microbatch_size=1, seq_len=2048))
    assert (layer.fwd_ops, layer.bwd_ops) == (48, 87)
    assert layer.fwd_bytes == pytest.approx((106 + 36 * 1.125 + 10 * 2.75) * E)  # 174
    assert layer.bwd_bytes == pytest.approx((294 + 58 * 1.125 + 18 * 2.75) * E)  # 408.75


def test_step_counts_outside_the_layers_and_with_recompute():
    spec, shape = tinyllama(), Shape(microbatch_size=1, seq_len=2048)
    head, embedding = eager.head_ops(spec, shape), eager.embedding_ops(spec, shape)
    assert (head.fwd_ops, head.bwd_ops, embedding.fwd_ops, embedding.bwd_ops) == (14, 22, 17, 1)
    assert head.fwd_bytes == pytest.approx(28 * E + 6 * E + 14 * TOKENS * 32000)
    assert eager.step_ops(spec, shape, recompute=False) == (22 * 48 + 31, 22 * 87 + 23)
    assert eager.step_ops(spec, shape, recompute=True) == (22 * 48 + 31, 22 * (87 + 46) + 23)


def test_counts_follow_the_layer_structure():
    base = tinyllama()
    shape = Shape(microbatch_size=1, seq_len=2048)
    ref = eager.decoder_ops(base, shape)
    layernorm = eager.decoder_ops(base.model_copy(update={"norm": "layernorm"}), shape)
    assert ref.fwd_ops - layernorm.fwd_ops == 2 * (6 - 1) and ref.bwd_ops - layernorm.bwd_ops == 2 * (14 - 1)
    biased = eager.decoder_ops(base.model_copy(update={"linear_bias": True}), shape)
    assert biased.fwd_ops - ref.fwd_ops == 7 and biased.bwd_ops - ref.bwd_ops == 2 * 7
    learned = eager.decoder_ops(base.model_copy(update={"position": "learned"}), shape)
    assert ref.fwd_ops - learned.fwd_ops == 2 * 5 + 2  # RoPE on q and k, and SDPA's casts of their fp32 results
    tp2 = eager.decoder_ops(base, Shape(microbatch_size=1, seq_len=2048, tp=2))
    assert tp2.fwd_ops == ref.fwd_ops and tp2.fwd_bytes < ref.fwd_bytes  # same operators on smaller shards


def test_phase_takes_the_slower_of_device_and_host():
    assert eager.phase_s(1e-3, 100, kernel_s=1e-6, host_op_s=2e-5) == pytest.approx(2e-3)  # host-bound
    assert eager.phase_s(5e-3, 100, kernel_s=1e-6, host_op_s=2e-5) == pytest.approx(5.1e-3)  # device-bound


def _model(microbatch_size: int, precision: str = "amp-bf16", **constants) -> tuple[CostModel, Candidate]:
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=microbatch_size,
                                seq_len=2048, precision=precision)
    cal = dataclasses.replace(device_calibration(request.topology.device, "planner", eager=True), **constants)
    return CostModel(request, calibration=cal, options=hf_eager_options(precision)), Candidate(dp=1, tp=1, pp=1, microbatch_size=microbatch_size, num_microbatches=1)


def test_tinyllama_layer_is_host_bound_at_micro_batch_1_and_device_bound_at_8():
    model, cand = _model(1)
    host = model.cal.eager_host_op_s
    costs = model.layer_costs(cand)
    assert costs.forward_s[1] == pytest.approx(48 * host) and costs.backward_s[1] == pytest.approx(87 * host)
    full = model.layer_costs(dataclasses.replace(cand, recompute="full"))
    assert full.recompute_s[1] == pytest.approx(46 * host)  # the recompute's operators, the backward still host-bound
    big, cand8 = _model(8)
    assert big.layer_costs(cand8).forward_s[1] > 2 * 48 * host


def test_eager_constants_do_not_touch_the_megatron_recipe():
    steps = [_model(4, "bf16", eager_kernel_s=k, eager_host_op_s=h) for k, h in ((0.0, 0.0), (1e-4, 1e-3))]
    first, second = (m.evaluate(c).step_time_s for m, c in steps)
    assert first == second


def test_amp_step_grows_with_both_constants():
    low, cand = _model(1, eager_kernel_s=0.0, eager_host_op_s=0.0)
    high, _ = _model(1, eager_kernel_s=1e-5, eager_host_op_s=5e-5)
    assert high.evaluate(cand).step_time_s > low.evaluate(cand).step_time_s


def test_implied_value_inverts_a_non_decreasing_step():
    assert implied_value(lambda x: 0.1 + 3000 * x, 0.13) == pytest.approx(1e-5, rel=1e-6)
    assert implied_value(lambda x: max(0.2, 4000 * x), 0.3) == pytest.approx(7.5e-5, rel=1e-6)
    assert implied_value(lambda x: 0.5 + x, 0.3) == 0.0  # slower than the target already


def test_every_family_has_eager_constants():
    for name in ("H100 SXM5", "A100 80GB", "B200", "MI300X", "cpu", "unknown accelerator"):
        cal = device_calibration(api.load_topology("dgx-h100").device.model_copy(update={"name": name}))
        assert cal.eager_kernel_s >= 0 and cal.eager_host_op_s >= 0
    hopper = device_calibration(api.load_topology("dgx-h100").device)
    assert hopper.eager_host_op_s > hopper.eager_kernel_s > 0


def test_a_profile_replaces_the_eager_recompute_with_its_measured_forward(tmp_path):
    from planner.io import atomic_write_text, canonical_json
    from planner.schemas.profile import LayerProfile, Profile

    entry = LayerProfile(layer_type="decoder", tp=1, microbatch_size=1, seq_len=2048, forward_s=0.01, backward_s=0.02,
                         saved_bytes=123_000_000, saved_bytes_selective=100_000_000, saved_bytes_full=8_000_000)
    path = tmp_path / "profile.json"
    atomic_write_text(path, canonical_json(Profile(kind="measured", model_name="tinyllama-1.1b", device="test", dtype="amp-bf16",
                                                   entries=(entry,))))
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=1, seq_len=2048,
                                precision="amp-bf16", profile=str(path))
    costs = CostModel(request, options=hf_eager_options("amp-bf16")).layer_costs(
        Candidate(dp=1, tp=1, pp=1, microbatch_size=1, num_microbatches=1, recompute="full"))
    assert costs.recompute_s[1] == pytest.approx(0.01)


def test_moe_mla_and_unfused_attention_keep_the_generic_model():
    spec, shape = tinyllama(), Shape(microbatch_size=1, seq_len=2048)
    assert eager.supported(spec, shape, moe_layer=False)
    assert not eager.supported(spec, shape, moe_layer=True)
    assert not eager.supported(spec, Shape(microbatch_size=1, seq_len=2048, flash_attention=False), moe_layer=False)
