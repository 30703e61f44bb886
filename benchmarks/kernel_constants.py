"""The cost model's kernel constants of one device family, fitted from a file of measured kernel times
(benchmarks/gpu_kernels.py). Pure functions of that file's numbers; printed by `gpu_kernels.py --derive FILE`
and checked against planner/cost/calibration.yaml by tests/unit/test_kernel_constants.py.

- GEMM: time = flops / (peak * c) + t0 (planner/cost/compute.py gemm_time_s), fitted over every measured GEMM by
  least squares on relative error (each row weighted by 1 / its time). t0 is the per-call fixed cost the cost
  model uses (`gemm_fixed_s`); c is printed beside the large-GEMM ceiling (the 8192^3 rate / peak). The in-step
  ceiling per software stack stays derived from published runs (benchmarks/accuracy.py).
- Attention: per backend and head dim, the rate at which causal forward + backward runs in the cost model's
  convention (time = 3.5 x causal forward FLOPs / (peak x rate): backward is 2.5x the forward's FLOPs,
  FlashAttention-2 Sec. 3.1.2) as a function of the sequence length s: rate(s) = fraction * s / (s + seq_half),
  the quadratic work at the long-sequence rate plus work linear in s (attention_fit, planner.cost.compute
  attention_seq_factor).
- fp8 GEMMs (torch._scaled_mm, e4m3 with per-tensor scales): the same fit against the fp8 peak (2x bf16); its c
  over the bf16 fit's c on the same shapes is `fp8_matmul_relative`.
- HBM: achieved / datasheet bandwidth of a device-to-device copy (`hbm_efficiency`), the others printed.
"""

from __future__ import annotations

import statistics

import numpy as np

MIN_ATTENTION_SEQ = 2048
ATTENTION_HEAD_DIM = 128
FWD_BWD_FLOPS = 3.5  # forward + backward of fused attention, in units of its forward FLOPs
FP8_PEAK_RATIO = 2.0  # fp8 dense peak / bf16 dense peak (H100/H200 SXM datasheet: 1979 / 989)
HBM_GBPS_BY_NAME = {"H100": 3350.0, "H200": 4800.0, "H800": 3350.0, "A100": 2039.0}


def gemm_fit(rows: list[dict], peak_tflops: float) -> dict:
    """Weighted least squares of time = a * flops + t0 (weights 1 / time: relative error); returns the implied
    ceiling c = 1 / (a * peak), t0, the 8192^3 ceiling and the fit's relative errors."""
    flops = np.array([r["flops"] for r in rows], dtype=float)
    times = np.array([r["time_s"] for r in rows], dtype=float)
    design = np.stack([flops, np.ones_like(flops)], axis=1) / times[:, None]
    (slope, t0), *_ = np.linalg.lstsq(design, np.ones_like(times), rcond=None)
    fitted = slope * flops + t0
    errors = np.abs(fitted / times - 1)
    large = [r for r in rows if r["name"] == "square" and r["m"] == 8192]
    return {"ceiling_fit": 1 / (slope * peak_tflops * 1e12), "gemm_fixed_s": float(t0),
            "ceiling_8192": large[0]["flops"] / large[0]["time_s"] / (peak_tflops * 1e12) if large else None,
            "median_rel_error": float(np.median(errors)), "p90_rel_error": float(np.quantile(errors, 0.9)),
            "n": len(rows)}


def attention_fraction(row: dict, peak_tflops: float) -> float | None:
    if "fwd_bwd_s" not in row:
        return None
    return FWD_BWD_FLOPS * row["fwd_flops_causal"] / (row["fwd_bwd_s"] * peak_tflops * 1e12)


def attention_fit(rows: list[dict], peak_tflops: float) -> dict[str, float]:
    """Fit of rate(s) = fraction * s / (s + seq_half) over one kernel's sequence lengths: time * peak / (3.5 F) =
    1/fraction + (seq_half/fraction) / s is linear in 1/s; least squares on relative error."""
    inv_s = np.array([1.0 / r["seq_len"] for r in rows])
    y = np.array([1.0 / attention_fraction(r, peak_tflops) for r in rows])
    design = np.stack([np.ones_like(inv_s), inv_s], axis=1) / y[:, None]
    (a, c), *_ = np.linalg.lstsq(design, np.ones_like(y), rcond=None)
    fitted = a + c * inv_s
    return {"fraction": float(1 / a), "seq_half": float(c / a), "max_rel_error": float(np.max(np.abs(fitted / y - 1)))}


def attention_fractions(rows: list[dict], peak_tflops: float) -> dict[str, dict[int, dict[str, float]]]:
    """Per backend and head dim: the saturating fit over every measured sequence length (attention_fit)."""
    out: dict[str, dict[int, dict[str, float]]] = {}
    for backend in sorted({r["backend"] for r in rows}):
        for dim in sorted({r["head_dim"] for r in rows}):
            cases = [r for r in rows if r["backend"] == backend and r["head_dim"] == dim and "fwd_bwd_s" in r]
            if len(cases) >= 2:
                out.setdefault(backend, {})[dim] = attention_fit(cases, peak_tflops)
    return out


def backward_factors(rows: list[dict]) -> dict[str, float]:
    """Per backend: median measured (fwd+bwd - fwd) / fwd time at head dim ATTENTION_HEAD_DIM (the model: 2.5)."""
    out = {}
    for backend in sorted({r["backend"] for r in rows}):
        ratios = [(r["fwd_bwd_s"] - r["fwd_s"]) / r["fwd_s"] for r in rows if r["backend"] == backend and "fwd_s" in r
                  and r["head_dim"] == ATTENTION_HEAD_DIM and r["seq_len"] >= MIN_ATTENTION_SEQ]
        if ratios:
            out[backend] = statistics.median(ratios)
    return out


def hbm_bandwidth_GBps(device: str) -> float | None:
    for key, value in HBM_GBPS_BY_NAME.items():
        if key in device:
            return value
    return None


def stream_fractions(rows: list[dict], hbm_GBps: float) -> dict[str, float]:
    return {r["name"]: r["bytes"] / r["time_s"] / (hbm_GBps * 1e9) for r in rows}


def derive(data: dict, peak_tflops: float, hbm_GBps: float | None = None) -> dict:
    """Every constant of this module's docstring from one measurement file."""
    hbm = hbm_GBps or hbm_bandwidth_GBps(data["device"])
    fractions = attention_fractions(data["attention"], peak_tflops)
    fp8 = [r for r in data.get("gemms_fp8", []) if "time_s" in r]
    gemm_fp8 = gemm_fit(fp8, FP8_PEAK_RATIO * peak_tflops) if len(fp8) > 2 else None
    same_shapes = {(r["name"], r["m"], r["n"], r["k"]) for r in fp8}
    bf16_same = gemm_fit([r for r in data["gemms"] if (r["name"], r["m"], r["n"], r["k"]) in same_shapes], peak_tflops)
    streams = stream_fractions(data["streams"], hbm) if hbm else {}
    return {"device": data["device"], "gemm": gemm_fit(data["gemms"], peak_tflops), "gemm_fp8": gemm_fp8,
            "fp8_matmul_relative": gemm_fp8["ceiling_fit"] / bf16_same["ceiling_fit"] if gemm_fp8 else None,
            "attention": fractions, "attention_backward_factor": backward_factors(data["attention"]),
            "streams": streams, "hbm_efficiency": streams.get("copy")}


def print_derivation(data: dict, peak_tflops: float, hbm_GBps: float | None) -> int:
    d = derive(data, peak_tflops, hbm_GBps)
    g = d["gemm"]
    print(f"{d['device']} (torch {data['torch']}, CUDA {data['cuda']}, cuDNN {data['cudnn']}), peak {peak_tflops:g} TFLOP/s")
    print(f"GEMM: t = flops/(peak*c) + t0 over {g['n']} GEMMs: c = {g['ceiling_fit']:.3f}, gemm_fixed_s = "
          f"{g['gemm_fixed_s']:.3e} (fit |rel err| median {g['median_rel_error']:.1%}, p90 {g['p90_rel_error']:.1%}); "
          f"8192^3 ceiling {g['ceiling_8192'] or float('nan'):.3f}")
    if d["gemm_fp8"]:
        f = d["gemm_fp8"]
        print(f"fp8 GEMM (torch._scaled_mm, peak {FP8_PEAK_RATIO * peak_tflops:g}) over {f['n']}: c = {f['ceiling_fit']:.3f}, "
              f"t0 = {f['gemm_fixed_s']:.3e}; 8192^3 ceiling {f['ceiling_8192'] or float('nan'):.3f}; "
              f"fp8_matmul_relative (fp8 c / bf16 c on the same shapes) = {d['fp8_matmul_relative']:.3f}")
    print("attention (causal fwd+bwd, fraction of peak: rate(s) = fraction * s / (s + seq_half)):")
    for backend, dims in d["attention"].items():
        shown = ", ".join(f"head dim {dim}: fraction {v['fraction']:.3f} seq_half {v['seq_half']:.0f} "
                          f"(max fit error {v['max_rel_error']:.1%})" for dim, v in dims.items())
        print(f"  {backend:<10} {shown}; backward/forward time {d['attention_backward_factor'].get(backend, float('nan')):.2f}")
    print("per case: " + "; ".join(
        f"{r['backend']} d{r['head_dim']} s{r['seq_len']} {attention_fraction(r, peak_tflops) or float('nan'):.3f}"
        for r in data["attention"]))
    if d["streams"]:
        print("HBM (achieved / datasheet): " + ", ".join(f"{k} {v:.3f}" for k, v in d["streams"].items()))
    return 0
