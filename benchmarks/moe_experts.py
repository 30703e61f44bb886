"""MoE experts: the grouped-GEMM forward (planner.nn.moe.GroupedExperts.forward) against the per-expert Python loop it
replaced (`forward_loop`), forward + backward, at a few routed-expert shapes; on CUDA (torch's grouped_mm in bf16)
or on CPU (the padded torch.bmm fallback, fp32 or bf16). Also reports the achieved TFLOP/s of the grouped path.

    python benchmarks/moe_experts.py [--device cuda] [--dtype bf16] [--iters 10] [--out FILE]

Shapes (tokens routed to this GPU x top_k, hidden, expert hidden, experts): Mixtral-8x7B-like (4096 x 2, 4096,
14336, 8) and Qwen3-30B-A3B-like (4096 x 8, 2048, 768, 128); on CPU smaller versions of both (--small, the
default there). Routing is uniform at random (the balanced case; imbalance widens the fallback's padding).
"""

from __future__ import annotations

import argparse
import json
import time

import torch

SHAPES = {"mixtral-like": (4096 * 2, 4096, 14336, 8), "qwen3-moe-like": (4096 * 8, 2048, 768, 128)}
SMALL = {"mixtral-like": (512 * 2, 256, 896, 8), "qwen3-moe-like": (512 * 8, 128, 48, 128)}


def time_fn(fn, x, counts, iters: int, device: torch.device) -> float:
    """Median seconds of forward + backward (after 2 warm-up calls)."""
    times = []
    for i in range(iters + 2):
        x.grad = None
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn(x, counts).float().square().mean().backward()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def measure(name: str, shape, *, device: torch.device, dtype: torch.dtype, iters: int) -> dict:
    from planner.nn.moe import GroupedExperts, grouped_gemm_available

    rows, dim, hidden, experts = shape
    module = GroupedExperts(dim, hidden, experts, activation="swiglu").to(device, dtype)
    ids = torch.randint(0, experts, (rows,), generator=torch.Generator().manual_seed(0))
    counts = torch.bincount(ids, minlength=experts).tolist()
    x = torch.randn(rows, dim, device=device, dtype=dtype, requires_grad=True)
    grouped = time_fn(module.forward, x, counts, iters, device)
    loop = time_fn(module.forward_loop, x, counts, iters, device)
    flops = 3 * 2 * rows * dim * hidden * 3  # three GEMMs (w1, w3, w2), forward + 2x backward
    return {"shape": name, "rows": rows, "dim": dim, "hidden": hidden, "experts": experts,
            "path": "grouped_mm" if grouped_gemm_available(x) else "padded_bmm",
            "grouped_s": grouped, "loop_s": loop, "speedup": loop / grouped, "grouped_tflops": flops / grouped / 1e12}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--small", action="store_true", help="the small shapes (default on CPU)")
    parser.add_argument("--out", help="write the rows as JSON here")
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    shapes = SMALL if (args.small or device.type == "cpu") else SHAPES
    rows = [measure(name, shape, device=device, dtype=dtype, iters=args.iters) for name, shape in shapes.items()]
    for r in rows:
        print(f"{r['shape']:15s} {r['path']:10s} grouped {r['grouped_s'] * 1e3:8.2f} ms  loop {r['loop_s'] * 1e3:8.2f} ms  "
              f"x{r['speedup']:.2f}  {r['grouped_tflops']:.3g} TFLOP/s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": str(device), "dtype": args.dtype, "torch": torch.__version__, "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
