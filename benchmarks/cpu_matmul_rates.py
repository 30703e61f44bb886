"""Matmul rate of this CPU per dtype (one intra-op thread, process CPU time): the numbers behind the `cpu`
topology's peak_*_tflops (planner/data/topologies/cpu.yaml). Without native bf16/fp16 instructions (AVX512-BF16, AMX),
torch runs half-precision GEMMs tens of times slower than fp32; a plan in bf16 on this box must be priced so.

Run: python benchmarks/cpu_matmul_rates.py [--size 512] [--repeats 20]
"""

from __future__ import annotations

import argparse
import time


def rate_gflops(dtype, size: int, repeats: int) -> float:
    """2 n^3 FLOPs per n x n matmul over process CPU time, after 3 warm-up calls."""
    import torch

    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    for _ in range(3):
        a @ b
    start = time.process_time()
    for _ in range(repeats):
        a @ b
    return 2 * size**3 * repeats / (time.process_time() - start) / 1e9


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rates = {name: rate_gflops(getattr(torch, name), args.size, args.repeats) for name in ("float32", "bfloat16", "float16")}
    print(f"torch {torch.__version__}, one thread, {args.size}^3 matmul")
    print(f"{'dtype':<10}{'GFLOP/s':>10}{'vs fp32':>10}")
    for name, rate in rates.items():
        print(f"{name:<10}{rate:>10.2f}{rate / rates['float32']:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
