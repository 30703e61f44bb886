"""What the practice rule (planner.search.practice) does on common requests: per request and framework, the plan
chosen, the fastest plan when another was chosen, how much slower the chosen one is predicted, the ranking band it
had to stay within, and what the fastest one leaves of the stack's practice. Also the extra wall time the second
search (over the practice, pruned at the band) costs.

Run: python benchmarks/practice_choices.py [--framework NAME ...]
"""

from __future__ import annotations

import argparse
import sys
import time

from planner.api import build_request, plan
from planner.schemas.plan import SearchLimits
from planner.search.outcome import describe

REQUESTS = (
    ("llama3-8b", "dgx-h100", 8),
    ("llama3-8b", "dgx-a100-40g", 16),
    ("llama3-70b", "dgx-h100", 32),
    ("llama3-70b", "dgx-a100-80g", 64),
    ("mixtral-8x7b", "dgx-h100", 32),
    ("llama3-405b", "dgx-h100", 256),
)


def one(model: str, topology: str, gpus: int, framework: str) -> dict:
    request = build_request(model=model, topology=topology, gpus=gpus, framework=framework, search=SearchLimits())
    start = time.perf_counter()
    chosen = plan(request)
    with_rule = time.perf_counter() - start
    start = time.perf_counter()
    fastest = plan(request.model_copy(update={"search": SearchLimits(prefer_practice=False)}))
    without = time.perf_counter() - start
    note = next((n for n in chosen.notes if n.startswith("practice (")), "no stated practice")
    step, best = chosen.prediction.step_time_s, fastest.prediction.step_time_s
    return dict(request=f"{model} {gpus}x{topology}", framework=framework, chosen=_plan_text(chosen), step_s=step,
                slower=step / best - 1, fastest=_plan_text(fastest) if step != best else "-",
                extra_s=with_rule - without, note=note)


def _plan_text(p) -> str:
    par = p.parallelism
    return describe(type("C", (), dict(dp=par.dp, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep, vpp=par.vpp, sp=par.sp,
                                       zero_stage=par.zero_stage, microbatch_size=p.batch.microbatch_size,
                                       schedule=p.schedule, recompute=p.stages[0].recompute.mode,
                                       tp_overlap=par.tp_overlap)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--framework", action="append", help="default: megatron-core and torchtitan")
    args = parser.parse_args(argv)
    frameworks = args.framework or ["megatron-core", "torchtitan"]
    print(f"{'request':28} {'framework':14} {'step s':>9} {'vs fastest':>10} {'extra s':>8}  chosen  [fastest passed over]")
    for framework in frameworks:
        for model, topology, gpus in REQUESTS:
            row = one(model, topology, gpus, framework)
            print(f"{row['request']:28} {row['framework']:14} {row['step_s']:9.3f} {row['slower']:+10.1%} "
                  f"{row['extra_s']:8.2f}  {row['chosen']}" + (f"  [{row['fastest']}]" if row["fastest"] != "-" else ""))
            print(f"{'':28} {row['note'][:220]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
