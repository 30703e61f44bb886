"""The recompute ILP (A) and the joint assignment ILP (B) against brute force on seeded random small instances."""

import numpy as np
import pytest

from planner.errors import InfeasibleError
from planner.search.brute import brute_assignment, brute_recompute
from planner.search.ilp import RecomputeProblem, solve_assignment, solve_recompute
from planner.search.partition import StageProblem, partition


def random_recompute(rng: np.random.Generator) -> RecomputeProblem:
    n = int(rng.integers(1, 8))
    act = rng.uniform(1.0, 4.0, n)
    act_full = act * rng.uniform(0.05, 0.3, n)
    inflight = float(rng.integers(1, 4))
    base = float(rng.uniform(0, 5))
    full = base + inflight * float(np.sum(act))
    low = base + inflight * float(np.sum(act_full))
    capacity = low + (full - low) * float(rng.uniform(-0.1, 1.05))
    return RecomputeProblem(rng.uniform(0.1, 1.0, n), act, act_full, base, inflight, capacity)


@pytest.mark.parametrize("seed", range(25))
def test_recompute_ilp_matches_brute_force(seed):
    problem = random_recompute(np.random.default_rng(seed))
    reference = brute_recompute(problem)
    if not np.isfinite(reference):
        with pytest.raises(InfeasibleError, match=r"\(A.1\) memory"):
            solve_recompute(problem, time_limit_s=5)
        return
    choice = solve_recompute(problem, time_limit_s=5)
    assert choice.extra_time_s == pytest.approx(reference, rel=1e-6, abs=1e-9)
    assert choice.memory_bytes <= problem.capacity_bytes * (1 + 1e-9)


def test_recompute_infeasible_names_shortfall():
    problem = RecomputeProblem(np.ones(2), np.full(2, 4.0), np.full(2, 1.0), base_bytes=10.0, inflight=2.0, capacity_bytes=12.0)
    with pytest.raises(InfeasibleError) as info:
        solve_recompute(problem)
    assert info.value.shortfall_bytes == 2  # 10 + 2 * (1 + 1) = 14 > 12


def random_assignment(rng: np.random.Generator):
    n = int(rng.integers(2, 6))
    stages = int(rng.integers(1, min(n, 3) + 1))
    act = rng.uniform(1.0, 3.0, n)
    problem = StageProblem(
        time_s=rng.uniform(0.5, 2.0, n), static_bytes=rng.uniform(0.5, 2.0, n), activation_bytes=act,
        inflight=[float(stages - s) for s in range(stages)], other_bytes=list(rng.uniform(0, 1, stages)),
        capacity_bytes=float(rng.uniform(4.0, 12.0)), embed_time_s=float(rng.uniform(0, 1)),
        embed_static_bytes=float(rng.uniform(0, 1)), head_time_s=float(rng.uniform(0, 2)),
        head_static_bytes=float(rng.uniform(0, 1)), head_activation_bytes=float(rng.uniform(0, 1)),
    )
    return problem, rng.uniform(0.2, 0.8, n), act * 0.2


@pytest.mark.parametrize("seed", range(20))
def test_assignment_ilp_matches_brute_force(seed):
    problem, rf, act_full = random_assignment(np.random.default_rng(seed))
    reference = brute_assignment(problem, rf, act_full)
    if not np.isfinite(reference):
        with pytest.raises(InfeasibleError, match=r"\(B.7\)"):
            solve_assignment(problem, rf, act_full, time_limit_s=5)
        return
    result = solve_assignment(problem, rf, act_full, time_limit_s=5)
    assert result.bottleneck_s == pytest.approx(reference, rel=1e-5)
    assert sum(result.layers_per_stage) == problem.num_layers and min(result.layers_per_stage) >= 1


def test_assignment_without_recompute_agrees_with_dp():
    rng = np.random.default_rng(3)
    n = 7
    problem = StageProblem(
        time_s=rng.uniform(0.5, 2, n), static_bytes=rng.uniform(0.5, 2, n), activation_bytes=rng.uniform(0.5, 1, n),
        inflight=[3.0, 2.0, 1.0], other_bytes=[0.0, 0.0, 1.0], capacity_bytes=12.0, head_time_s=1.5,
    )
    dp = partition(problem)
    ilp = solve_assignment(problem, np.full(n, 1e3), problem.activation_bytes.copy(), time_limit_s=5)
    assert dp is not None and ilp.bottleneck_s == pytest.approx(dp.bottleneck_s, rel=1e-6)
    assert ilp.recompute_per_stage == (0, 0, 0)


def test_assignment_infeasible_reports_tightest_stage():
    n = 4
    problem = StageProblem(
        time_s=np.ones(n), static_bytes=np.full(n, 5.0), activation_bytes=np.ones(n),
        inflight=[2.0, 1.0], other_bytes=[0.0, 0.0], capacity_bytes=8.0, head_static_bytes=6.0,
    )
    with pytest.raises(InfeasibleError, match=r"B7_memory_1") as info:
        solve_assignment(problem, np.ones(n), np.full(n, 0.5), time_limit_s=5)
    assert info.value.shortfall_bytes > 0
