"""The whole outcome of the search on a fixed set of requests, as JSON, to compare two versions of the planner
byte for byte (a refactor of the search or the cost model must not move it):

    python benchmarks/search_snapshot.py before.json     # at the old commit
    python benchmarks/search_snapshot.py after.json      # at the new one
    cmp before.json after.json

Per request: the ranked plans (rank key, step time, peak bytes, stage split, partial recompute), every pruned
count by reason, configurations considered and evaluated, the closest infeasible plan, the memory floor, the
solver's DP/ILP/evaluation counters; or the one-line refusal. The requests: every case of search_speed.py for
each stack that builds its model, a grid of models x stacks at 8-128 GPUs, and the same with every schedule
allowed (2BW with --allow-stale-weights, torch's interleaved zero bubble, ZB-V, DualPipeV) including
tests/data/frameworks/everything.yaml (every capability). About a minute on one core.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_speed import CASES  # noqa: E402

from planner.api import build_request  # noqa: E402
from planner.schemas.plan import SearchLimits  # noqa: E402
from planner.search.driver import search  # noqa: E402

EVERYTHING = str(Path(__file__).resolve().parents[1] / "tests" / "data" / "frameworks" / "everything.yaml")
STACKS = ("megatron-core", "torchtitan", "planner", "deepspeed", "megatron-lm")
WIDE = SearchLimits(allow_stale_weights=True, schedules=("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble",
                                                         "interleaved-zero-bubble", "zbv", "dualpipev"))


def requests() -> list[tuple[str, dict]]:
    out = []
    for case in CASES:
        for stack in STACKS if case.name != "mt-nlg-530b" else ("megatron-core", "deepspeed"):
            out.append((f"{case.name}/{stack}", dict(model=case.model, topology=case.topology, gpus=case.gpus,
                                                     global_batch_size=case.global_batch_size, seq_len=case.seq_len,
                                                     framework=stack)))
    for model, gpus, batch in (("mixtral-8x7b", 16, 256), ("llama3-70b", 64, 512), ("tinyllama-1.1b", 8, 64),
                               ("mixtral-8x22b", 64, 512), ("gpt3-175b", 128, 1536)):
        for stack in STACKS[:4]:
            out.append((f"{model}/{gpus}/{stack}", dict(model=model, topology="dgx-h100", gpus=gpus,
                                                        global_batch_size=batch, framework=stack)))
    for model, gpus, batch, topology in (("llama3-70b", 64, 512, "dgx-h100"), ("mixtral-8x7b", 32, 256, "dgx-h100"),
                                         ("deepseek-v3", 256, 1024, "hgx-h800"), ("gpt3-175b", 128, 1536, "dgx-a100-80g")):
        for stack in (*STACKS, EVERYTHING):
            out.append((f"wide/{model}/{gpus}/{Path(stack).stem}", dict(model=model, topology=topology, gpus=gpus,
                                                                        global_batch_size=batch, framework=stack,
                                                                        search=WIDE)))
    return out


def outcome(fields: dict):
    try:
        result = search(build_request(**fields))
    except Exception as exc:  # noqa: BLE001 - a refusal is part of the outcome
        return f"{type(exc).__name__}: {exc}"
    return dict(ranked=[[repr(s.key), s.ev.step_time_s, s.ev.peak_bytes, s.stage_layers, s.full_recompute_layers]
                        for s in result.ranked],
                pruned=dict(sorted(result.pruned.items())), considered=result.considered, evaluated=result.evaluated,
                closest=repr(result.closest.key) if result.closest else None, floor=result.memory_floor,
                counters=[result.counters.dp_calls, result.counters.ilp_calls, result.counters.evaluations])


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    found = {name: outcome(fields) for name, fields in requests()}
    Path(argv[0]).write_text(json.dumps(found, indent=1, default=str) + "\n", encoding="utf-8")
    print(f"{len(found)} requests -> {argv[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
