"""Uneven pipeline stages in the search: the interleaved refinement (planner.search.refine_uneven) against brute
force over every split the stack spells, the stage-partition DP with end stages that hold no decoder layer against
brute force, and the accuracy conversion of a published run whose layers do not divide over pp x vpp."""

from __future__ import annotations

import contextlib
import itertools

import pytest

from planner import api
from planner.frameworks import load_framework
from planner.frameworks_split import SplitError, balanced_split, megatron_split

MEGATRON = load_framework("megatron-core")

# ---- the search's interleaved refinement vs brute force ----------------------------------------------------

def test_refine_interleaved_matches_brute_force_over_every_spelled_split():
    """Every split Megatron spells for pp 4 x vpp 2 on a small model (equal, embedding/loss as layers, every
    first/last pair its rule accepts), evaluated by the cost model: the refinement's choice is the fastest."""
    from types import SimpleNamespace

    from planner.cost.model import CostModel
    from planner.cost.types import Candidate
    from planner.search.outcome import Scored, rank_key
    from planner.search.refine_uneven import refine_interleaved

    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=2048,
                                framework="megatron-core")
    cost = CostModel(request)
    cand = Candidate(dp=2, tp=1, pp=4, cp=1, ep=1, sp=False, vpp=2, zero_stage=1, schedule="interleaved", recompute="none",
                     microbatch_size=1, num_microbatches=32)
    ev = cost.evaluate(cand)
    state = SimpleNamespace(opts=SimpleNamespace(profile=MEGATRON), request=request, cost=cost,
                            counters=SimpleNamespace(evaluations=0))
    best = refine_interleaved(state, Scored(rank_key(cand, ev), cand, ev))
    n, every = 22, {balanced_split(22, 8)}
    for kwargs in [dict(embedding=True, loss=True), dict(embedding=True), dict(loss=True)]:
        with pytest.raises(SplitError) if (22 + len(kwargs)) % 8 else contextlib.nullcontext():
            every.add(megatron_split(n, 4, 2, **kwargs))
    for first, last in itertools.product(range(2, n, 2), repeat=2):
        try:
            every.add(megatron_split(n, 4, 2, first=first, last=last))
        except SplitError:
            continue
    times = {counts: cost.evaluate(cand, stage_layers=counts) for counts in every}
    fastest = min(t.step_time_s for t in times.values() if t.fits)
    assert best.ev.step_time_s == pytest.approx(fastest)
    assert len(every) > 3 and state.counters.evaluations > 0


# ---- the accuracy conversion of published runs -------------------------------------------------------------

def test_published_run_with_uneven_interleaved_stages_is_evaluated():
    """A run published at pp 8 x vpp 8 on 126 layers (NeMo's Llama-3.1 405B recipe shape, built here from a visible
    Megatron run's record) gets its published vpp, judged by the stack's split rule, not dropped by
    num_layers % (pp*vpp)."""
    import copy
    import importlib.util
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("accuracy_bench", root / "benchmarks" / "accuracy.py")
    bench = importlib.util.module_from_spec(spec)
    sys.modules["accuracy_bench"] = bench
    spec.loader.exec_module(bench)
    runs = json.loads((root / "validation" / "published_runs.json").read_text())
    run = copy.deepcopy(next(r for r in runs if r["id"] == "korthikanti2022_175B_selective_plus_sp"))
    run["model"].update(num_layers=126, hidden=16384, ffn_hidden=53248, num_heads=128, num_kv_heads=8, vocab=128256)
    run["parallel"].update(num_gpus=128, dp=2)
    run["training"].update(virtual_pipeline_stages=8, pipeline_schedule="interleaved 1F1B, 8 interleaving stages")
    case = bench.build_case(run)
    assert case.candidates and all(c.vpp == 8 and c.pp == 8 for c in case.candidates)
    cand, ev = bench.choose(case)
    assert cand is not None and ev.stage_layers == (1,) + (2,) * 62 + (1,)


# ---- the stage-partition DP with end stages that may hold no decoder layer -----------------------------------

@pytest.mark.parametrize("seed", range(40))
def test_dp_with_empty_ends_matches_brute_force(seed):
    """Stacks that run an end stage holding only the embedding or only the head (empty_chunks): the DP may leave the
    first/last stage without decoder layers; brute force over every such split agrees, and with a heavy head (a
    large vocabulary) the empty end is what both pick on some instances."""
    import dataclasses

    import numpy as np
    from test_partition import random_problem

    from planner.search.brute import brute_partition, compositions
    from planner.search.partition import partition

    rng = np.random.default_rng(1000 + seed)
    base = random_problem(rng, tight=seed % 2 == 0)
    heavy = float(np.sum(base.time_s)) / max(base.num_stages - 1, 1) if seed % 3 == 0 else base.head_time_s
    problem = dataclasses.replace(base, empty_ends=True, head_time_s=heavy)
    reference, result = brute_partition(problem), partition(problem)
    if not np.isfinite(reference):
        assert result is None
        return
    assert result is not None and result.bottleneck_s == pytest.approx(reference, rel=1e-12)
    assert sum(result.layers_per_stage) == problem.num_layers and min(result.layers_per_stage[1:-1], default=1) >= 1
    strict = dataclasses.replace(problem, empty_ends=False)
    assert result.bottleneck_s <= brute_partition(strict) + 1e-12  # more splits, never worse
    assert all(min(c[1:-1], default=1) >= 1 for c in compositions(problem.num_layers, problem.num_stages, True))


def test_dp_leaves_the_last_stage_only_the_head_when_it_is_heavy():
    import numpy as np

    from planner.search.partition import StageProblem, partition

    problem = StageProblem(time_s=np.ones(6), static_bytes=np.zeros(6), activation_bytes=np.zeros(6), inflight=[1.0] * 4,
                           other_bytes=[0.0] * 4, capacity_bytes=1.0, head_time_s=2.0, empty_ends=True)
    assert partition(problem).layers_per_stage == (2, 2, 2, 0) and partition(problem).bottleneck_s == 2.0
    strict = StageProblem(**{**problem.__dict__, "empty_ends": False})
    assert partition(strict).bottleneck_s == 3.0  # the head's stage must hold a layer
