"""Inverting the cost model for a constant: the GEMM ceiling at which it reproduces a run's throughput
(`implied_ceiling`) and, for non-decreasing step times, the value of any one constant (`implied_value`).

The callers own the data: benchmarks/accuracy.py derives the per-(device family, software stack) GEMM ceilings of
calibration.yaml as the medians of the implied ceilings of the published runs (and re-derives them without each
source for its leave-one-source-out report); benchmarks/tinyllama_accuracy.py derives the eager-recipe constants.
This module imports nothing above planner.cost (no api, search or CLI).
"""

from __future__ import annotations

from collections.abc import Callable


def implied_ceiling(predict: Callable[[float], float], target_tflops: float, *, iterations: int = 6) -> float:
    """The GEMM ceiling fraction c at which `predict(c)` (TFLOP/s per GPU) equals the target.

    The step time is affine in 1/c (every GEMM time is flops / (peak * c) + a fixed cost), so the secant method on
    x = 1/c, y = 1/TFLOP/s converges in a few evaluations (the bottleneck-stage max makes it piecewise affine)."""
    x0, x1 = 1 / 0.5, 1 / 0.9
    y0, y1 = 1 / predict(1 / x0) - 1 / target_tflops, 1 / predict(1 / x1) - 1 / target_tflops
    for _ in range(iterations):
        if y1 == y0:
            break
        x0, x1 = x1, x1 - y1 * (x1 - x0) / (y1 - y0)
        x1 = min(max(x1, 1.0), 20.0)  # keep c in [0.05, 1]
        y0, y1 = y1, 1 / predict(1 / x1) - 1 / target_tflops
        if abs(y1) * target_tflops < 1e-6:
            break
    return 1 / x1


def implied_value(step_of: Callable[[float], float], target_s: float, *, high: float = 1e-3, iterations: int = 48) -> float:
    """The x in [0, high] at which step_of(x), a non-decreasing step time, reaches target_s (bisection); 0 when
    even x = 0 is slower than the target. Used for the eager-recipe constants (calibration.yaml, hopper), each the
    median of the values implied by the H100 TinyLlama rows (benchmarks/tinyllama_accuracy.py)."""
    low = 0.0
    if step_of(low) >= target_s:
        return 0.0
    for _ in range(iterations):
        mid = (low + high) / 2
        low, high = (mid, high) if step_of(mid) < target_s else (low, mid)
    return (low + high) / 2
