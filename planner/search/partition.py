"""Stage partitioning by dynamic programming (PipeDream, Narayanan et al. 2019 section 3.1; Alpa, Zheng et al.
2022 section 5.2): split the decoder layers into `S` contiguous, possibly uneven stages, the embedding riding on
the first stage and the LM head (final norm + head + loss) on the last, minimising the slowest stage subject to
every stage's memory fitting.

The problem is a pure function of numbers (`StageProblem`): per decoder layer time and memory, the embedding and
head as fixed extras of the first and last stage, and per stage the number of micro-batches whose activations it
holds at its peak (1F1B: pp - s, so early stages hold more) and its other bytes (logits buffer on the last stage).

Recurrence (decoder layers 0..n-1, prefix sums P make every range O(1)):

    time(s, j, i) = P_t[i] - P_t[j] + [s = 0] t_emb + [s = S-1] t_head
    mem(s, j, i)  = P_w[i] - P_w[j] + f_s (P_a[i] - P_a[j]) + o_s + [s = 0] (w_emb + f_0 a_emb)
                                                               + [s = S-1] (w_head + f_{S-1} a_head)
    best[0][i]    = time(0, 0, i)                                   if mem(0, 0, i) <= C else inf
    best[s][i]    = min_{s <= j < i} max(best[s-1][j], time(s, j, i))   over j with mem(s, j, i) <= C
    answer        = best[S-1][n]

Every stage holds at least one decoder layer (j < i), except that with `empty_ends` (a stack that runs an end
stage holding only the embedding or only the head: planner.frameworks_split) the first and last may hold none
(j <= i). Ties on the bottleneck break on the smallest j (np.argmin
returns the first minimum), so the result is deterministic. `backtrack` is separate: it walks the arg-min table.
Complexity O(S n^2) with the inner min vectorised over (j, i) in numpy.

Interleaved schedules (vpp > 1) are not partitioned here: a pipeline rank's time and memory are sums over its vpp
chunks, which do not decompose per chunk; the search tries the stack's own uneven forms for them instead
(planner.search.refine_uneven).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

INF = float("inf")


@dataclass(frozen=True)
class StageProblem:
    """Numbers of one partitioning problem. Arrays over decoder layers (length n); sequences over stages (S)."""

    time_s: np.ndarray  # per decoder layer: forward + backward + recompute of one micro-batch
    static_bytes: np.ndarray  # per decoder layer: params + grads + optimizer states on this GPU
    activation_bytes: np.ndarray  # per decoder layer: saved activations of one micro-batch
    inflight: Sequence[float]  # per stage: micro-batches whose activations the stage holds at its peak
    other_bytes: Sequence[float]  # per stage: logits buffer, comm buffers, workspace
    capacity_bytes: float
    embed_time_s: float = 0.0
    embed_static_bytes: float = 0.0
    embed_activation_bytes: float = 0.0
    head_time_s: float = 0.0
    head_static_bytes: float = 0.0
    head_activation_bytes: float = 0.0
    empty_ends: bool = False  # the first/last stage may hold no decoder layer (where the stack runs it)

    @property
    def num_layers(self) -> int:
        return int(len(self.time_s))

    @property
    def num_stages(self) -> int:
        return len(self.inflight)


@dataclass(frozen=True)
class Partition:
    """The result: decoder layers per stage, the bottleneck stage time, and each stage's time and memory."""

    layers_per_stage: tuple[int, ...]
    bottleneck_s: float
    stage_time_s: tuple[float, ...]
    stage_memory_bytes: tuple[float, ...]


def _prefix(values: np.ndarray) -> np.ndarray:
    return np.concatenate(([0.0], np.cumsum(np.asarray(values, dtype=np.float64))))


def stage_time_s(problem: StageProblem, stage: int, start: int, stop: int) -> float:
    """time(s, j, i) of the recurrence, for decoder layers [start, stop) on stage `stage`."""
    total = float(np.sum(problem.time_s[start:stop]))
    if stage == 0:
        total += problem.embed_time_s
    if stage == problem.num_stages - 1:
        total += problem.head_time_s
    return total


def stage_memory_bytes(problem: StageProblem, stage: int, start: int, stop: int) -> float:
    """mem(s, j, i) of the recurrence: static + in-flight x activations + other bytes."""
    f = float(problem.inflight[stage])
    total = float(np.sum(problem.static_bytes[start:stop])) + f * float(np.sum(problem.activation_bytes[start:stop]))
    total += float(problem.other_bytes[stage])
    if stage == 0:
        total += problem.embed_static_bytes + f * problem.embed_activation_bytes
    if stage == problem.num_stages - 1:
        total += problem.head_static_bytes + f * problem.head_activation_bytes
    return total


def _range_tables(problem: StageProblem, stage: int) -> tuple[np.ndarray, np.ndarray]:
    """time(s, j, i) and mem(s, j, i) for all 0 <= j, i <= n as (n+1) x (n+1) matrices (rows j, columns i)."""
    pt, pw, pa = _prefix(problem.time_s), _prefix(problem.static_bytes), _prefix(problem.activation_bytes)
    f = float(problem.inflight[stage])
    time = pt[None, :] - pt[:, None]
    mem = (pw[None, :] - pw[:, None]) + f * (pa[None, :] - pa[:, None]) + float(problem.other_bytes[stage])
    if stage == 0:
        time = time + problem.embed_time_s
        mem = mem + problem.embed_static_bytes + f * problem.embed_activation_bytes
    if stage == problem.num_stages - 1:
        time = time + problem.head_time_s
        mem = mem + problem.head_static_bytes + f * problem.head_activation_bytes
    return time, mem


def solve_tables(problem: StageProblem) -> tuple[np.ndarray, np.ndarray]:
    """Fill best[s][i] and the arg-min table choice[s][i] (the j of the recurrence; -1 where infeasible)."""
    n, num_stages = problem.num_layers, problem.num_stages
    best = np.full((num_stages, n + 1), INF)
    choice = np.full((num_stages, n + 1), -1, dtype=np.int64)
    upper = np.triu(np.ones((n + 1, n + 1), dtype=bool), k=1)  # j < i: every stage holds a decoder layer
    either = np.triu(np.ones((n + 1, n + 1), dtype=bool), k=0)  # j <= i: an end stage may hold none
    for s in range(num_stages):
        time, mem = _range_tables(problem, s)
        end = problem.empty_ends and s in (0, num_stages - 1) and num_stages > 1
        valid = (either if end else upper) & (mem <= problem.capacity_bytes)
        if s == 0:
            row = np.where(valid[0], time[0], INF)
            best[0] = row
            choice[0] = np.where(np.isfinite(row), 0, -1)
            continue
        cand = np.where(valid, np.maximum(best[s - 1][:, None], time), INF)
        j = np.argmin(cand, axis=0)
        value = cand[j, np.arange(n + 1)]
        best[s] = value
        choice[s] = np.where(np.isfinite(value), j, -1)
    return best, choice


def backtrack(choice: np.ndarray, num_layers: int) -> tuple[int, ...]:
    """Walk the arg-min table from best[S-1][n] back to stage 0; returns decoder layers per stage."""
    num_stages = choice.shape[0]
    bounds = [num_layers]
    i = num_layers
    for s in range(num_stages - 1, -1, -1):
        j = int(choice[s][i])
        if j < 0:
            raise ValueError(f"no feasible partition reaches layer {i} at stage {s}")
        bounds.append(j)
        i = j
    bounds.reverse()
    return tuple(bounds[k + 1] - bounds[k] for k in range(num_stages))


def describe(problem: StageProblem, layers_per_stage: Sequence[int]) -> Partition:
    """Stage times and memory of a given split (used by the DP result, the ILP and the brute force alike)."""
    times, mems, start = [], [], 0
    for s, count in enumerate(layers_per_stage):
        times.append(stage_time_s(problem, s, start, start + count))
        mems.append(stage_memory_bytes(problem, s, start, start + count))
        start += count
    return Partition(tuple(int(c) for c in layers_per_stage), max(times), tuple(times), tuple(mems))


def partition(problem: StageProblem) -> Partition | None:
    """The min-bottleneck contiguous split that fits, or None when no split fits in memory."""
    if problem.num_stages > problem.num_layers + (2 if problem.empty_ends and problem.num_stages > 1 else 0):
        return None
    best, choice = solve_tables(problem)
    if not np.isfinite(best[-1][problem.num_layers]):
        return None
    return describe(problem, backtrack(choice, problem.num_layers))
