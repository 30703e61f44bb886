"""The caching allocator's reserved bytes beyond the allocated ones, per allocator setting: PyTorch's default caching
allocator and PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, on the same Megatron-style bf16 training steps.

Why: the cost model's predicted peak is allocated * (1 + fraction) + fixed (planner/cost/evaluate.py), with the
allowance of the allocator setting the stack's launch runs under (frameworks/*.yaml behaviour.memory.allocator;
NeMo's performance scripts and torchtitan's run_train.sh set expandable_segments). The default's allowance is
measured (validation/h100_hf_tinyllama.jsonl); expandable_segments' is not, and carries the default's until this
script has run on a GPU (planner/cost/calibration.yaml `memory`).

The workload allocates the way Megatron-Core does (megatron/core/distributed/param_and_grad_buffer.py, the
distributed optimizer): one contiguous bf16 parameter buffer and one contiguous fp32 main-gradient buffer allocated
once, every weight a view into them; each weight's bf16 gradient is added into its main-gradient view by a
post-accumulate hook and freed (Megatron's grad hook); fp32 master weights and AdamW moments for 1/DP_SHARDS of the
parameters (ZeRO-1 at dp 8), stepped by fused AdamW and copied back into the bf16 buffer. Micro-batches run the
first pipeline stage's 1F1B order (up to `in_flight` forwards ahead of their backwards), some with sequence lengths
that vary between micro-batches, one with full recompute, one MoE with skewed top-2 routing (per-expert token counts
that differ between experts and micro-batches). Decoder layers: RMSNorm, GQA attention (SDPA, causal), SwiGLU MLP,
Llama-3-8B widths; fp32 logits and cross-entropy. Each (setting, case) runs in a fresh process, the allocator
variable set (or removed) before torch initialises CUDA, 3 steps; a row records torch.cuda.max_memory_allocated and
max_memory_reserved over the steps (and per step), the allocator's retries and inactive split bytes, and whether
the snapshot shows expandable segments (the setting took effect).

    python benchmarks/gpu_memory_allocator.py --dry-run                 # no GPU: the cases and settings, nothing measured
    # on the lent GPU (torch only; run tool, timeout_s 480; 8 processes of ~15-30 s each, about 3-4 minutes):
    PYTHONUNBUFFERED=1 python3 benchmarks/gpu_memory_allocator.py -o $OUT/memory-allocator-h100.json
    # then here: copy it to profiles/memory-allocator-h100.json and derive the calibration.yaml entries (CPU):
    python benchmarks/gpu_memory_allocator.py --derive profiles/memory-allocator-h100.json           # print them
    python benchmarks/gpu_memory_allocator.py --derive profiles/memory-allocator-h100.json --write   # and write them
    python benchmarks/gpu_memory_allocator.py --device cpu --quick -o /tmp/a.json   # the same code path, tiny, no stats

--derive is benchmarks/allocator_constants.py (the rule is written there).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import deque
from pathlib import Path

ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")  # torch >= 2.9 reads the second, older ones the first
SETTINGS = {"default": None, "expandable_segments": "expandable_segments:True"}
DP_SHARDS = 8  # master weights and AdamW moments held for 1/8 of the parameters (the distributed optimizer at dp 8)
STEPS = 3
DENSE = dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, layers=8, vocab=32000, experts=0)
MOE = dict(hidden=4096, ffn=14336, heads=32, kv_heads=8, layers=2, vocab=32000, experts=8)
QUICK = {"dense": dict(hidden=64, ffn=128, heads=4, kv_heads=2, layers=2, vocab=128, experts=0),
         "moe": dict(hidden=64, ffn=128, heads=4, kv_heads=2, layers=2, vocab=128, experts=4)}
QUICK_SEQ_DIVISOR = 256
# name: (shape, sequence lengths cycled over the micro-batches, microbatch_size, micro-batches, in flight, recompute)
CASES = {
    "dense-1f1b": ("dense", (8192,), 1, 6, 2, "none"),
    "dense-varying-seq": ("dense", (8192, 3072, 6144, 5120, 2048, 7168), 1, 6, 3, "none"),
    "dense-full-recompute": ("dense", (8192,), 2, 6, 4, "full"),
    "moe-skewed-routing": ("moe", (8192, 6144), 1, 6, 3, "none"),
}


def layer_shapes(size: dict) -> dict[str, tuple[int, ...]]:
    """Weights of one decoder layer (Llama: fused QKV with GQA, SwiGLU gate and up fused; MoE: a router and
    `experts` SwiGLU experts)."""
    h, f, d = size["hidden"], size["ffn"], size["hidden"] // size["heads"]
    shapes = {"norm1": (h,), "qkv": ((size["heads"] + 2 * size["kv_heads"]) * d, h), "proj": (h, size["heads"] * d),
              "norm2": (h,)}
    if size["experts"]:
        shapes["router"] = (size["experts"], h)
        for e in range(size["experts"]):
            shapes[f"fc1.{e}"], shapes[f"fc2.{e}"] = (2 * f, h), (h, f)
    else:
        shapes["fc1"], shapes["fc2"] = (2 * f, h), (h, f)
    return shapes


class Buffers:
    """Megatron-style parameters: views into one bf16 buffer, main gradients views into one fp32 buffer."""

    def __init__(self, torch, size: dict, device: str):
        shapes = {"embed": (size["vocab"], size["hidden"]), "final_norm": (size["hidden"],),
                  "output": (size["vocab"], size["hidden"])}
        for i in range(size["layers"]):
            shapes.update({f"layers.{i}.{k}": v for k, v in layer_shapes(size).items()})
        self.numel = sum(_prod(s) for s in shapes.values())
        self.param = torch.empty(self.numel, dtype=torch.bfloat16, device=device).normal_(0, 0.02)
        self.main_grad = torch.zeros(self.numel, dtype=torch.float32, device=device)
        self.weights, offset = {}, 0
        for name, shape in shapes.items():
            n = _prod(shape)
            view = self.param[offset:offset + n].view(shape)
            if name.endswith("norm") or ".norm" in name:
                view.fill_(1.0)
            p = torch.nn.Parameter(view)  # a leaf sharing the buffer's storage
            p.main_grad = self.main_grad[offset:offset + n].view(shape)
            p.register_post_accumulate_grad_hook(_into_main_grad)
            self.weights[name], offset = p, offset + n
        shard = self.numel // DP_SHARDS
        self.shard = slice(0, shard)
        self.master = torch.nn.Parameter(self.param[self.shard].float())
        self.optimizer = torch.optim.AdamW([self.master], lr=1e-5, fused=device == "cuda")

    def step(self, torch) -> None:
        """The distributed optimizer's step on this rank's shard, the bf16 copy back, the buffer zeroed."""
        self.master.grad = self.main_grad[self.shard]
        self.optimizer.step()
        with torch.no_grad():
            self.param[self.shard].copy_(self.master)
        self.master.grad = None
        self.main_grad.zero_()


def _into_main_grad(p) -> None:
    p.main_grad.add_(p.grad)
    p.grad = None


def _prod(shape) -> int:
    out = 1
    for n in shape:
        out *= n
    return out


def decoder_layer(torch, w: dict, x, size: dict):
    """One Llama decoder layer on x [b, s, h]; w maps the layer's weight names to Parameters."""
    F = torch.nn.functional
    b, s, h = x.shape
    a, g = size["heads"], size["kv_heads"]
    d = h // a
    qkv = F.linear(F.rms_norm(x, (h,), w["norm1"]), w["qkv"])
    q = qkv[..., :a * d].view(b, s, a, d).transpose(1, 2)
    k = qkv[..., a * d:(a + g) * d].view(b, s, g, d).transpose(1, 2)
    v = qkv[..., (a + g) * d:].view(b, s, g, d).transpose(1, 2)
    attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    x = x + F.linear(attn.transpose(1, 2).reshape(b, s, a * d), w["proj"])
    y = F.rms_norm(x, (h,), w["norm2"])
    return x + (moe_mlp(torch, w, y, size) if size["experts"] else swiglu(torch, w["fc1"], w["fc2"], y))


def swiglu(torch, fc1, fc2, y):
    gate, up = torch.nn.functional.linear(y, fc1).chunk(2, dim=-1)
    return torch.nn.functional.linear(torch.nn.functional.silu(gate) * up, fc2)


def moe_mlp(torch, w: dict, y, size: dict):
    """Top-2 routing with a fixed bias towards the later experts (skewed load, as an imbalanced router gives), each
    expert's tokens gathered, run through its SwiGLU and added back: per-expert sizes vary by micro-batch."""
    experts, flat = size["experts"], y.reshape(-1, y.shape[-1])
    skew = torch.linspace(0.0, 2.0, experts, device=y.device)
    probs = torch.softmax(torch.nn.functional.linear(flat, w["router"]).float() + skew, dim=-1)
    weight, index = probs.topk(2, dim=-1)
    out = torch.zeros_like(flat)
    for e in range(experts):
        token, slot = (index == e).nonzero(as_tuple=True)
        if token.numel():
            part = swiglu(torch, w[f"fc1.{e}"], w[f"fc2.{e}"], flat[token]) * weight[token, slot, None].to(y.dtype)
            out = out.index_add(0, token, part)
    return out.view_as(y)


def micro_batch_loss(torch, buffers: Buffers, size: dict, ids, recompute: str):
    F, w = torch.nn.functional, buffers.weights
    x = F.embedding(ids, w["embed"])
    for i in range(size["layers"]):
        layer = {k.split(".", 2)[2]: p for k, p in w.items() if k.startswith(f"layers.{i}.")}
        run = lambda t, layer=layer: decoder_layer(torch, layer, t, size)  # noqa: E731
        x = torch.utils.checkpoint.checkpoint(run, x, use_reentrant=False) if recompute == "full" else run(x)
    logits = F.linear(F.rms_norm(x, (size["hidden"],), w["final_norm"]), w["output"]).float()
    return F.cross_entropy(logits.view(-1, size["vocab"]), ids.view(-1))


def train_step(torch, buffers: Buffers, size: dict, case: tuple, quick: bool, device: str) -> None:
    """One step: the micro-batches in 1F1B order with at most `in_flight` forwards pending, then the optimizer."""
    _, seqs, mbs, count, in_flight, recompute = case
    pending = deque()
    for i in range(count):
        seq = max(8, seqs[i % len(seqs)] // (QUICK_SEQ_DIVISOR if quick else 1))
        ids = torch.randint(0, size["vocab"], (mbs, seq), device=device)
        pending.append(micro_batch_loss(torch, buffers, size, ids, recompute))
        if len(pending) >= in_flight:
            pending.popleft().backward()
    while pending:
        pending.popleft().backward()
    buffers.step(torch)


def expandable_seen(torch):
    """Whether the allocator's snapshot shows expandable segments (None where the snapshot has no such field)."""
    segments = torch.cuda.memory._snapshot().get("segments", [])
    flags = [s["is_expandable"] for s in segments if "is_expandable" in s]
    return any(flags) if flags else None


def run_case(name: str, setting: str, device: str, quick: bool) -> dict:
    """One (setting, case) in this process: the allocator variables were set by the parent before torch loaded."""
    import torch

    case = CASES[name]
    size = QUICK[case[0]] if quick else (MOE if case[0] == "moe" else DENSE)
    cuda = device == "cuda"
    row = {"case": name, "allocator": setting, "env": {k: os.environ.get(k) for k in ALLOC_VARS}, "size": size,
           "seqs": list(case[1]), "microbatch_size": case[2], "num_microbatches": case[3], "in_flight": case[4],
           "recompute": case[5], "quick": quick, "torch": torch.__version__,
           "device": torch.cuda.get_device_name(0) if cuda else "cpu"}
    torch.manual_seed(0)
    try:
        buffers = Buffers(torch, size, device)
        row["params"] = buffers.numel
        row["static_bytes"] = torch.cuda.memory_allocated() if cuda else None
        steps = []
        for _ in range(STEPS):
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            train_step(torch, buffers, size, case, quick, device)
            if cuda:
                torch.cuda.synchronize()
                steps.append({"peak_allocated_bytes": torch.cuda.max_memory_allocated(),
                              "peak_reserved_bytes": torch.cuda.max_memory_reserved()})
    except torch.cuda.OutOfMemoryError as exc:
        return {**row, "status": "oom", "error": str(exc).splitlines()[0][:300]}
    row["status"] = "ok"
    if cuda:
        stats = torch.cuda.memory_stats()
        row.update(steps=steps, peak_allocated_bytes=max(s["peak_allocated_bytes"] for s in steps),
                   peak_reserved_bytes=max(s["peak_reserved_bytes"] for s in steps),
                   alloc_retries=stats.get("num_alloc_retries"),
                   inactive_split_bytes_peak=stats.get("inactive_split_bytes.all.peak"),
                   expandable_segments_seen=expandable_seen(torch),
                   total_memory_bytes=torch.cuda.get_device_properties(0).total_memory)
    return row


def child_env(setting: str) -> dict[str, str]:
    """This process's environment with the allocator variables of `setting` only (none for the default)."""
    env = {k: v for k, v in os.environ.items() if k not in ALLOC_VARS}
    if SETTINGS[setting] is not None:
        env.update({k: SETTINGS[setting] for k in ALLOC_VARS})
    return env


def measure(device: str, quick: bool, cases: list[str], settings: list[str], timeout_s: float = 300) -> dict:
    """Every (setting, case) in a fresh process; a failure is recorded as a row with its message."""
    rows = []
    for setting in settings:
        for name in cases:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--one", name, "--setting", setting, "--device", device]
            done = subprocess.run(cmd + (["--quick"] if quick else []), capture_output=True, text=True,
                                  env=child_env(setting), timeout=timeout_s)
            lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
            rows.append(json.loads(lines[-1]) if done.returncode == 0 and lines else
                        {"case": name, "allocator": setting, "status": "error",
                         "error": (done.stderr or done.stdout)[-1500:]})
            print(json.dumps({k: rows[-1].get(k) for k in ("allocator", "case", "status", "peak_allocated_bytes",
                                                           "peak_reserved_bytes", "expandable_segments_seen")}),
                  flush=True)
    return {"script": "benchmarks/gpu_memory_allocator.py", "command": " ".join(sys.argv), "quick": quick,
            "device": next((r["device"] for r in rows if "device" in r), device), "rows": rows}


def write_atomic(path: Path, text: str) -> None:
    """planner.io.atomic_write_text's job without importing the planner (the GPU image has torch only)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def dry_run(cases: list[str], settings: list[str]) -> int:
    for setting in settings:
        for name in cases:
            shape, seqs, mbs, count, in_flight, recompute = CASES[name]
            print(f"{setting:19} {name:22} {shape}: seq {'/'.join(map(str, seqs))} x mbs {mbs}, {count} micro-batches, "
                  f"{in_flight} in flight, recompute {recompute}; env {SETTINGS[setting] or '(allocator vars removed)'}")
    print(f"dry run: nothing measured ({'CUDA available: run without --dry-run' if cuda_available() else 'no CUDA device here'})")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path, help="results JSON (profiles/memory-allocator-<device>.json)")
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check of the code path)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--settings", nargs="*", default=list(SETTINGS), choices=list(SETTINGS))
    parser.add_argument("--dry-run", action="store_true", help="list what would run; needs no GPU")
    parser.add_argument("--derive", type=Path, metavar="FILE", help="results -> calibration.yaml memory entries (CPU)")
    parser.add_argument("--write", action="store_true", help="with --derive: write them into calibration.yaml")
    parser.add_argument("--one", choices=list(CASES), help=argparse.SUPPRESS)
    parser.add_argument("--setting", choices=list(SETTINGS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.derive is not None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from allocator_constants import main as derive_main

        return derive_main([str(args.derive)] + (["--write"] if args.write else []))
    if args.one:
        print(json.dumps(run_case(args.one, args.setting, args.device, args.quick)), flush=True)
        return 0
    if args.dry_run:
        return dry_run(args.cases, args.settings)
    if args.device == "cuda" and not cuda_available():
        print("gpu_memory_allocator: no CUDA device here: nothing measured (run it on a GPU; --dry-run, "
              "--device cpu --quick and --derive FILE need none)", file=sys.stderr)
        return 2
    if args.output is None:
        parser.error("-o/--output is required")
    write_atomic(args.output, json.dumps(measure(args.device, args.quick, args.cases, args.settings), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
