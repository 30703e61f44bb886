"""The cost model's memory formula against the trace of our executor's step (issue 20): per plan of the `planner`
stack and per pipeline rank, the formula's parts (params, grads, optimizer, activations, other) beside the traced
parts (planner.executor.memtrace, extended from shallow stages by planner.executor.memtrace_scale), and the peak
ratio traced / formula. A formula that prices the executor's code has every ratio near 1 and never above it by more
than a few percent (the search's first choice then fits by trace: planner.memory_trace.verify_plan).

The matrix: Llama-3 8B (seq 8192) and TinyLlama-1.1B (seq 2048) on dgx-h100; DDP, ZeRO-1/2/3; pp 2 and 4 under 1F1B,
GPipe, interleaved and zero-bubble at 4..32 micro-batches; recompute none / selective / full; tp 2. Each row is
`planner estimate --trace-memory` (planner.api.estimate(trace_memory=True)). Minutes on a loaded 2-core box.
benchmarks/results/executor_memory_vs_trace_before.txt is this report at 2a03908 (before the pipelining terms of
planner.cost.pipelining_memory and static_bytes.static_parts), where zero-bubble with full recompute traced 4.2x its
formula (now refused by the planner profile: split_backward_with_full_recompute).

    PYTHONPATH=$PWD python benchmarks/executor_memory_vs_trace.py [--quick] [-o benchmarks/results/executor_memory_vs_trace.txt]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner import api  # noqa: E402
from planner.errors import BadInputError  # noqa: E402
from planner.schemas.plan import Configuration, Parallelism  # noqa: E402

GiB = 2**30
GPUS = 8

# (model, seq_len, dp, tp, pp, zero, schedule, vpp, micro-batches, recompute)
MATRIX = [
    ("tinyllama-1.1b", 2048, 8, 1, 1, 0, "1f1b", 1, 4, "none"),
    ("tinyllama-1.1b", 2048, 8, 1, 1, 1, "1f1b", 1, 4, "none"),
    ("tinyllama-1.1b", 2048, 8, 1, 1, 2, "1f1b", 1, 4, "none"),
    ("tinyllama-1.1b", 2048, 8, 1, 1, 3, "1f1b", 1, 4, "full"),
    ("tinyllama-1.1b", 2048, 4, 1, 2, 1, "1f1b", 1, 8, "none"),
    ("tinyllama-1.1b", 2048, 4, 1, 2, 2, "1f1b", 1, 8, "selective"),
    ("tinyllama-1.1b", 2048, 4, 1, 2, 3, "gpipe", 1, 4, "none"),
    ("tinyllama-1.1b", 2048, 2, 1, 4, 0, "interleaved", 2, 8, "none"),
    ("tinyllama-1.1b", 2048, 4, 1, 2, 2, "zero-bubble", 1, 8, "none"),
    ("llama3-8b", 8192, 8, 1, 1, 3, "1f1b", 1, 4, "full"),
    ("llama3-8b", 8192, 4, 2, 1, 3, "1f1b", 1, 8, "selective"),
    ("llama3-8b", 8192, 4, 1, 2, 2, "1f1b", 1, 8, "full"),
    ("llama3-8b", 8192, 4, 1, 2, 3, "1f1b", 1, 16, "full"),
    ("llama3-8b", 8192, 4, 1, 2, 2, "zero-bubble", 1, 8, "full"),  # refused by the planner profile since (module doc)
    ("llama3-8b", 8192, 4, 1, 2, 2, "zero-bubble", 1, 8, "none"),
    ("llama3-8b", 8192, 4, 1, 2, 1, "zero-bubble", 1, 32, "none"),
    ("llama3-8b", 8192, 2, 1, 4, 1, "interleaved", 2, 16, "full"),
    ("llama3-8b", 8192, 2, 1, 4, 0, "gpipe", 1, 8, "full"),
    ("llama3-8b", 8192, 2, 1, 4, 3, "1f1b", 1, 32, "full"),
]
QUICK = [0, 4, 8, 11, 14, 15]


def row(model, seq, dp, tp, pp, zero, schedule, vpp, m, recompute):
    """(label, [(pp rank, traced parts, formula parts)]) of one configuration."""
    request = api.build_request(model=model, topology="dgx-h100", gpus=GPUS, global_batch_size=dp * m, seq_len=seq,
                                framework="planner")
    par = Parallelism(dp=dp, tp=tp, pp=pp, vpp=vpp, zero_stage=zero, sp=tp > 1)
    config = Configuration(parallelism=par, microbatch_size=1, schedule=schedule, recompute=recompute)
    label = f"{model} dp{dp} tp{tp} pp{pp} z{zero} {schedule} vpp{vpp} m{m} {recompute}"
    try:
        plan = api.estimate(request, config, trace_memory=True)
    except BadInputError as exc:  # the stack's profile refuses it (an exclusion)
        return label, [], f"refused: {exc}"
    formula = {s.stage: s for s in plan.memory.per_stage}
    out = []
    for rank in plan.memory.traced.ranks:
        f = formula[rank.pp_rank]
        traced = (rank.params_bytes, rank.grads_bytes, rank.optimizer_bytes, rank.activations_bytes,
                  rank.transient_bytes + rank.other_bytes, rank.peak_bytes)
        form = (f.params_bytes, f.grads_bytes, f.optimizer_bytes, f.activations_bytes, f.other_bytes, f.peak_bytes)
        out.append((rank.pp_rank, traced, form))
    return label, out, plan.memory.traced.note


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="six rows of the matrix")
    parser.add_argument("-o", "--output", help="also write the report here")
    args = parser.parse_args(argv)
    rows = [MATRIX[i] for i in QUICK] if args.quick else MATRIX
    lines = ["config | pp rank | traced params grads optimizer activations other peak | formula (same) | peak traced/formula (GiB)"]
    ratios = []
    start = time.monotonic()
    for spec in rows:
        label, ranks, note = row(*spec)
        if not ranks:
            lines.append(f"{label}: not traced ({note})")
            print(lines[-1], flush=True)
            continue
        for pp_rank, traced, form in ranks:
            ratio = traced[-1] / form[-1]
            ratios.append(ratio)
            lines.append(f"{label} | {pp_rank} | " + " ".join(f"{v / GiB:6.2f}" for v in traced) + " | "
                         + " ".join(f"{v / GiB:6.2f}" for v in form) + f" | {ratio:.3f}")
        print(lines[-1], flush=True)
    lines.append(f"{len(ratios)} ranks: traced/formula peak min {min(ratios):.3f}, max {max(ratios):.3f}; "
                 f"{time.monotonic() - start:.0f} s")
    text = "\n".join(lines) + "\n"
    print(lines[-1])
    if args.output:
        Path(args.output).write_text(f"$ PYTHONPATH=$PWD python benchmarks/executor_memory_vs_trace.py"
                                     f"{' --quick' if args.quick else ''}\n" + text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
