"""Peak GPU memory of real training steps, measured per mechanism the cost model charges: the working set of a
layer recomputed under full recompute, DeepSpeed ZeRO-3's live parameters, gradients and buckets, and FSDP2's
gathered blocks. Writes one JSON file of raw byte counts; `benchmarks/memory_mechanisms.py` compares them with
the planner's memory formulas (no GPU needed there).

Why: the memory model must be one-sided (a configuration that ran is never predicted not to fit) and still flag
the configurations that did not fit. Both need the transient terms that no published run itemises: what a
recomputed layer holds during its backward, and what a ZeRO-3 stack keeps gathered. These are measured here.

    python benchmarks/gpu_memory.py -o profiles/memory-h100.json          # CUDA; DeepSpeed optional
    python benchmarks/gpu_memory.py --device cpu --quick -o /tmp/m.json    # the same code path, tiny sizes

Each case runs in its own process (a fresh caching allocator, one torch.distributed world of 1 rank), trains
three steps of a GPT decoder (LayerNorm, GeLU MLP of 4h, causal attention) on random tokens, and reports for the
third step: bytes allocated before it, the peak of forward + backward, the peak of the optimizer step, and the
bytes allocated after it (torch.cuda.max_memory_allocated / memory_allocated after reset_peak_memory_stats), and
the caching allocator's reserved peak of each phase (max_memory_reserved: what the stack's fragmentation costs).
Attention: "flash" = SDPA's flash backend (keeps the log-sum-exp only), "math" = an explicit softmax that keeps
its probabilities (a*s^2*b bf16 elements), as the pre-FlashAttention stacks did.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

FULL = dict(hidden=4096, heads=32, layers=8, vocab=32000, seq=4096, microbatch=2)
WIDE = dict(hidden=8192, heads=64, layers=3, vocab=32000, seq=512, microbatch=1)  # weights >> activations
QUICK = dict(hidden=64, heads=4, layers=2, vocab=128, seq=32, microbatch=2)
QUICK_WIDE = dict(hidden=128, heads=4, layers=2, vocab=128, seq=8, microbatch=1)
DS_DEFAULT = dict(prefetch_bucket=50_000_000, max_live=1_000_000_000, reduce_bucket=500_000_000)
DS_SMALL = dict(prefetch_bucket=0, max_live=0, reduce_bucket=10_000_000)
CASES = {
    # name: (stack, attention, recompute, extra); names ending in "-wide" run the WIDE size, where the gathered
    # weights of ZeRO-3 dominate the activations (per-module vs per-block gathering differ by gigabytes)
    "torch-none-flash": ("torch", "flash", "none", {}),
    "torch-full-flash": ("torch", "flash", "full", {}),
    "torch-none-math": ("torch", "math", "none", {}),
    "torch-full-math": ("torch", "math", "full", {}),
    "deepspeed-z3-full-math": ("deepspeed", "math", "full", DS_DEFAULT),
    "deepspeed-z3-full-math-small-buckets": ("deepspeed", "math", "full", DS_SMALL),
    "deepspeed-z3-none-flash": ("deepspeed", "flash", "none", DS_DEFAULT),
    "fsdp2-full-flash": ("fsdp2", "flash", "full", {}),
    "torch-full-flash-wide": ("torch", "flash", "full", {}),
    "deepspeed-z3-full-flash-wide": ("deepspeed", "flash", "full", DS_DEFAULT),
    "deepspeed-z3-full-flash-wide-small-buckets": ("deepspeed", "flash", "full", DS_SMALL),
    "fsdp2-full-flash-wide": ("fsdp2", "flash", "full", {}),
}


def build_model(torch, size: dict, attention: str, recompute: str):
    """A GPT decoder in plain torch: every weight an nn.Linear / nn.Embedding / nn.LayerNorm, so ZeRO-3's
    per-module hooks and FSDP2's per-block wrapping see the modules a Megatron-style model has."""
    nn, F = torch.nn, torch.nn.functional
    h, a = size["hidden"], size["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
            self.qkv, self.proj = nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def attend(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, a, h // a).permute(2, 0, 3, 1, 4)
            if attention == "flash":
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            else:
                scores = (q @ k.transpose(-1, -2)) * (h // a) ** -0.5
                mask = torch.ones(s, s, dtype=torch.bool, device=x.device).triu(1)
                out = torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1) @ v
            return self.proj(out.transpose(1, 2).reshape(b, s, h))

        def forward(self, x):
            x = x + self.attend(x)
            return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(size["vocab"], h)
            self.blocks = nn.ModuleList(Block() for _ in range(size["layers"]))
            self.norm, self.head = nn.LayerNorm(h), nn.Linear(h, size["vocab"], bias=False)

        def forward(self, ids):
            x = self.embed(ids)
            for block in self.blocks:
                if recompute == "full":
                    x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
            logits = self.head(self.norm(x)).float()
            return F.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1))

    return GPT()


def count_params(model) -> dict:
    """Parameter counts the derivation needs: total, the largest nn.Linear, one block."""
    linears = [m.weight.numel() + (m.bias.numel() if m.bias is not None else 0)
               for m in model.modules() if type(m).__name__ == "Linear"]
    block = sum(p.numel() for p in model.blocks[0].parameters())
    return {"total": sum(p.numel() for p in model.parameters()), "largest_linear": max(linears), "block": block}


def init_world(torch, device: str) -> None:
    backend = "nccl" if device == "cuda" else "gloo"
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    torch.distributed.init_process_group(backend, rank=0, world_size=1)


def make_engine(torch, model, stack: str, extra: dict, size: dict, device: str):
    """(step function, counts) for one stack: plain torch with no optimizer state (bf16 weights and grads),
    DeepSpeed ZeRO-3 (bf16, AdamW), or FSDP2 (fp32 master weights, bf16 compute, fp32 reduce; AdamW)."""
    counts = count_params(model)
    if stack == "torch":
        model = model.to(device=device, dtype=torch.bfloat16)

        def step(ids):
            model(ids).backward()
            return lambda: [setattr(p, "grad", None) for p in model.parameters()]
        return step, counts
    if stack == "deepspeed":
        import deepspeed

        config = {"train_micro_batch_size_per_gpu": size["microbatch"], "gradient_accumulation_steps": 1,
                  "bf16": {"enabled": True}, "zero_allow_untested_optimizer": True, "steps_per_print": 10**9,
                  "zero_optimization": {"stage": 3, "contiguous_gradients": True, "overlap_comm": True,
                                        "stage3_prefetch_bucket_size": extra["prefetch_bucket"],
                                        "stage3_max_live_parameters": extra["max_live"],
                                        "reduce_bucket_size": extra["reduce_bucket"]}}
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)

        def step(ids):
            engine.backward(engine(ids))
            return engine.step
        return step, counts
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    model = model.to(device)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for block in model.blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(model, mp_policy=policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)

    def step(ids):
        model(ids).backward()

        def update():
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return update
    return step, counts


def run_case(name: str, size: dict, device: str) -> dict:
    import torch

    stack, attention, recompute, extra = CASES[name]
    init_world(torch, device)
    if device == "cuda":
        torch.cuda.set_device(0)
    torch.manual_seed(0)
    step, counts = make_engine(torch, build_model(torch, size, attention, recompute), stack, extra, size, device)
    cuda = device == "cuda"
    mem = (lambda: torch.cuda.memory_allocated()) if cuda else (lambda: 0)
    peak = (lambda: torch.cuda.max_memory_allocated()) if cuda else (lambda: 0)
    peak_reserved = (lambda: torch.cuda.max_memory_reserved()) if cuda else (lambda: 0)
    reset = torch.cuda.reset_peak_memory_stats if cuda else (lambda: None)
    row = {}
    for i in range(3):
        ids = torch.randint(0, size["vocab"], (size["microbatch"], size["seq"]), device=device)
        if cuda:
            torch.cuda.synchronize()
        reset()
        before = mem()
        update = step(ids)
        fwd_bwd_peak, after_backward, fwd_bwd_reserved = peak(), mem(), peak_reserved()
        reset()
        update()
        row = {"allocated_before_bytes": before, "fwd_bwd_peak_bytes": fwd_bwd_peak,
               "after_backward_bytes": after_backward, "step_peak_bytes": peak(), "allocated_after_bytes": mem(),
               "fwd_bwd_peak_reserved_bytes": fwd_bwd_reserved, "step_peak_reserved_bytes": peak_reserved()}
    torch.distributed.destroy_process_group()
    return {"case": name, "stack": stack, "attention": attention, "recompute": recompute, "ds": extra,
            "size": size, "params": counts, **row}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(device: str, quick: bool, names: list[str]) -> dict:
    """Each case in a fresh process; a case whose stack is missing (no DeepSpeed) or fails is recorded as such."""
    import torch

    results = []
    for name in names:
        env = {**os.environ, "MASTER_PORT": str(free_port())}
        cmd = [sys.executable, __file__, "--one", name, "--device", device] + (["--quick"] if quick else [])
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
        if done.returncode == 0 and lines:
            results.append(json.loads(lines[-1]))
        else:
            results.append({"case": name, "error": (done.stderr or done.stdout)[-1500:]})
        print(json.dumps(results[-1])[:300], flush=True)
    props = torch.cuda.get_device_properties(0) if device == "cuda" else None
    return {"device": props.name if props else "cpu", "total_memory_bytes": props.total_memory if props else None,
            "torch": torch.__version__, "cases": results}


def write_atomic(path: Path, text: str) -> None:
    """planner.io.atomic_write_text's job, without importing the planner (this script runs where only torch
    and, optionally, DeepSpeed are installed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", type=Path)
    parser.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a check of the code path)")
    parser.add_argument("--cases", nargs="*", default=list(CASES), choices=list(CASES))
    parser.add_argument("--one", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        wide = args.one.endswith("-wide") or args.one.endswith("-wide-small-buckets")
        size = (QUICK_WIDE if wide else QUICK) if args.quick else (WIDE if wide else FULL)
        print(json.dumps(run_case(args.one, size, args.device)), flush=True)
        return 0
    if args.output is None:
        parser.error("-o/--output is required")
    result = measure(args.device, args.quick, args.cases)
    write_atomic(args.output, json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
