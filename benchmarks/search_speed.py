"""Solver speed on four scales: prints, per case, the size of the space, what was evaluated and pruned, the wall
and CPU time and the plan found. Goal: each under 1 s of CPU on a 2-core machine (issue 22), over the full space
(no silent narrowing: configurations considered = evaluated and fitting + pruned, every pruned one counted under
its reason).

Each case is searched for each framework (default: megatron-core and torchtitan, the stacks with the largest
spaces: context parallelism, MoE folding, four schedules; `planner`, our executor's, is a subset of them).

Run: python benchmarks/search_speed.py [--json] [--case NAME ...] [--framework NAME ...]
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass

GOAL_S = 1.0  # CPU seconds per case (the wall time of a shared machine includes waiting for a core)


@dataclass(frozen=True)
class Case:
    name: str
    model: str
    topology: str
    gpus: int
    global_batch_size: int
    seq_len: int
    source: str


CASES = (
    Case("mt-nlg-530b", "mt-nlg-530b", "dgx-a100-80g", 4480, 1920, 2048,
         "Smith et al. 2022 (MT-NLG), 560 DGX A100 nodes, global batch 1920 x 2048"),
    Case("llama3-405b", "llama3-405b", "dgx-h100", 16384, 2048, 8192,
         "Llama 3 paper (Dubey et al. 2024) section 3.3: 16K H100, 16M tokens per batch at seq 8192"),
    Case("deepseek-v3", "deepseek-v3", "hgx-h800", 2048, 15360, 4096,
         "DeepSeek-V3 technical report: 2048 H800, batch 15360 x 4096"),
    Case("llama3-8b", "llama3-8b", "dgx-h100", 8, 64, 8192, "one DGX H100, 0.5M tokens per step"),
)


class TimedCostModel:
    """Forwards to a CostModel and adds up the CPU time spent inside it (to split search vs cost-model time)."""

    def __init__(self, inner):
        self._inner, self.cpu_s, self.calls = inner, 0.0, 0

    def __getattr__(self, name):
        target = getattr(self._inner, name)
        if not callable(target):
            return target

        def timed(*args, **kwargs):
            start = time.process_time()
            try:
                return target(*args, **kwargs)
            finally:
                self.cpu_s += time.process_time() - start
                self.calls += 1

        return timed


# What the search asks of the cost layer besides the CostModel's methods: free functions that take the model
# (planner.cost.bounds, planner.cost.p2p; issue 22 item 3). Timed like the methods, on the unwrapped model.
COST_FUNCTIONS = (("planner.cost.bounds", ("floor_costs", "per_sample_floor_s", "floor_time_sum_s", "held_static_bytes",
                                           "pp_comm_floors_s", "dp_exposed_s", "dp_split_rows", "dp_exposed_floors_s")),
                  ("planner.cost.p2p", ("pp_comm_s",)))


@contextmanager
def timed_cost_functions(cost: TimedCostModel):
    """Within the block, COST_FUNCTIONS add their CPU time to `cost` and receive the CostModel it wraps (the
    search looks them up on their module at each call); restored on the way out."""
    saved = []
    for module_name, names in COST_FUNCTIONS:
        module = importlib.import_module(module_name)
        for name in names:
            original = getattr(module, name)
            saved.append((module, name, original))

            def timed(model, *args, _original=original, **kwargs):
                start = time.process_time()
                try:
                    return _original(model._inner if isinstance(model, TimedCostModel) else model, *args, **kwargs)
                finally:
                    cost.cpu_s += time.process_time() - start
                    cost.calls += 1

            setattr(module, name, timed)
    try:
        yield
    finally:
        for module, name, original in saved:
            setattr(module, name, original)


def run_case(case: Case, framework: str) -> dict:
    from planner.api import build_request
    from planner.errors import BadInputError
    from planner.search.driver import make_cost_model, search

    try:
        request = build_request(model=case.model, topology=case.topology, gpus=case.gpus,
                                global_batch_size=case.global_batch_size, seq_len=case.seq_len, framework=framework)
    except BadInputError as exc:  # the stack cannot build the model (its profile's unsupported_models): no search
        return dict(case=case.name, framework=framework, gpus=case.gpus, considered=0, evaluated=0, pruned=0,
                    wall_s=0.0, cpu_s=0.0, cost_model_cpu_s=0.0, cost_model_calls=0, dp_calls=0, ilp_calls=0,
                    accounted=True, chosen=f"(refused: {str(exc).split(':')[0]})", step_time_s=None)
    start, cpu_start = time.perf_counter(), time.process_time()
    cost = TimedCostModel(make_cost_model(request))
    with timed_cost_functions(cost):
        result = search(request, cost=cost)
    wall_s, cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
    pruned = sum(result.pruned.values())
    row = dict(case=case.name, framework=framework, gpus=case.gpus, considered=result.considered, evaluated=result.evaluated,
               pruned=pruned, wall_s=round(wall_s, 3), cpu_s=round(cpu_s, 3),
               cost_model_cpu_s=round(cost.cpu_s, 3), cost_model_calls=cost.calls, dp_calls=result.counters.dp_calls,
               ilp_calls=result.counters.ilp_calls, accounted=pruned + len_fitting(result) == result.considered)
    if result.ranked:
        best = result.ranked[0]
        c = best.cand
        row.update(chosen=f"dp={c.dp} tp={c.tp} pp={c.pp} cp={c.cp} ep={c.ep} vpp={c.vpp} zero={c.zero_stage} "
                          f"mbs={c.microbatch_size} {c.schedule} {c.recompute}", step_time_s=round(best.ev.step_time_s, 4))
    else:
        row.update(chosen="(nothing fits)", step_time_s=None)
    return row


def len_fitting(result) -> int:
    """Evaluated configurations that fit (the rest of `evaluated` is counted in pruned['does_not_fit'])."""
    return result.evaluated - result.pruned.get("does_not_fit", 0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--case", action="append", help="only these cases")
    parser.add_argument("--framework", action="append", help="frameworks to plan for (default megatron-core, torchtitan)")
    args = parser.parse_args(argv)
    cases = [c for c in CASES if not args.case or c.name in args.case]
    rows = [run_case(case, framework) for case in cases for framework in args.framework or ("megatron-core", "torchtitan")]
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        header = (f"{'case':<13}{'framework':<14}{'gpus':>7}{'considered':>13}{'evaluated':>11}{'pruned':>13}{'wall s':>8}{'cpu s':>7}"
                  f"{'in cost':>8}  chosen -> step s")
        print(header)
        print("-" * len(header))
        for r in rows:
            flag = "" if r["cpu_s"] <= GOAL_S else f"  (over the {GOAL_S:g} s goal)"
            print(f"{r['case']:<13}{r['framework']:<14}{r['gpus']:>7}{r['considered']:>13,}{r['evaluated']:>11,}{r['pruned']:>13,}"
                  f"{r['wall_s']:>8.2f}{r['cpu_s']:>7.2f}{r['cost_model_cpu_s']:>8.2f}  {r['chosen']} -> {r['step_time_s']}{flag}")
        print("cpu s: CPU time of this process (the machine is shared; wall time includes waiting for a core);"
              " in cost: CPU seconds spent inside CostModel calls (layer_costs, evaluate, ...) and the bounds'"
              " functions of planner.cost.bounds and planner.cost.p2p")
    return 0 if all(r["accounted"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
