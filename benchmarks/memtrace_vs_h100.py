"""The traced peak (planner.executor.memtrace) against the executor's measured CUDA peak on one H100
(validation/h100_executor_runs.json), row by row, the OOM row included.

    PYTHONPATH=. python benchmarks/memtrace_vs_h100.py

Each row's plan is made as the row says (`planner estimate` with its model, batch, micro-batch, recompute, dp=tp=pp=1,
zero 0 on dgx-h100 x 1) and its step traced on fake CPU tensors with the CUDA contracts (memtrace's module docstring).
Reading rule: every row was measured at commit c162dfb, where the executor ran `bf16` as it runs `amp-bf16` (fp32
parameters + bf16 autocast: runtime.py set autocast_dtype for any non-fp32 precision, parallelize.py mapped both to one
FSDP2 policy; `git show c162dfb:planner/executor/runtime.py`), so each row is traced as amp-bf16. The trace runs the
executor's code as it is now, which no longer repeats GQA's k and v before SDPA (planner/nn/model.py AttentionCore,
enable_gqa) and steps AdamW fused: on the GQA rows it traces the (c*T*(a - kv)*d per layer) repeated copies c162dfb
saved less, about 2-3% under those rows' measured peaks (benchmarks/executor_h100_accuracy.py's GQA ablation prices
the same term on the same rows). Prints traced,
measured (CUDA max allocated) and the formula's peak in GiB; for the OOM row, whether the trace exceeds the capacity,
and for the row the search chose, what `planner plan --trace-memory` picks for that request instead. Each row is also
traced as `planner plan` verifies plans by default (planner.executor.memtrace_scale: 2 and 3 layers, extended to the
model's depth): its peak and seconds. MoE rows are traced under balanced routing (planner.executor.moe_contract), the
measured runs routed as their router did.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "validation" / "h100_executor_runs.json"
GiB = 2**30
RECIPE_AT_C162DFB = {"bf16": "amp-bf16", "amp-bf16": "amp-bf16", "fp32": "fp32"}


def row_plan(row: dict):
    from planner import api
    from planner.schemas.plan import Configuration, Parallelism

    model = row["preset"]
    with tempfile.TemporaryDirectory() as folder:
        if row.get("hf_config_json"):
            path = Path(folder) / "config.json"
            path.write_text(json.dumps(row["hf_config_json"]))
            model = api.load_model(str(path))
        request = api.build_request(model=model, topology=row["topology"], gpus=row["gpus"], seq_len=row["seq_len"],
                                    global_batch_size=row["global_batch_size"], precision=RECIPE_AT_C162DFB[row["precision"]])
    config = Configuration(parallelism=Parallelism(dp=1, tp=1, pp=1, zero_stage=row["zero"]),
                           microbatch_size=row["microbatch_size"], recompute=row["recompute"])
    return api.estimate(request, config)


def main() -> int:
    from planner.executor.memtrace import trace_rank
    from planner.executor.memtrace_scale import trace_plan_scaled

    rows = json.loads(ROWS.read_text())
    print(f"{'row':<12} {'status':<6} {'traced':>8} {'measured':>9} {'error':>7} {'formula':>8} {'capacity':>8}  trace s"
          "  extended GiB (s)")
    for row in rows:
        plan = row_plan(row)
        started = time.perf_counter()
        try:
            traced = trace_rank(plan, 0)
        except Exception as exc:  # a step the fake tensors cannot follow (MoE routing's data-dependent shapes)
            print(f"{row['name']:<12} {row['status']:<6} not traced: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
            continue
        seconds = time.perf_counter() - started
        started = time.perf_counter()
        extended = trace_plan_scaled(plan)[0]
        fast = f"  {extended.peak_bytes / GiB:.2f} ({time.perf_counter() - started:.1f})"
        measured = row.get("peak_bytes")
        capacity = plan.memory.capacity_bytes
        error = f"{traced.peak_bytes / measured - 1:+.1%}" if measured else ("> cap" if traced.peak_bytes > capacity else "FITS?")
        print(f"{row['name']:<12} {row['status']:<6} {traced.peak_bytes / GiB:8.2f} "
              f"{(measured or 0) / GiB:9.2f} {error:>7} {plan.memory.peak_bytes / GiB:8.2f} {capacity / GiB:8.2f}  {seconds:.1f}"
              f"{fast}")
        print("  traced parts (GiB): " + ", ".join(f"{k} {v / GiB:.2f}" for k, v in traced.parts.items()))
        if row.get("chosen_by_plan"):
            replan(plan, row["precision"])
    return 0


def replan(plan, precision: str) -> None:
    """`planner plan --trace-memory` for the request of a row the search chose, as the row asked it (its precision: the
    trace follows what today's executor runs for it): the plan it picks and its traced peak."""
    from planner import api

    started = time.perf_counter()
    request = plan.request.model_copy(update={"search": None, "precision": precision})
    chosen = api.plan(request, trace_memory=True)
    par, batch, traced = chosen.parallelism, chosen.batch, chosen.memory.traced
    print(f"  planner plan --trace-memory ({time.perf_counter() - started:.0f} s): dp={par.dp} tp={par.tp} pp={par.pp} "
          f"zero={par.zero_stage} micro-batch {batch.microbatch_size} recompute {chosen.stages[0].recompute.mode}: "
          f"traced {traced.peak_bytes / GiB:.2f} GiB, fits={traced.fits}")
    print("  " + next((n for n in chosen.notes if "replaced by the next plan" in n), "the search's first choice fits by trace"))


if __name__ == "__main__":
    sys.exit(main())
