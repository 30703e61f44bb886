"""What the gradient copies of each accumulation path's optimizer (planner.cost.grad_accumulation.held_bytes) change
in the predicted peak of the published ZeRO-0/1 runs of the stacks that record them, against the recipe's 4-byte
fp32 main gradients (CostOptions.grad_accum_memory off, the ablation): GiB of the worst pipeline rank.

    python benchmarks/published_grad_memory.py

Each run at the settings accuracy.py evaluates it with (its published ones, the rest by the conversion's rules).
Rows whose peak moves by less than 0.25 GiB are left out.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_cases as C  # noqa: E402
import published_runs as P  # noqa: E402

GiB = 2**30


def rows(path: Path = C.RUNS_FILE) -> list[str]:
    out = []
    for run in C.read_runs(path):
        if P.skip_reason(run):
            continue
        case = C.build_case(run)
        if case is None or case.stack not in ("deepspeed", "megatron-lm"):
            continue
        cand, ev = C.choose(case)
        if cand is None or cand.zero_stage > 1:
            continue
        off = dataclasses.replace(case, overrides={**case.overrides, "grad_accum_memory": False})
        recipe = C.evaluate(C.cost_model(off, None), off, cand)
        if abs(ev.peak_bytes - recipe.peak_bytes) >= GiB / 4:
            out.append(f"{run['id']:28s} {case.stack:10s} zero {cand.zero_stage} pp {cand.pp:2d}  "
                       f"{ev.peak_bytes / GiB:6.1f} {recipe.peak_bytes / GiB:6.1f} {ev.capacity_bytes / GiB:6.1f}")
    return out


def main() -> int:
    print(f"{'run':28s} {'stack':10s} {'settings':11s}  {'peak':>6s} {'4 B':>6s} {'cap':>6s}")
    print("\n".join(rows()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
