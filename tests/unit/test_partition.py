"""The stage-partition DP against brute force on seeded random small instances, and its hand-checked cases."""

import numpy as np
import pytest

from planner.frameworks_split import balanced_split
from planner.search.brute import brute_partition, compositions
from planner.search.partition import (
    StageProblem,
    backtrack,
    describe,
    partition,
    solve_tables,
)


def random_problem(rng: np.random.Generator, *, tight: bool) -> StageProblem:
    n = int(rng.integers(2, 9))
    stages = int(rng.integers(1, min(n, 4) + 1))
    time_s = rng.uniform(0.5, 2.0, n)
    static = rng.uniform(1.0, 3.0, n)
    act = rng.uniform(0.5, 2.0, n)
    inflight = [float(stages - s) for s in range(stages)]  # 1F1B
    other = list(rng.uniform(0.0, 1.0, stages))
    total = float(np.sum(static) + stages * np.sum(act))
    capacity = total / stages * (rng.uniform(0.6, 1.2) if tight else 10.0)
    return StageProblem(
        time_s=time_s, static_bytes=static, activation_bytes=act, inflight=inflight, other_bytes=other,
        capacity_bytes=capacity, embed_time_s=float(rng.uniform(0, 1)), embed_static_bytes=float(rng.uniform(0, 2)),
        embed_activation_bytes=float(rng.uniform(0, 1)), head_time_s=float(rng.uniform(0, 3)),
        head_static_bytes=float(rng.uniform(0, 2)), head_activation_bytes=float(rng.uniform(0, 2)),
    )


@pytest.mark.parametrize("seed", range(60))
def test_dp_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    problem = random_problem(rng, tight=seed % 2 == 0)
    reference = brute_partition(problem)
    result = partition(problem)
    if not np.isfinite(reference):
        assert result is None
        return
    assert result is not None
    assert result.bottleneck_s == pytest.approx(reference, rel=1e-12)
    assert sum(result.layers_per_stage) == problem.num_layers
    assert all(c >= 1 for c in result.layers_per_stage)
    assert all(m <= problem.capacity_bytes for m in result.stage_memory_bytes)


def test_uniform_layers_split_evenly_when_ends_are_free():
    problem = StageProblem(
        time_s=np.ones(8), static_bytes=np.ones(8), activation_bytes=np.zeros(8),
        inflight=[1, 1, 1, 1], other_bytes=[0, 0, 0, 0], capacity_bytes=100.0,
    )
    assert partition(problem).layers_per_stage == (2, 2, 2, 2)


def test_heavy_head_moves_layers_off_the_last_stage():
    # 8 unit layers on 2 stages, the LM head costs 2 layers: best is 5 + (3 + head) = bottleneck 5
    problem = StageProblem(
        time_s=np.ones(8), static_bytes=np.zeros(8), activation_bytes=np.zeros(8),
        inflight=[2, 1], other_bytes=[0, 0], capacity_bytes=1.0, head_time_s=2.0,
    )
    result = partition(problem)
    assert result.layers_per_stage == (5, 3)
    assert result.bottleneck_s == pytest.approx(5.0)


def test_memory_of_early_stage_limits_its_layers():
    # 1F1B: stage 0 holds 2 micro-batches of activations, stage 1 one; capacity 6 -> stage 0 fits 3 layers
    problem = StageProblem(
        time_s=np.ones(8), static_bytes=np.zeros(8), activation_bytes=np.ones(8),
        inflight=[2, 1], other_bytes=[0, 0], capacity_bytes=6.0,
    )
    result = partition(problem)
    assert result.layers_per_stage == (3, 5)
    assert result.stage_memory_bytes == (6.0, 5.0)


def test_nothing_fits_returns_none():
    problem = StageProblem(
        time_s=np.ones(4), static_bytes=np.full(4, 10.0), activation_bytes=np.zeros(4),
        inflight=[1, 1], other_bytes=[0, 0], capacity_bytes=15.0,
    )
    assert partition(problem) is None


def test_more_stages_than_layers_is_infeasible():
    problem = StageProblem(
        time_s=np.ones(2), static_bytes=np.zeros(2), activation_bytes=np.zeros(2),
        inflight=[1, 1, 1], other_bytes=[0, 0, 0], capacity_bytes=1.0,
    )
    assert partition(problem) is None


def test_backtrack_is_separate_and_consistent():
    rng = np.random.default_rng(7)
    problem = random_problem(rng, tight=False)
    best, choice = solve_tables(problem)
    counts = backtrack(choice, problem.num_layers)
    assert describe(problem, counts).bottleneck_s == pytest.approx(best[-1][problem.num_layers])


def test_compositions_and_balanced_split():
    assert sorted(compositions(4, 2)) == [(1, 3), (2, 2), (3, 1)]
    assert balanced_split(10, 4) == (2, 3, 3, 2)
    assert sum(balanced_split(126, 16)) == 126
