"""Integer programs for the choices that interact, solved with pulp + CBC (the only module that imports pulp).

(A) Per-stage recompute (Korthikanti et al. 2022 section 5 motivates partial recompute; Megatron-LM's
`--recompute-num-layers`): which decoder layers of one stage to recompute fully so that the stage fits, at the
least extra time. Binary x_l = 1 when layer l is fully recomputed.

    minimise    sum_l x_l r_l                                                          (A.0)
    subject to  W + f * sum_l (a_l (1 - x_l) + a'_l x_l) + O <= C          "memory"   (A.1)
                x_l in {0, 1}

  r_l: extra time of a full recompute (its forward), a_l / a'_l: saved bytes without / with full recompute,
  W: static bytes of the stage, f: micro-batches in flight, O: other bytes, C: capacity.

(B) Joint layer-to-stage assignment and recompute, for stages that differ (embedding and LM head on the end
stages, in-flight micro-batches falling with the stage index, heterogeneous capacity), where choosing the split
and the recompute set together beats doing them one after the other. Layers l = 0..n-1 (decoder), stages s.

    minimise    T + eps * sum_l x_l r_l                                                 (B.0)
    subject to  sum_s y_ls = 1                                   "one_stage_l"          (B.1)
                sum_s s y_ls <= sum_s s y_(l+1)s <= sum_s s y_ls + 1   "order_l"/"step_l"  (B.2)  contiguity
                y_00 = 1,  y_(n-1)(S-1) = 1                      "first"/"last"         (B.3)
                sum_l y_ls >= 1                                  "nonempty_s"           (B.4)
                w_ls <= x_l,  w_ls <= y_ls,  w_ls >= x_l + y_ls - 1                      (B.5)  w = x AND y
                E_s + sum_l (t_l y_ls + r_l w_ls) <= T           "time_s"               (B.6)
                M_s + sum_l (W_l + f_s a_l) y_ls - f_s (a_l - a'_l) w_ls <= C_s   "memory_s"  (B.7)

  E_s / M_s: embedding (s = 0) and head (s = S-1) time and bytes plus the stage's other bytes.
  (B.2) makes the stage index non-decreasing by steps of at most one, which with (B.3) and (B.4) is exactly a
  contiguous split into S non-empty stages.

Infeasibility is reported with the tightest constraint: the problem is re-solved with one slack variable v >= 0
added to every memory constraint and minimised; the constraint that needs the largest slack and its amount in
bytes are named in the InfeasibleError. CBC runs single-threaded with msg off and the time limit passed in, so
results are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
import warnings
from dataclasses import dataclass

import numpy as np
import pulp

from planner.errors import InfeasibleError
from planner.search.partition import StageProblem
from planner.units import GiB

TIE_EPS = 1e-6  # weight of the recompute time in (B.0): among equal bottlenecks, recompute the least


@dataclass(frozen=True)
class RecomputeProblem:
    """Numbers of problem (A) for one stage."""

    full_recompute_s: np.ndarray
    activation_bytes: np.ndarray
    full_recompute_activation_bytes: np.ndarray
    base_bytes: float  # W + O: static and other bytes of the stage, and the embedding/head activations
    inflight: float
    capacity_bytes: float


@dataclass(frozen=True)
class RecomputeChoice:
    recompute: tuple[int, ...]  # x_l
    extra_time_s: float
    memory_bytes: float


@dataclass(frozen=True)
class Assignment:
    layers_per_stage: tuple[int, ...]
    recompute_per_stage: tuple[int, ...]  # fully recomputed decoder layers per stage
    recompute: tuple[int, ...]  # x_l
    bottleneck_s: float


def _solver(time_limit_s: float) -> pulp.LpSolver:
    """The CBC bundled with pulp (PULP_CBC_CMD; its pulp-4 deprecation notice is silenced: no system CBC here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pulp.PULP_CBC_CMD(msg=False, timeLimit=max(1, int(np.ceil(time_limit_s))), threads=1)


def _var(prob: pulp.LpProblem, name: str, *, low: float | None = 0, up: float | None = None, cat: str = "Continuous") -> pulp.LpVariable:
    """A variable attached to `prob` (pulp >= 3.3 API), falling back to the pulp 2 constructor."""
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, low, up, cat=cat)
    return pulp.LpVariable(name, lowBound=low, upBound=up, cat=cat)


def _constraint(prob: pulp.LpProblem, name: str) -> pulp.LpConstraint:
    if hasattr(prob, "get_constraint_by_name"):
        return prob.get_constraint_by_name(name)
    return prob.constraints[name]


def _solved(prob: pulp.LpProblem) -> bool:
    """An optimal solution, or a feasible one found before the time limit."""
    return pulp.LpStatus[prob.status] == "Optimal" or prob.sol_status in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible)


def solve_recompute(problem: RecomputeProblem, *, time_limit_s: float = 10.0) -> RecomputeChoice:
    """Problem (A). Raises InfeasibleError naming constraint (A.1) and the bytes missing when nothing fits."""
    n = len(problem.full_recompute_s)
    a = np.asarray(problem.activation_bytes, dtype=np.float64)
    a_full = np.asarray(problem.full_recompute_activation_bytes, dtype=np.float64)
    floor = problem.base_bytes + problem.inflight * float(np.sum(np.minimum(a, a_full)))
    if floor > problem.capacity_bytes:
        over = floor - problem.capacity_bytes
        raise InfeasibleError(
            f"constraint (A.1) memory: the stage needs {floor / GiB:.2f} GiB even with every layer fully recomputed, "
            f"{over / GiB:.2f} GiB over the {problem.capacity_bytes / GiB:.2f} GiB capacity",
            shortfall_bytes=int(np.ceil(over)),
        )
    prob = pulp.LpProblem("stage_recompute", pulp.LpMinimize)
    x = [_var(prob, f"x_{l}", up=1, cat="Binary") for l in range(n)]
    prob += pulp.lpSum(float(problem.full_recompute_s[l]) * x[l] for l in range(n)), "A0_recompute_time"
    prob += (
        problem.base_bytes
        + problem.inflight * pulp.lpSum(float(a[l]) - float(a[l] - a_full[l]) * x[l] for l in range(n))
        <= problem.capacity_bytes,
        "A1_memory",
    )
    prob.solve(_solver(time_limit_s))
    if not _solved(prob):
        raise InfeasibleError(f"constraint (A.1) memory: CBC found no solution ({pulp.LpStatus[prob.status]})")
    chosen = tuple(int(round(v.value() or 0)) for v in x)
    xs = np.array(chosen, dtype=np.float64)
    memory = problem.base_bytes + problem.inflight * float(np.sum(a * (1 - xs) + a_full * xs))
    return RecomputeChoice(chosen, float(np.sum(problem.full_recompute_s * xs)), memory)


def _build_assignment(
    problem: StageProblem, rf_s: np.ndarray, a_full: np.ndarray, capacities: Sequence[float], *, elastic: bool
) -> tuple[pulp.LpProblem, dict, dict, list]:
    """Formulation (B); with elastic=True the memory rows get a shared slack v and the objective is min v."""
    n, num_stages = problem.num_layers, problem.num_stages
    stages, layers = range(num_stages), range(n)
    prob = pulp.LpProblem("stage_assignment", pulp.LpMinimize)
    y = {(l, s): _var(prob, f"y_{l}_{s}", up=1, cat="Binary") for l in layers for s in stages}
    w = {(l, s): _var(prob, f"w_{l}_{s}", up=1) for l in layers for s in stages}
    x = [_var(prob, f"x_{l}", up=1, cat="Binary") for l in layers]
    t_max = _var(prob, "T")
    slack = _var(prob, "v") if elastic else 0
    prob += (slack if elastic else t_max + TIE_EPS * pulp.lpSum(float(rf_s[l]) * x[l] for l in layers)), "B0"
    index = {l: pulp.lpSum(s * y[l, s] for s in stages) for l in layers}
    for l in layers:
        prob += pulp.lpSum(y[l, s] for s in stages) == 1, f"B1_one_stage_{l}"
        if l + 1 < n:
            prob += index[l] <= index[l + 1], f"B2_order_{l}"
            prob += index[l + 1] <= index[l] + 1, f"B2_step_{l}"
        for s in stages:
            prob += w[l, s] <= x[l], f"B5a_{l}_{s}"
            prob += w[l, s] <= y[l, s], f"B5b_{l}_{s}"
            prob += w[l, s] >= x[l] + y[l, s] - 1, f"B5c_{l}_{s}"
    prob += y[0, 0] == 1, "B3_first"
    prob += y[n - 1, num_stages - 1] == 1, "B3_last"
    for s in stages:
        f = float(problem.inflight[s])
        prob += pulp.lpSum(y[l, s] for l in layers) >= 1, f"B4_nonempty_{s}"
        fixed_t, fixed_m = _stage_extras(problem, s)
        prob += (
            fixed_t + pulp.lpSum(float(problem.time_s[l]) * y[l, s] + float(rf_s[l]) * w[l, s] for l in layers) <= t_max,
            f"B6_time_{s}",
        )
        mem = fixed_m + pulp.lpSum(
            float(problem.static_bytes[l] + f * problem.activation_bytes[l]) * y[l, s]
            - f * float(problem.activation_bytes[l] - a_full[l]) * w[l, s]
            for l in layers
        )
        prob += mem <= float(capacities[s]) + slack, f"B7_memory_{s}"
    return prob, y, w, x


def _stage_extras(problem: StageProblem, stage: int) -> tuple[float, float]:
    """E_s and M_s of (B.6)/(B.7): embedding on stage 0, head on the last, the stage's other bytes."""
    f = float(problem.inflight[stage])
    time, mem = 0.0, float(problem.other_bytes[stage])
    if stage == 0:
        time += problem.embed_time_s
        mem += problem.embed_static_bytes + f * problem.embed_activation_bytes
    if stage == problem.num_stages - 1:
        time += problem.head_time_s
        mem += problem.head_static_bytes + f * problem.head_activation_bytes
    return time, mem


def solve_assignment(
    problem: StageProblem,
    full_recompute_s: np.ndarray,
    full_recompute_activation_bytes: np.ndarray,
    *,
    capacities: Sequence[float] | None = None,
    time_limit_s: float = 10.0,
) -> Assignment:
    """Problem (B). `capacities` per stage (heterogeneous devices); default: problem.capacity_bytes everywhere."""
    n, num_stages = problem.num_layers, problem.num_stages
    if num_stages > n:
        raise InfeasibleError(f"constraint (B.4) nonempty: {num_stages} stages need at least {num_stages} layers, got {n}")
    caps = list(capacities) if capacities is not None else [problem.capacity_bytes] * num_stages
    rf = np.asarray(full_recompute_s, dtype=np.float64)
    a_full = np.asarray(full_recompute_activation_bytes, dtype=np.float64)
    prob, y, _, x = _build_assignment(problem, rf, a_full, caps, elastic=False)
    prob.solve(_solver(time_limit_s))
    if not _solved(prob):
        raise _tightest(problem, rf, a_full, caps, time_limit_s)
    stage_of = [max(range(num_stages), key=lambda s, l=l: (y[l, s].value() or 0.0)) for l in range(n)]
    chosen = tuple(int(round(v.value() or 0)) for v in x)
    counts = tuple(stage_of.count(s) for s in range(num_stages))
    recomputed = tuple(sum(chosen[l] for l in range(n) if stage_of[l] == s) for s in range(num_stages))
    times = []
    for s in range(num_stages):
        extra_t, _ = _stage_extras(problem, s)
        members = [l for l in range(n) if stage_of[l] == s]
        times.append(extra_t + sum(float(problem.time_s[l]) + chosen[l] * float(rf[l]) for l in members))
    return Assignment(counts, recomputed, chosen, max(times))


def _tightest(problem: StageProblem, rf: np.ndarray, a_full: np.ndarray, caps: Sequence[float], time_limit_s: float) -> InfeasibleError:
    """Re-solve elastically (min v) and name the memory constraint that needs the largest slack."""
    prob, _, _, _ = _build_assignment(problem, rf, a_full, caps, elastic=True)
    prob.solve(_solver(time_limit_s))
    slack = float(pulp.value(prob.objective) or 0.0)
    worst_name, worst = "B7_memory_0", -np.inf
    for s in range(problem.num_stages):
        row = _constraint(prob, f"B7_memory_{s}")
        lhs_minus_cap = float(row.value()) + slack  # row is mem - cap - v <= 0; value() = mem - cap - v
        if lhs_minus_cap > worst:
            worst_name, worst = f"B7_memory_{s}", lhs_minus_cap
    return InfeasibleError(
        f"constraint (B.7) {worst_name}: no split and recompute choice fits; the best needs "
        f"{slack / GiB:.2f} GiB more than the capacity on stage {worst_name.rsplit('_', 1)[1]}",
        shortfall_bytes=int(np.ceil(slack)),
    )
