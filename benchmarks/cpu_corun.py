"""Co-run slowdown of this CPU: how much more CPU time one training step of the small model takes when every
core is busy with other ranks' steps (shared caches and DRAM bandwidth), the number behind the `cpu`
topology's `compute_slot_slowdown` (planner.cost.contention).

N processes (one intra-op thread each) start together, each times ITERS forward + backward steps of
profiles/specs/small-llama.yaml at batch 2 x 256 tokens by its process CPU clock (and the wall clock). The
slowdown at N is the mean CPU time per step over the N processes divided by the one-process CPU time. The
`cpu` topology ships the value at N = 4, the executor benchmark's rank count (4 ranks on this box's 2 cores).

Run: python benchmarks/cpu_corun.py [--procs 1,2,4] [--iters 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORKER = """
import json, sys, time, torch
torch.set_num_threads(1)
from planner.models import load_model
from planner.nn import Transformer
spec = load_model(sys.argv[1]); iters = int(sys.argv[2])
model = Transformer(spec); model.init_weights(0)
tokens = torch.randint(0, spec.vocab_size, (2, 256), generator=torch.Generator().manual_seed(0))
def step():
    model(tokens).float().mean().backward()
for _ in range(2):
    step()
cpu, wall = time.process_time(), time.perf_counter()
for _ in range(iters):
    step()
print(json.dumps({"cpu_s": (time.process_time() - cpu) / iters, "wall_s": (time.perf_counter() - wall) / iters}))
"""


def corun(procs: int, iters: int) -> list[dict]:
    """Start `procs` workers at once; their per-step CPU and wall seconds."""
    argv = [sys.executable, "-c", WORKER, str(ROOT / "profiles/specs/small-llama.yaml"), str(iters)]
    running = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(procs)]
    return [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in running]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--procs", default="1,2,4")
    parser.add_argument("--iters", type=int, default=8)
    args = parser.parse_args(argv)
    counts = [int(x) for x in args.procs.split(",")]
    base = None
    print(f"{'procs':>5} | {'cpu s/step':>10} {'wall s/step':>11} | {'slowdown':>8}")
    for n in counts:
        rows = corun(n, args.iters)
        cpu, wall = statistics.mean(r["cpu_s"] for r in rows), statistics.mean(r["wall_s"] for r in rows)
        base = cpu if base is None and n == 1 else base
        slowdown = cpu / base if base else float("nan")
        print(f"{n:>5} | {cpu:10.3f} {wall:11.3f} | {slowdown:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
