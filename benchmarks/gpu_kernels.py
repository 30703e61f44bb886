"""Kernel rates of one GPU, measured: bf16 GEMMs over the shapes a transformer layer runs (forward, data-gradient
and weight-gradient layouts), fused causal attention per SDPA backend (FlashAttention-2 and cuDNN), and the
memory-bound kernels (copy, RMSNorm, SwiGLU, residual add). Writes one JSON file of raw times.

Why: the cost model's per-device kernel constants (planner/cost/calibration.yaml: the per-GEMM fixed time t0,
the attention kernels' rates, the HBM efficiency) are measurements, not priors. `--derive FILE` fits them from
such a file (no GPU needed) and prints them; tests/unit/test_kernel_constants.py checks calibration.yaml holds
what --derive prints for the committed file.

    python benchmarks/gpu_kernels.py -o profiles/kernels-h100.json      # on a CUDA machine (about 2 min)
    python benchmarks/gpu_kernels.py --device cpu --quick -o /tmp/k.json  # the same code path, tiny sizes
    python benchmarks/gpu_kernels.py --derive profiles/kernels-h100.json

Timing: CUDA events around `reps` back-to-back calls after 3 warm-up calls, reps chosen so one timed batch
lasts >= 20 ms; the median of 3 batches. Attention FLOPs follow the causal convention of FlashAttention-2
(Dao 2023, Sec. 4.1): 4 * b * heads * s^2 * d / 2 forward, 2.5x that backward.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

HIDDEN = (2048, 4096, 8192, 16384)
TOKENS = (2048, 8192)
TP = (1, 8)
SQUARE = (256, 512, 1024, 2048, 4096, 8192, 16384)
ATTN_SEQ = (1024, 2048, 4096, 8192, 16384, 32768)
ATTN_HEAD_DIMS = (64, 128)
ATTN_TOKENS = 65536  # b * s per attention case
ATTN_HIDDEN = 4096  # heads = ATTN_HIDDEN / head_dim
STREAM_ELEMENTS = 1 << 28  # 512 MiB of bf16 per streamed tensor


def layer_gemms(quick: bool) -> list[tuple[str, int, int, int]]:
    """(name, m, n, k) of a layer's four matmuls (qkv, attention out, fc1 and fc2 of a 4h FFN) per GPU, for
    each hidden size, token count and tp split, in the three layouts one forward + backward runs:
    forward x(m,k) @ w(k,n); data gradient dy(m,n) @ w^T(n,k); weight gradient x^T(k,m) @ dy(m,n)."""
    hidden, tokens, tps = ((256,), (128,), (1,)) if quick else (HIDDEN, TOKENS, TP)
    out = []
    for h in hidden:
        for m in tokens:
            for tp in tps:
                for layer, n, k in (("qkv", 3 * h // tp, h), ("out", h, h // tp), ("fc1", 4 * h // tp, h),
                                    ("fc2", h, 4 * h // tp)):
                    out += [(f"{layer}.fwd", m, n, k), (f"{layer}.dgrad", m, k, n), (f"{layer}.wgrad", k, n, m)]
    return out


class Timer:
    """Median seconds per call of fn(), on CUDA with events, on CPU with perf_counter."""

    def __init__(self, torch, device: str, min_batch_s: float):
        self.torch, self.device, self.min_batch_s = torch, device, min_batch_s

    def _sync(self) -> None:
        if self.device == "cuda":
            self.torch.cuda.synchronize()

    def __call__(self, fn) -> float:
        for _ in range(3):
            fn()
        self._sync()
        started = time.perf_counter()
        fn()
        self._sync()
        reps = max(1, min(1000, int(self.min_batch_s / max(time.perf_counter() - started, 1e-6))))
        batches = []
        for _ in range(3):
            if self.device == "cuda":
                begin, end = self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True)
                begin.record()
                for _ in range(reps):
                    fn()
                end.record()
                end.synchronize()
                batches.append(begin.elapsed_time(end) / 1e3 / reps)
            else:
                started = time.perf_counter()
                for _ in range(reps):
                    fn()
                batches.append((time.perf_counter() - started) / reps)
        return statistics.median(batches)


def measure_gemms(torch, timer: Timer, device: str, quick: bool) -> list[dict]:
    rows = []
    squares = [("square", n, n, n) for n in (SQUARE[:3] if quick else SQUARE)]
    for name, m, n, k in squares + layer_gemms(quick):
        a = torch.randn(m, k, device=device, dtype=torch.bfloat16)
        b = torch.randn(k, n, device=device, dtype=torch.bfloat16)
        seconds = timer(lambda: torch.matmul(a, b))
        rows.append({"name": name, "m": m, "n": n, "k": k, "flops": 2 * m * n * k, "time_s": seconds})
        del a, b
    return rows


def measure_fp8_gemms(torch, timer: Timer, device: str, quick: bool) -> list[dict]:
    """The forward layouts of layer_gemms and the squares as fp8 (e4m3) x fp8 -> bf16 through torch._scaled_mm
    (per-tensor scales, the second operand column-major as cuBLASLt wants it); a refusal is recorded once."""
    rows = []
    shapes = [("square", n, n, n) for n in (SQUARE[:3] if quick else SQUARE)]
    shapes += [g for g in layer_gemms(quick) if g[0].endswith(".fwd")]
    one = torch.ones((), device=device, dtype=torch.float32)
    for name, m, n, k in shapes:
        try:
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()
            seconds = timer(lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16))
        except (RuntimeError, TypeError) as exc:
            return rows + [{"name": name, "m": m, "n": n, "k": k, "error": str(exc).splitlines()[0][:200]}]
        rows.append({"name": name, "m": m, "n": n, "k": k, "flops": 2 * m * n * k, "time_s": seconds})
        del a, b
    return rows


def attention_backends(torch) -> dict:
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}


def measure_attention(torch, timer: Timer, device: str, quick: bool) -> list[dict]:
    """Causal self-attention through F.scaled_dot_product_attention pinned to one backend, forward and
    forward + backward; a backend that refuses the shape is recorded with its error."""
    from torch.nn.attention import sdpa_kernel
    import torch.nn.functional as F

    rows = []
    backends = {"math": attention_backends(torch)["math"]} if device == "cpu" else {
        k: v for k, v in attention_backends(torch).items() if k != "math"}
    seqs, dims, tokens, hidden = ((128, 256), (64,), 512, 256) if quick else (ATTN_SEQ, ATTN_HEAD_DIMS, ATTN_TOKENS, ATTN_HIDDEN)
    for backend, enum in backends.items():
        for d in dims:
            for s in seqs:
                b, heads = max(1, tokens // s), hidden // d
                q, k, v = (torch.randn(b, heads, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
                           for _ in range(3))
                grad = torch.randn(b, heads, s, d, device=device, dtype=torch.bfloat16)
                row = {"backend": backend, "batch": b, "heads": heads, "seq_len": s, "head_dim": d,
                       "fwd_flops_causal": 4 * b * heads * s * s * d / 2}
                try:
                    with sdpa_kernel([enum]):
                        row["fwd_s"] = timer(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
                        row["fwd_bwd_s"] = timer(lambda: torch.autograd.grad(
                            F.scaled_dot_product_attention(q, k, v, is_causal=True), (q, k, v), grad))
                except RuntimeError as exc:
                    row["error"] = str(exc).splitlines()[0][:200]
                rows.append(row)
                del q, k, v, grad
    return rows


def measure_streams(torch, timer: Timer, device: str, quick: bool) -> list[dict]:
    """Memory-bound kernels on bf16 tensors: bytes = every element read and written once per operand."""
    import torch.nn.functional as F

    n = 1 << 16 if quick else STREAM_ELEMENTS
    width = 256 if quick else 4096
    x = torch.randn(n // width, width, device=device, dtype=torch.bfloat16)
    y = torch.randn_like(x)
    weight = torch.ones(width, device=device, dtype=torch.bfloat16)
    out = torch.empty_like(x)
    cases = {"copy": (lambda: out.copy_(x), 2), "add": (lambda: torch.add(x, y, out=out), 3),
             "swiglu": (lambda: F.silu(x) * y, 3), "rms_norm": (lambda: F.rms_norm(x, (width,), weight), 2)}
    rows = []
    for name, (fn, operands) in cases.items():
        rows.append({"name": name, "bytes": operands * n * 2, "time_s": timer(fn)})
    return rows


def measure(device: str, quick: bool) -> dict:
    import torch

    timer = Timer(torch, device, 0.002 if quick else 0.02)
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    return {"device": name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version() if device == "cuda" else None,
            "measured_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "command": "python benchmarks/gpu_kernels.py " + " ".join(sys.argv[1:]),
            "gemms": measure_gemms(torch, timer, device, quick),
            "gemms_fp8": measure_fp8_gemms(torch, timer, device, quick),
            "attention": measure_attention(torch, timer, device, quick),
            "streams": measure_streams(torch, timer, device, quick)}


def write_atomic(path: Path, text: str) -> None:
    """planner.io.atomic_write_text's job, without importing the planner: this script runs on GPU machines where
    only torch is installed (the device image has no pydantic)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, help="where to write the measurements (JSON)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes: checks the code path, measures nothing useful")
    parser.add_argument("--derive", type=Path, metavar="FILE", help="fit the cost model's kernel constants from FILE")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="datasheet bf16 dense peak (H100/H200 SXM: 989)")
    parser.add_argument("--hbm-GBps", type=float, default=None, help="datasheet HBM bandwidth (default: by device name)")
    args = parser.parse_args(argv)
    if args.derive:
        from kernel_constants import print_derivation

        return print_derivation(json.loads(args.derive.read_text(encoding="utf-8")), args.peak_tflops, args.hbm_GBps)
    if args.output is None:
        parser.error("-o/--output is required to measure")
    result = measure(args.device, args.quick)
    write_atomic(args.output, json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}: {len(result['gemms'])} GEMMs, {len(result['attention'])} attention cases, "
          f"{len(result['streams'])} streams on {result['device']}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    raise SystemExit(main())
