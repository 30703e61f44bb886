"""Deriving a device family's GEMM ceiling from published end-to-end throughput: the ceiling at which this cost
model reproduces a run's TFLOP/s (`implied_ceiling`), and the median over a set of runs.

The shipped A100 value (calibration.yaml) is the median over the A100 runs of the validation set, computed by
benchmarks/accuracy.py (which also reports leave-one-model-out errors). For comparison this module derives the
value NVIDIA's own Megatron-LM runs imply: Narayanan et al. 2021 ("Efficient Large-Scale Language Model Training
on GPU Clusters Using Megatron-LM"), Table 1, GPT models from 1.7B to 1T parameters on Selene (DGX A100 80GB,
8 HDR NICs per node) with activation recomputation (the reported FLOPs count it: eq. 3 with the factor 4).
Assumptions the table does not state: micro-batch 1, the 1F1B schedule, ZeRO-0, dropout 0.1 (GPT-3 convention),
unfused attention and no overlap of the gradient all-reduce (2021 Megatron-LM). The median is ~0.745, against
~0.575 for the Megatron-DeepSpeed/metaseq-era runs of the validation set.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable

from planner.cost.calibration import device_calibration

# (params_b, heads, hidden, layers, tp, pp, gpus, global_batch, achieved TFLOP/s per GPU), Narayanan 2021 Table 1.
NARAYANAN_2021_TABLE_1 = (
    (1.7, 24, 2304, 24, 1, 1, 32, 512, 137),
    (3.6, 32, 3072, 30, 2, 1, 64, 512, 138),
    (7.5, 32, 4096, 36, 4, 1, 128, 512, 142),
    (18.4, 48, 6144, 40, 8, 1, 256, 1024, 135),
    (39.1, 64, 8192, 48, 8, 2, 512, 1536, 138),
    (76.1, 80, 10240, 60, 8, 4, 1024, 1792, 140),
    (145.6, 96, 12288, 80, 8, 8, 1536, 2304, 148),
    (310.1, 128, 16384, 96, 8, 16, 1920, 2160, 155),
    (529.6, 128, 20480, 105, 8, 35, 2520, 2520, 163),
    (1008.0, 160, 25600, 128, 8, 64, 3072, 3072, 163),
)
VOCAB, SEQ = 51200, 2048


def _row_tflops(row: tuple, ceiling: float) -> float:
    from planner import api
    from planner.cost.model import Candidate, CostModel, CostOptions
    from planner.schemas.model import ModelSpec

    _, heads, hidden, layers, tp, pp, gpus, batch, _ = row
    spec = ModelSpec(name="gpt", num_layers=layers, hidden_size=hidden, ffn_hidden_size=4 * hidden, num_attention_heads=heads,
                     vocab_size=VOCAB, seq_len=SEQ, activation="gelu", position="learned", tied_embeddings=True, linear_bias=True)
    request = api.build_request(model=spec, topology="dgx-a100-80g", gpus=gpus, global_batch_size=batch, seq_len=SEQ)
    cal = dataclasses.replace(device_calibration(request.topology.device), matmul_ceiling_fraction=ceiling)
    model = CostModel(request, options=CostOptions(flash_attention=False, dropout=True, dp_overlap=False), calibration=cal)
    dp = gpus // (tp * pp)
    cand = Candidate(dp=dp, tp=tp, pp=pp, microbatch_size=1, num_microbatches=batch // dp, recompute="full")
    return model.evaluate(cand).hardware_tflops_per_gpu


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


def derive_a100_ceiling() -> tuple[float, list[float]]:
    """(median implied ceiling, per-row implied ceilings) over Narayanan 2021 Table 1."""
    per_row = [implied_ceiling(lambda c, row=row: _row_tflops(row, c), row[-1]) for row in NARAYANAN_2021_TABLE_1]
    return statistics.median(per_row), per_row


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
