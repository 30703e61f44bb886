"""Every cost formula against a hand-computed case or a published number."""

import math

import pytest

from planner.cost import comm, compute, fp8_recipe, kernel_bytes, memory
from planner.schedules import schedule
from planner.cost.calibration import DeviceCalibration
from planner.cost.evaluate import balanced_split
from planner.schemas.model import ModelSpec
from planner.topology.groups import GroupLink

GPT3 = ModelSpec(name="gpt3-175b", num_layers=96, hidden_size=12288, ffn_hidden_size=4 * 12288, num_attention_heads=96,
                 vocab_size=51200, seq_len=2048, activation="gelu", position="learned", tied_embeddings=True, linear_bias=True)


def _shape(**kw):
    base = dict(microbatch_size=1, seq_len=2048, flash_attention=False, dropout=True)
    base.update(kw)
    return compute.Shape(**base)


# --- FLOPs: Narayanan et al. 2021 eq. 3 -------------------------------------------------------------------


def test_gpt_forward_flops_match_narayanan_eq3():
    """3 x forward matmul FLOPs of the whole model = 72*b*s*l*h^2*(1 + s/(6h) + V/(12*l*h)) (eq. 3, no recompute)."""
    b, s, l, h, v = 1, GPT3.seq_len, GPT3.num_layers, GPT3.hidden_size, GPT3.vocab_size
    shape = _shape()
    layer = compute.gemms_flops(compute.attention_gemms(GPT3, shape, full=True) + compute.mlp_gemms(GPT3, shape, moe=None, full=True))
    head = compute.gemms_flops(compute.head_gemms(GPT3, shape, full=True))
    ours = 3 * (l * layer + head)
    eq3 = 72 * b * s * l * h**2 * (1 + s / (6 * h) + v / (12 * l * h))
    assert ours == pytest.approx(eq3, rel=1e-12)
    assert ours == pytest.approx(6 * 174.6e9 * s, rel=0.05)  # ~6 N FLOPs per token (Kaplan et al. 2020)


def test_tp_and_cp_divide_per_gpu_flops():
    full = compute.gemms_flops(compute.attention_gemms(GPT3, _shape()) + compute.mlp_gemms(GPT3, _shape(), moe=None))
    split = compute.gemms_flops(compute.attention_gemms(GPT3, _shape(tp=8, cp=2)) + compute.mlp_gemms(GPT3, _shape(tp=8, cp=2), moe=None))
    assert split == pytest.approx(full / 16)


def test_gqa_and_gated_flops_per_matmul():
    spec = ModelSpec(name="g", num_layers=1, hidden_size=64, ffn_hidden_size=96, num_attention_heads=8, num_kv_heads=2,
                     vocab_size=100, seq_len=16, activation="swiglu")
    shape = compute.Shape(microbatch_size=2, seq_len=16)
    gemms = {g.name: g.flops for g in compute.attention_gemms(spec, shape) + compute.mlp_gemms(spec, shape, moe=None)}
    tokens, d = 32, 8
    assert gemms["qkv"] == 2 * tokens * 64 * (8 + 2 * 2) * d
    assert gemms["attn_scores"] == 2 * 2 * 16 * 16 * 8 * d
    assert gemms["mlp"] == 2 * tokens * 64 * 96 * 3


def test_moe_flops_count_top_k_and_capacity():
    spec = ModelSpec(name="m", num_layers=1, hidden_size=64, ffn_hidden_size=96, num_attention_heads=8, vocab_size=100, seq_len=16,
                     activation="swiglu", moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 32, "capacity_factor": 1.25})
    from planner.models.counting import moe_params

    shape = compute.Shape(microbatch_size=1, seq_len=16, ep=4)
    hw = {g.name: g for g in compute.mlp_gemms(spec, shape, moe=moe_params(spec), hardware=True)}
    model = {g.name: g for g in compute.mlp_gemms(spec, shape, moe=moe_params(spec), hardware=False)}
    assert model["experts"].flops == 2 * 16 * 2 * 64 * 32 * 3
    assert hw["experts"].flops == pytest.approx(1.25 * model["experts"].flops)
    assert hw["router"].flops == 2 * 16 * 64 * 8
    assert hw["experts"].calls == 2 * 2  # two local experts, two GEMMs each


def test_efficiency_curve_saturates_at_the_ceiling():
    cal = DeviceCalibration(family="t", matmul_ceiling_fraction=0.8, gemm_fixed_s=5e-6, hbm_efficiency=0.9, attention_fraction=0.4, source="")
    knee = 0.8 * 1000e12 * 5e-6
    assert compute.gemm_efficiency(knee, peak_tflops=1000, cal=cal) == pytest.approx(0.4)
    assert compute.gemm_efficiency(1e15, peak_tflops=1000, cal=cal) == pytest.approx(0.8, rel=1e-3)
    small, large = (compute.gemm_efficiency(g, peak_tflops=1000, cal=cal) for g in (1e9, 1e11))
    assert small < large
    gemm = compute.Gemm("x", 1e12, calls=2)
    assert compute.gemm_time_s(gemm, peak_tflops=1000, cal=cal, flash=False) == pytest.approx(1e12 / 0.8e15 + 2 * 5e-6)


def test_flash_attention_runs_the_causal_half_at_its_rate():
    cal = DeviceCalibration(family="t", matmul_ceiling_fraction=0.8, gemm_fixed_s=0.0, hbm_efficiency=0.9, attention_fraction=0.4, source="")
    core = compute.Gemm("attn_scores", 1e12, attention_core=True)
    assert compute.gemm_time_s(core, peak_tflops=1000, cal=cal, flash=True) == pytest.approx(0.5e12 / 0.4e15)
    assert compute.gemm_time_s(core, peak_tflops=1000, cal=cal, flash=False) == pytest.approx(1e12 / 0.8e15)


# --- Activations: Korthikanti et al. 2022 Table 2 -----------------------------------------------------------


@pytest.mark.parametrize("tp, sp", [(1, False), (8, False), (8, True)])
def test_activation_bytes_match_korthikanti_table_2(tp, sp):
    s, b, h, a = 2048, 1, GPT3.hidden_size, GPT3.num_attention_heads
    acts = memory.decoder_activation_bytes(GPT3, _shape(tp=tp, sp=sp), moe_layer=False)
    sbh, core = s * b * h, 5 * a * s / h
    if tp == 1:
        expected = sbh * (34 + core)
    elif not sp:
        expected = sbh * (10 + 24 / tp + core / tp)
    else:
        expected = sbh * (34 / tp + core / tp)
    assert acts.none == pytest.approx(expected)
    assert acts.selective == pytest.approx(expected - sbh * core / tp)  # selective drops 5as/h
    assert acts.full == pytest.approx(2 * sbh / (tp if sp else 1))  # full keeps the layer input


def test_flash_attention_keeps_no_scores():
    acts = memory.decoder_activation_bytes(GPT3, _shape(flash_attention=True, dropout=False), moe_layer=False)
    sbh = 2048 * GPT3.hidden_size
    assert acts.none == pytest.approx(sbh * (34 - 2) + 4 * GPT3.num_attention_heads * 2048)  # no masks, fp32 LSE only


# --- Bytes per parameter per recipe, ZeRO ---------------------------------------------------------------------


@pytest.mark.parametrize("recipe, total", [("bf16", 18), ("amp-bf16", 18), ("fp32", 16), ("fp8", 19)])
def test_bytes_per_parameter(recipe, total):
    assert memory.RECIPES[recipe].total == total


def test_amp_bf16_is_16_plus_autocast_copies():
    r = memory.RECIPES["amp-bf16"]
    assert (r.weight_bytes - 2) + r.grad_bytes + r.optimizer_bytes == 16


@pytest.mark.parametrize("zero, expected", [(0, (2, 4, 12)), (1, (2, 4, 1.5)), (2, (2, 0.5, 1.5)), (3, (0.25, 0.5, 1.5))])
def test_zero_stages_divide_by_dp(zero, expected):
    assert memory.static_split(1.0, memory.RECIPES["bf16"], zero_stage=zero, dp=8) == pytest.approx(expected)


# --- Collectives -----------------------------------------------------------------------------------------------


def _link(size, rpn, nodes, intra=100.0, inter=10.0, lat=1e-6):
    return GroupLink(size=size, ranks_per_node=rpn, num_nodes=nodes, intra_bandwidth_GBps=intra, intra_latency_s=lat,
                     inter_bandwidth_GBps=inter, inter_latency_s=lat)


def test_ring_all_reduce_alpha_beta():
    assert comm.ring_all_reduce_s(1e9, group=_link(8, 8, 1)) == pytest.approx(2 * 7 / 8 * 1e9 / 100e9 + 14e-6)
    assert comm.ring_all_reduce_s(1e9, group=_link(1, 1, 1)) == 0.0


def test_hierarchical_all_reduce_across_nodes():
    t = comm.ring_all_reduce_s(1e9, group=_link(16, 8, 2))
    intra = 2 * 7 / 8 * 1e9 / 100e9 + 14e-6
    inter = 2 * 1 / 2 * (1e9 / 8) / 10e9 + 2e-6
    assert t == pytest.approx(intra + inter)


def test_all_gather_reduce_scatter_half_of_all_reduce():
    link = _link(4, 4, 1, lat=0.0)
    assert comm.all_gather_s(1e9, group=link) == pytest.approx(3 / 4 * 1e9 / 100e9)
    assert comm.reduce_scatter_s(1e9, group=link) + comm.all_gather_s(1e9, group=link) == pytest.approx(comm.ring_all_reduce_s(1e9, group=link))


def test_all_gather_across_nodes_pays_one_step_per_rank():
    """NCCL runs all-gather and reduce-scatter as one ring over every rank (src/graph/tuning.cc: nsteps = nRanks-1,
    nInterSteps = nNodes-1): the fixed part grows with the ranks, not with the ranks of one node plus the nodes."""
    link = GroupLink(size=2240, num_nodes=280, ranks_per_node=8, inter_bandwidth_GBps=25.0, inter_latency_s=5e-6,
                     intra_bandwidth_GBps=230.0, intra_latency_s=3e-6)
    latency = (2240 - 280) * 3e-6 + 279 * 5e-6
    assert comm.half_ring_latency_s(link) == pytest.approx(latency)
    bandwidth = 7 / 8 * 1e9 / 230e9 + 279 / 280 * (1e9 / 8) / 25e9  # the hierarchical bus bandwidth, unchanged
    assert comm.all_gather_s(1e9, group=link) == pytest.approx(bandwidth + latency)
    assert comm.reduce_scatter_s(0.0, group=link) == 0.0
    one_node = _link(8, 8, 1)
    assert comm.half_ring_latency_s(one_node) == pytest.approx(7 * 1e-6)
    # a network step costs at least an NVLink step, so at a fixed size more nodes never cost less (search floors)
    slow_intra = GroupLink(size=16, num_nodes=2, ranks_per_node=8, inter_bandwidth_GBps=10.0, inter_latency_s=0.0,
                           intra_bandwidth_GBps=100.0, intra_latency_s=3e-4)
    spread = GroupLink(size=16, num_nodes=4, ranks_per_node=4, inter_bandwidth_GBps=10.0, inter_latency_s=0.0,
                       intra_bandwidth_GBps=100.0, intra_latency_s=3e-4)
    assert comm.half_ring_latency_s(spread) >= comm.half_ring_latency_s(slow_intra) == pytest.approx(15 * 3e-4)


def test_fp8_casts_every_linear_input_forward_and_output_gradient_backward():
    """Transformer Engine's Linear casts its input (forward) and grad_output (backward) to fp8 with a fused
    cast-transpose: 2 bytes read, 1 + 1 written per element (fp8_recipe.FP8_CAST_BYTES_PER_ELEMENT)."""
    spec = ModelSpec(name="l", num_layers=2, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
                     num_kv_heads=8, vocab_size=128256, seq_len=4096, activation="swiglu")
    shape = compute.Shape(microbatch_size=1, seq_len=4096, tp=2, flash_attention=True)
    gemms = compute.attention_gemms(spec, shape) + compute.mlp_gemms(spec, shape, moe=None)
    t, h, f, d = 4096, 4096, 14336, 128
    inputs = t * (h + 32 * d / 2) + t * (h + f / 2)  # qkv, attn_out; fc1, fc2
    outputs = t * (32 + 2 * 8) * d / 2 + t * h + t * (2 * f / 2 + h)
    assert fp8_recipe.cast_bytes(gemms) == pytest.approx((4 * inputs, 4 * outputs))
    for g in gemms:  # the io elements are the matmul's own shape: 2 * tokens * k * n flops
        if not g.attention_core and g.name != "mlp":
            assert g.flops == pytest.approx(2 * g.io_elements[0] * g.io_elements[1] / t)
    assert fp8_recipe.cast_bytes(compute.head_gemms(spec, shape)) == (0.0, 0.0)  # the LM head stays in 16 bits


def test_all_to_all_bounded_by_the_slower_link():
    link = _link(16, 8, 2, lat=0.0)
    assert comm.all_to_all_s(1.6e9, group=link) == pytest.approx(max(7 / 16 * 1.6e9 / 100e9, 8 / 16 * 1.6e9 / 10e9))


def test_domino_hides_at_most_half():
    assert comm.domino_exposed_s(1.0, 10.0) == pytest.approx(0.5)
    assert comm.domino_exposed_s(1.0, 0.4) == pytest.approx(0.8)


# --- Schedules -------------------------------------------------------------------------------------------------


def test_bubble_fractions():
    assert schedule("1f1b").bubble_fraction(pp=8, vpp=1, num_microbatches=64) == pytest.approx(7 / 64)
    assert schedule("gpipe").bubble_fraction(pp=8, vpp=1, num_microbatches=64) == pytest.approx(7 / 64)
    assert schedule("interleaved").bubble_fraction(pp=8, vpp=4, num_microbatches=64) == pytest.approx(7 / 256)
    assert schedule("zero-bubble").bubble_fraction(pp=8, vpp=1, num_microbatches=64) == pytest.approx(7 / 192)
    assert schedule("2bw").bubble_fraction(pp=8, vpp=1, num_microbatches=64) == 0.0
    assert schedule("1f1b").bubble_fraction(pp=1, vpp=1, num_microbatches=64) == 0.0


def test_inflight_microbatches_per_schedule():
    assert schedule("gpipe").inflight_microbatches(pp=4, stage=3, num_microbatches=16) == 16
    assert [schedule("1f1b").inflight_microbatches(pp=4, stage=r, num_microbatches=16) for r in range(4)] == [4, 3, 2, 1]
    assert schedule("1f1b").inflight_microbatches(pp=4, stage=0, num_microbatches=2) == 2
    assert schedule("zero-bubble").inflight_microbatches(pp=4, stage=0, num_microbatches=16) == 4
    # Megatron interleaved warm-up: (p - r - 1) * 2 + (v - 1) * p chunk-micro-batches, plus the one in flight
    assert schedule("interleaved").inflight_microbatches(pp=4, stage=0, num_microbatches=16, vpp=2) == pytest.approx((6 + 4 + 1) / 2)
    assert schedule("interleaved").inflight_microbatches(pp=4, stage=3, num_microbatches=16, vpp=2) == pytest.approx((0 + 4 + 1) / 2)


def test_balanced_split():
    assert balanced_split(32, 4) == (8, 8, 8, 8)
    assert balanced_split(30, 4) == (7, 8, 8, 7)
    assert balanced_split(5, 1) == (5,)
    assert sum(balanced_split(105, 35)) == 105 and math.prod(balanced_split(105, 35)) == 3**35


def test_eager_kernels_move_more_bytes_and_save_more():
    spec = ModelSpec(name="llama", num_layers=1, hidden_size=2048, ffn_hidden_size=5632, num_attention_heads=32, num_kv_heads=4,
                     vocab_size=32000, seq_len=2048, activation="swiglu", norm="rmsnorm")
    fused = compute.Shape(microbatch_size=1, seq_len=2048)
    eager = compute.Shape(microbatch_size=1, seq_len=2048, fused_kernels=False)
    _, rest_fused = compute.layer_elementwise_bytes(spec, fused, moe=None)
    _, rest_eager = compute.layer_elementwise_bytes(spec, eager, moe=None)
    tokens, h, f, qk = 2048, 2048, 5632, (32 + 4) * 64
    assert rest_fused == pytest.approx(tokens * (2 * 4 * h + 2 * 6 * h + 4 * qk + 6 * f))
    assert rest_eager == pytest.approx(tokens * (2 * 36 * h + 2 * 6 * h + 20 * qk + 10 * f))
    saved_fused = memory.decoder_activation_bytes(spec, fused, moe_layer=False).none
    saved_eager = memory.decoder_activation_bytes(spec, eager, moe_layer=False).none
    assert saved_eager - saved_fused == pytest.approx(tokens * (2 * (10 - 2) * h + (8 - 6) * f))


def test_autocast_casts_only_for_amp():
    assert memory.AUTOCAST_CAST_BYTES["amp-bf16"] == (6.0, 10.0)
    assert "bf16" not in memory.AUTOCAST_CAST_BYTES


def test_imported_layout_fields_reach_flops_bytes_and_params():
    """Fields the HF importer sets (Qwen2-MoE shared-expert gate, Gemma/Falcon norms per layer) change the router
    FLOPs, the memory-bound bytes, the saved activations and the per-GPU parameters consistently with counting."""
    from planner.cost.layers import module_params
    from planner.models.counting import moe_params, norm_params

    moe = {"num_experts": 4, "top_k": 2, "expert_ffn_hidden_size": 32, "num_shared_experts": 1, "shared_expert_ffn_hidden_size": 48}
    fields = dict(name="q", num_layers=2, hidden_size=64, ffn_hidden_size=96, num_attention_heads=4, vocab_size=100, seq_len=16,
                  activation="swiglu", norm="rmsnorm")
    plain = ModelSpec(**fields, moe=moe)
    gated = ModelSpec(**fields, moe={**moe, "shared_expert_gate": True})
    shape = compute.Shape(microbatch_size=1, seq_len=16)

    def router_flops(spec):
        return next(g.flops for g in compute.mlp_gemms(spec, shape, moe=moe_params(spec)) if g.name == "router")

    def layer_params(spec, tp):
        return module_params(spec, tp=tp, ep=1, tied_copy=False)[0][1]

    assert router_flops(gated) - router_flops(plain) == 2 * 16 * 64  # tokens * h, forward
    assert layer_params(gated, 2) - layer_params(plain, 2) == 64  # the gate is replicated over tp, like the router

    two, four = ModelSpec(**fields), ModelSpec(**fields, norms_per_layer=4)
    _, rest_two = compute.layer_elementwise_bytes(two, shape, moe=None)
    _, rest_four = compute.layer_elementwise_bytes(four, shape, moe=None)
    assert rest_four - rest_two == pytest.approx(2 * kernel_bytes.norm_bytes(two, shape.kernels) * 16 * 64)
    saved = [memory.decoder_activation_bytes(spec, shape, moe_layer=False).none for spec in (two, four)]
    assert saved[1] > saved[0]
    assert layer_params(four, 1) - layer_params(two, 1) == 2 * norm_params(two)


def test_eager_ops_take_eager_bytes_for_their_components_only():
    """A 16-bit stack whose code runs SwiGLU and RoPE as eager op sequences (torchtitan without compile:
    feed_forward.py F.silu(w1(x)) * w3(x), rope.py view_as_complex(x.float())) pays kernel_bytes.EAGER's bytes for those
    and keeps the fused norm; an fp32/eager recipe keeps EAGER for everything."""
    mixed = _shape(fused_kernels=True, eager_ops=("activation", "rope")).kernels
    assert (mixed.gated_act, mixed.saved_gated, mixed.rope) == (kernel_bytes.EAGER.gated_act, kernel_bytes.EAGER.saved_gated, kernel_bytes.EAGER.rope)
    assert (mixed.rmsnorm, mixed.saved_rmsnorm) == (kernel_bytes.FUSED.rmsnorm, kernel_bytes.FUSED.saved_rmsnorm)
    assert _shape(fused_kernels=True).kernels is kernel_bytes.FUSED
    assert _shape(fused_kernels=False, eager_ops=("rope",)).kernels is kernel_bytes.EAGER
