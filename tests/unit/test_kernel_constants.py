"""Kernel constants measured on a GPU (profiles/kernels-h100.json, benchmarks/gpu_kernels.py): calibration.yaml holds
what the derivation prints for the committed file; the cost model prices each stack's attention kernel at its
measured rate for the model's head dim, and fp8 GEMMs at the measured fp8/bf16 ratio."""

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from planner import api
from planner.cost.calibration import DeviceCalibration, attention_rate_for, device_calibration
from planner.cost.compute import Gemm, attention_seq_factor, gemm_peak_tflops, gemm_time_s
from planner.cost.model import CostModel

ROOT = Path(__file__).resolve().parents[2]
KERNELS = ROOT / "profiles" / "kernels-h100.json"
KERNELS_H200 = ROOT / "profiles" / "kernels-h200.json"


def _bench(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def derived():
    return _bench("kernel_constants").derive(json.loads(KERNELS.read_text()), 989.0)


def _hopper(framework: str | None = None) -> DeviceCalibration:
    return device_calibration(api.load_topology("dgx-h100").device, framework)


def test_calibration_holds_the_derived_hopper_constants(derived):
    cal = _hopper()
    table = {kernel: {dim: (fraction, half) for dim, fraction, half in rates} for kernel, rates in cal.attention_kernels}
    assert cal.gemm_fixed_s == pytest.approx(derived["gemm"]["gemm_fixed_s"], abs=0.01e-6)
    assert cal.fp8_matmul_relative == pytest.approx(derived["fp8_matmul_relative"], abs=0.001)
    for kernel, backend in (("flash-attention-2", "flash"), ("cudnn", "cudnn")):
        for dim, fit in derived["attention"][backend].items():
            assert table[kernel][dim] == pytest.approx((fit["fraction"], fit["seq_half"]), abs=0.001, rel=0.002)
    fa2 = derived["attention"]["flash"][128]
    assert (cal.attention_fraction, cal.attention_seq_half) == pytest.approx((fa2["fraction"], fa2["seq_half"]), rel=0.002)
    # the measurements themselves: cuDNN's fused attention well ahead of FlashAttention-2 on Hopper, the rate
    # following s / (s + s_half) within a few percent, fp8 GEMMs short of twice the bf16 rate, and the GEMM fit
    # within a few percent (median)
    assert derived["attention"]["cudnn"][128]["fraction"] > 1.5 * fa2["fraction"]
    assert max(fit["max_rel_error"] for backend in ("flash", "cudnn") for fit in derived["attention"][backend].values()) < 0.06
    assert 0.8 < derived["fp8_matmul_relative"] < 1.0
    assert derived["gemm"]["median_rel_error"] < 0.06


def test_attention_rate_interpolates_in_head_dim_and_falls_back_by_rule():
    cal = _hopper()
    table = {kernel: {dim: (fraction, half) for dim, fraction, half in rates} for kernel, rates in cal.attention_kernels}
    fa2, cudnn = table["flash-attention-2"], table["cudnn"]
    mid = attention_rate_for(cal, "cudnn", 96)
    assert mid == pytest.approx(((cudnn[64][0] + cudnn[128][0]) / 2, (cudnn[64][1] + cudnn[128][1]) / 2))
    assert attention_rate_for(cal, "cudnn", 256) == pytest.approx(cudnn[128])
    assert attention_rate_for(cal, "flash-attention-2", 32) == pytest.approx(fa2[64])
    assert attention_rate_for(cal, "flash-attention-1", 128) == pytest.approx((fa2[128][0] / 2, fa2[128][1]))
    bare = dataclasses.replace(cal, attention_kernels=(("flash-attention-2", ((128, 0.3, 100.0),)),))
    assert attention_rate_for(bare, "cudnn", 128) == (0.3, 100.0)  # a kernel without a rate runs at FlashAttention-2's
    ampere = device_calibration(api.load_topology("dgx-a100-80g").device)
    assert {attention_rate_for(ampere, k, d) for k in ("cudnn", "flash-attention-2") for d in (64, 128)} == {(0.72, 0.0)}


def test_attention_rate_falls_with_the_block_length_as_measured(derived):
    """rate(s) = fraction * s / (s + s_half): half the long-sequence rate at s_half, and each measured point of the
    committed file within 6% of the fit (FlashAttention-2 and cuDNN, head dims 64 and 128)."""
    assert attention_seq_factor(500.0, 500.0) == 0.5 and attention_seq_factor(0.0, 500.0) == 1.0
    data = json.loads(KERNELS.read_text())
    bench = _bench("kernel_constants")
    for row in data["attention"]:
        if row["backend"] in ("flash", "cudnn"):
            fit = derived["attention"][row["backend"]][row["head_dim"]]
            predicted = fit["fraction"] * attention_seq_factor(row["seq_len"], fit["seq_half"])
            assert predicted == pytest.approx(bench.attention_fraction(row, 989.0), rel=0.06)


def test_h100_and_h200_measure_one_family(derived):
    """Hopper's constants come from the H100 file; the H200 (same compute die and clocks, more HBM bandwidth) gives
    the same GEMM ceiling and, at the sequence lengths of training (2k-32k), attention rates within 6%."""
    h200 = _bench("kernel_constants").derive(json.loads(KERNELS_H200.read_text()), 989.0)
    assert h200["gemm"]["ceiling_fit"] == pytest.approx(derived["gemm"]["ceiling_fit"], rel=0.02)
    assert h200["fp8_matmul_relative"] == pytest.approx(derived["fp8_matmul_relative"], rel=0.03)
    for backend in ("flash", "cudnn"):
        for dim, fit in derived["attention"][backend].items():
            other = h200["attention"][backend][dim]
            for s in (2048, 8192, 32768):
                ours = fit["fraction"] * attention_seq_factor(s, fit["seq_half"])
                theirs = other["fraction"] * attention_seq_factor(s, other["seq_half"])
                assert theirs == pytest.approx(ours, rel=0.06)


def _model(framework: str, topology: str = "dgx-h100", **extra) -> CostModel:
    request = api.build_request(model="llama3-8b", topology=topology, gpus=8, global_batch_size=8, seq_len=8192, **extra)
    return CostModel(request.model_copy(update={"framework": framework}))


def test_megatron_core_on_hopper_runs_cudnn_attention_torchtitan_flash_attention_2():
    """Transformer Engine prefers cuDNN fused attention on sm90 (planner/data/frameworks/megatron-core.yaml); torchtitan's SDPA
    takes the flash backend: the attention core of the same layer is priced at the two measured rates."""
    core, titan = _model("megatron-core"), _model("torchtitan")
    rates = {kernel: {dim: fraction for dim, fraction, _ in r} for kernel, r in core.cal.attention_kernels}
    assert core.cal.attention_fraction == pytest.approx(rates["cudnn"][128])
    assert titan.cal.attention_fraction == pytest.approx(rates["flash-attention-2"][128])
    assert core.cal.attention_fraction > 1.5 * titan.cal.attention_fraction
    core_a100, titan_a100 = _model("megatron-core", "dgx-a100-80g"), _model("torchtitan", "dgx-a100-80g")
    assert core_a100.cal.attention_fraction == titan_a100.cal.attention_fraction == 0.72


def test_fp8_gemms_run_at_the_measured_fraction_of_the_doubled_peak():
    device = api.load_topology("dgx-h100").device
    cal = dataclasses.replace(_hopper(), gemm_fixed_s=0.0)
    big = Gemm("mlp", 2 * 8192**3)
    bf16 = gemm_time_s(big, peak_tflops=gemm_peak_tflops(device, "bf16", cal), cal=cal, flash=False)
    fp8 = gemm_time_s(big, peak_tflops=gemm_peak_tflops(device, "fp8", cal), cal=cal, flash=False)
    assert fp8 == pytest.approx(bf16 * device.peak_bf16_tflops / (device.peak_fp8_tflops * cal.fp8_matmul_relative))
    a100 = api.load_topology("dgx-a100-80g").device  # no fp8 tensor cores: the bf16 peak, no fp8 ratio
    assert gemm_peak_tflops(a100, "fp8", cal) == a100.peak_bf16_tflops


def test_kernel_benchmark_runs_its_code_path_on_cpu(tmp_path):
    """The script the committed file came from, on tiny sizes: every section written, and --derive reads it."""
    pytest.importorskip("torch")
    out = tmp_path / "k.json"
    bench = _bench("gpu_kernels")
    assert bench.main(["--device", "cpu", "--quick", "-o", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["gemms"] and data["gemms_fp8"] and data["attention"] and data["streams"]
    assert all(r["time_s"] > 0 for r in data["gemms"])
    assert _bench("kernel_constants").derive(data, 989.0, hbm_GBps=50.0)["gemm"]["n"] == len(data["gemms"])


def test_resolving_a_stacks_kernel_twice_changes_nothing():
    """A CostModel built from another's calibration (accuracy.py, the published-OOM check) prices attention the
    same: the kernel table is never rewritten, so FlashAttention v1 is not halved twice."""
    for topology in ("dgx-a100-80g", "dgx-h100"):
        first = _model("pytorch-fsdp", topology)
        again = CostModel(first.request, calibration=first.cal)
        assert (again.cal.attention_fraction, again.cal.attention_seq_half) == (
            first.cal.attention_fraction, first.cal.attention_seq_half)
