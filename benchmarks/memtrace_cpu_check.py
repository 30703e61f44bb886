"""The trace against the same executor step on real CPU tensors (what tests/unit/test_memtrace.py asserts within 2%),
printed per case: small plans (1-2 ranks of a 2-layer model), traced on fake tensors and run on real ones, both
counted by memtrace.LiveBytes, with the CPU allocator's sizes (target cpu) and with the CUDA contracts (target cuda);
pipeline plans rank by rank.

    PYTHONPATH=. python benchmarks/memtrace_cpu_check.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "unit"))


def main() -> int:
    from test_memtrace import CASES, PIPELINES, small_plan

    from planner.executor.memtrace import distinct_ranks, trace_rank

    print(f"{'case':<22} {'target':<6} {'fake MiB':>9} {'real MiB':>9} {'fake/real-1':>11}")
    for case, fields in CASES.items():
        plan = small_plan(**fields)
        for target in ("cpu", "cuda"):
            fake = trace_rank(plan, 0, target=target).peak_bytes
            real = trace_rank(plan, 0, target=target, fake=False).peak_bytes
            print(f"{case:<22} {target:<6} {fake / 2**20:9.2f} {real / 2**20:9.2f} {fake / real - 1:+11.4%}")
    for case, fields in PIPELINES.items():  # every pipeline rank, in pipeline order (the metadata a stage sends is kept)
        plan = small_plan(**fields)
        for target in ("cpu", "cuda"):
            fake_sent, real_sent = {}, {}
            for rank in distinct_ranks(plan):
                fake = trace_rank(plan, rank, target=target, sent=fake_sent).peak_bytes
                real = trace_rank(plan, rank, target=target, fake=False, sent=real_sent).peak_bytes
                name = f"{case} rank {rank}"
                print(f"{name:<22} {target:<6} {fake / 2**20:9.2f} {real / 2**20:9.2f} {fake / real - 1:+11.4%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
