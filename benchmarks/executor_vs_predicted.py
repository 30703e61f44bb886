"""Measured vs predicted step time of real executor runs on this machine (4 gloo processes, CPU, fp32).

For at least 8 different plans of the small Llama-shaped model (profiles/specs/small-llama.yaml; dp, tp, pp,
ZeRO stage, micro-batch size, recompute and schedule varied), `planner.api.estimate` predicts the step time
from the CPU compute profile (profiles/cpu-small.json, measured with `planner profile`) and the `cpu`
topology with the measured gloo calibration of this box (profiles/cpu-gloo-comm.json, 4 processes); `planner run` then trains each plan for a
few steps with torchrun and measures the median step time after warm-up. The planner's own first choice
(`planner.api.plan` with `runnable=True`) is run too.

Prints one row per plan (predicted, measured, error) and:
- the Spearman rank correlation of predicted vs measured step times (goal >= 0.8);
- the planner's first choice's measured time against the fastest measured plan (goal: within 15%).

Every number comes from this run: nothing is fitted to the measurements. The CPU is shared by the 4
processes (the `cpu` topology's compute_slots_per_node prices that, planner.cost.contention) and by whatever
else runs on the machine, which the model cannot know: each row records the 1-minute load average after it
(the 4 ranks alone make about 4), and rows measured under a higher load are slower than predicted. Usage:

    python benchmarks/executor_vs_predicted.py [--steps 6] [--json benchmarks/results/executor_vs_predicted.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from planner import api
from planner.executor.run import run_plan
from planner.io import atomic_write_text, canonical_json
from planner.launch_spec.options import RunOptions
from planner.schemas.plan import Configuration, LaunchPlan, Parallelism, SearchLimits

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "profiles/specs/small-llama.yaml"
PROFILE = ROOT / "profiles/cpu-small.json"
COMM_CALIBRATION = ROOT / "profiles/cpu-gloo-comm.json"
TOPOLOGY = "cpu"
GPUS, GLOBAL_BATCH, SEQ = 4, 8, 256
SPEARMAN_GOAL, FIRST_CHOICE_GOAL = 0.8, 0.15


@dataclass(frozen=True)
class Variant:
    name: str
    config: Configuration


def par(**kw) -> Parallelism:
    return Parallelism(**kw)


VARIANTS = (
    Variant("dp4 mb1", Configuration(parallelism=par(dp=4, tp=1, pp=1), microbatch_size=1)),
    Variant("dp4 mb2", Configuration(parallelism=par(dp=4, tp=1, pp=1), microbatch_size=2)),
    Variant("dp4 zero3 mb2", Configuration(parallelism=par(dp=4, tp=1, pp=1, zero_stage=3), microbatch_size=2)),
    Variant("dp4 zero1 mb1 selective", Configuration(parallelism=par(dp=4, tp=1, pp=1, zero_stage=1), microbatch_size=1, recompute="selective")),
    Variant("dp2 tp2 mb1", Configuration(parallelism=par(dp=2, tp=2, pp=1), microbatch_size=1)),
    Variant("dp2 tp2 sp zero2 mb2", Configuration(parallelism=par(dp=2, tp=2, pp=1, sp=True, zero_stage=2), microbatch_size=2)),
    Variant("tp4 sp mb8", Configuration(parallelism=par(dp=1, tp=4, pp=1, sp=True), microbatch_size=8)),
    Variant("pp4 1f1b mb1", Configuration(parallelism=par(dp=1, tp=1, pp=4), microbatch_size=1, schedule="1f1b")),
    Variant("dp2 pp2 1f1b mb2 full", Configuration(parallelism=par(dp=2, tp=1, pp=2), microbatch_size=2, recompute="full")),
    Variant("tp2 pp2 interleaved mb1", Configuration(parallelism=par(dp=1, tp=2, pp=2, vpp=2), microbatch_size=1, schedule="interleaved")),
    # PipeDream-2BW (planner.executor.twobw; m >= pp): no flush, so its steady steps have no bubble
    Variant("pp4 2bw mb1", Configuration(parallelism=par(dp=1, tp=1, pp=4), microbatch_size=1, schedule="2bw")),
    Variant("dp2 pp2 2bw mb2", Configuration(parallelism=par(dp=2, tp=1, pp=2), microbatch_size=2, schedule="2bw")),
    # no CP variant: the executor refuses cp > 1 on CPU (planner/data/frameworks/planner.yaml, context_parallel.source)
)


def topology():
    """The `cpu` topology with its intra-node fabric replaced by the measured 4-process gloo fits, each
    collective priced at its own rates (planner.profiling.calibration.calibrated_topology on
    profiles/cpu-gloo-comm.json)."""
    from planner.profiling.calibration import calibrated_topology, load_calibration

    base = api.load_topology(TOPOLOGY).model_copy(update={"comm_calibration": str(COMM_CALIBRATION.relative_to(ROOT))})
    return calibrated_topology(base, load_calibration(COMM_CALIBRATION))


def request(search: SearchLimits | None = None):
    return api.build_request(model=str(MODEL), topology=topology(), gpus=GPUS, global_batch_size=GLOBAL_BATCH, seq_len=SEQ,
                             precision="fp32", profile=str(PROFILE), search=search)


def describe(plan: LaunchPlan) -> str:
    p, b = plan.parallelism, plan.batch
    rec = plan.stages[0].recompute.mode
    return (f"dp{p.dp} tp{p.tp} pp{p.pp}" + (f" vpp{p.vpp}" if p.vpp > 1 else "") + (" sp" if p.sp else "")
            + f" zero{p.zero_stage} mb{b.microbatch_size} {plan.schedule} {rec}")


def same_config(a: LaunchPlan, b: LaunchPlan) -> bool:
    return (a.parallelism == b.parallelism and a.batch == b.batch and a.schedule == b.schedule
            and [s.recompute for s in a.stages] == [s.recompute for s in b.stages])


def spearman(xs: list[float], ys: list[float]) -> float:
    """Spearman's rho: Pearson correlation of the ranks (average ranks for ties); numpy only, no scipy."""
    import numpy as np

    def ranks(values: list[float]) -> np.ndarray:
        v = np.asarray(values, dtype=np.float64)
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(1, len(v) + 1)
        for value in np.unique(v):  # ties share their average rank
            r[v == value] = r[v == value].mean()
        return r

    return float(np.corrcoef(ranks(xs), ranks(ys))[0, 1])


def measure(plan: LaunchPlan, folder: Path, steps: int) -> dict:
    path = folder / "plan.json"
    atomic_write_text(path, canonical_json(plan))
    start = time.perf_counter()
    report = run_plan(path, options=RunOptions(steps=steps, timeout_s=300), warmup_steps=1)
    return {"measured_step_time_s": report.step_time_s, "losses": list(report.losses), "wall_s": time.perf_counter() - start,
            "peak_rss_bytes": max(m.peak_bytes for m in report.memory)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per plan (the first is warm-up)")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and the summary here")
    args = parser.parse_args(argv)

    first = api.plan(request(SearchLimits(runnable=True, time_limit_s=60)))
    plans = [(v.name, api.estimate(request(), v.config)) for v in VARIANTS]
    first_name = next((name for name, p in plans if same_config(p, first)), None)
    if first_name is None:
        first_name = "planner first choice"
        plans.append((first_name, first))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, plan in plans:
            row = {"name": name, "config": describe(plan), "predicted_step_time_s": plan.prediction.step_time_s,
                   **measure(plan, Path(tmp), args.steps), "load_average_1min": os.getloadavg()[0]}
            row["error"] = (row["predicted_step_time_s"] - row["measured_step_time_s"]) / row["measured_step_time_s"]
            rows.append(row)
            print(f"{name:28s} {row['config']:42s} predicted {row['predicted_step_time_s']:7.3f} s  measured "
                  f"{row['measured_step_time_s']:7.3f} s  error {row['error']:+7.1%}  load {row['load_average_1min']:.1f}", flush=True)
    rho = spearman([r["predicted_step_time_s"] for r in rows], [r["measured_step_time_s"] for r in rows])
    fastest = min(rows, key=lambda r: r["measured_step_time_s"])
    chosen = next(r for r in rows if r["name"] == first_name)
    gap = chosen["measured_step_time_s"] / fastest["measured_step_time_s"] - 1
    print(f"\nSpearman rank correlation (predicted vs measured, {len(rows)} plans): {rho:.3f} (goal >= {SPEARMAN_GOAL})")
    print(f"planner's first choice: {first_name} ({chosen['config']}) measured {chosen['measured_step_time_s']:.3f} s; "
          f"fastest measured: {fastest['name']} {fastest['measured_step_time_s']:.3f} s; gap {gap:+.1%} (goal <= {FIRST_CHOICE_GOAL:.0%})")
    summary = {"spearman": rho, "first_choice": first_name, "first_choice_gap": gap, "fastest": fastest["name"],
               "goals": {"spearman": SPEARMAN_GOAL, "first_choice_gap": FIRST_CHOICE_GOAL},
               "setup": {"model": str(MODEL.relative_to(ROOT)), "profile": str(PROFILE.relative_to(ROOT)), "topology": TOPOLOGY, "comm_calibration": str(COMM_CALIBRATION.relative_to(ROOT)),
                         "gpus": GPUS, "global_batch_size": GLOBAL_BATCH, "seq_len": SEQ, "steps": args.steps,
                         "cpu_count": os.cpu_count(), "load_average_at_end": list(os.getloadavg())}}
    if args.json is not None:
        atomic_write_text(args.json, canonical_json({"rows": rows, "summary": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
