"""Compute contention: more ranks on a node than the node can compute at once (CPU gloo runs).

A node with `slots` compute slots (CPU cores; `Topology.compute_slots_per_node`) hosting `ranks` runnable
ranks cannot finish a step before all of the node's compute work has run on those slots. A work-conserving
scheduler (Linux CFS, close to processor sharing: Kleinrock 1967, "Time-shared Systems: A Theoretical
Evaluation") keeps every slot busy while some rank has work, so the step is bounded below by both the
critical path and total work / slots (Graham 1969, "Bounds on Multiprocessing Timing Anomalies"), and list
scheduling stays close to the larger of the two when the ranks are many against the slots:

    step = max(critical-path step, node work / slots + exposed communication)

Node work is the compute of every rank on the node (forward, backward, recompute and optimizer of each
pipeline rank, times the ranks sharing its stage). Data-parallel ranks are identical, so this is the old
ranks / slots stretch of every compute interval; a pipeline's bubble is idle time, not work, so its ranks
borrow the cores the waiting ranks leave. Measured on the 2-core box with 4 gloo ranks
(benchmarks/executor_vs_predicted.py, profiles/cpu-small.json): pp4 1F1B with 8 micro-batches ran 0.91-0.94 s;
stretching its critical path, bubble included, by ranks / slots predicts 1.2 s, this model 0.74 s (the critical
path: node work / slots is 0.69 s, the last rank carries the head); dp2 x pp2 with full recompute ran 1.07-1.52 s
(noisy) and is predicted 0.93 s (node work / slots above its 0.79 s critical path). The co-run slowdown of
compute itself (caches and DRAM shared by busy cores) measured 0-13% on this box (benchmarks/cpu_corun.py) and is
not modelled. Communication is exposed, not work: a gloo
collective's copies and reductions are measured with the same sharing (`planner profile comm` runs all ranks
on the node), and with the cores taken it is never overlapped (evaluate.dp_exposed).

Accelerators (one rank per device, no sharing) have no slots limit and are never contended.
"""

from __future__ import annotations

from collections.abc import Sequence


def ranks_per_node(world_size: int, gpus_per_node: int) -> int:
    """Ranks the busiest node hosts: ranks fill nodes in order (planner.topology.placement)."""
    return min(world_size, gpus_per_node)


def fair_share_stretch(*, ranks: int, slots: int | None) -> float:
    """Factor by which a rank's compute takes longer when `ranks` runnable ranks share `slots` compute slots:
    ranks / slots, or 1 when every rank has a slot (or there is no limit)."""
    if slots is None or ranks <= slots:
        return 1.0
    return ranks / slots


def contended(world_size: int, topology) -> bool:
    """Whether the busiest node hosts more runnable ranks than it has compute slots."""
    ranks = ranks_per_node(world_size, topology.gpus_per_node)
    return fair_share_stretch(ranks=ranks, slots=topology.compute_slots_per_node) > 1.0


def shared_step_s(step_s: float, *, work_s: Sequence[float], comm_s: float, world_size: int, topology) -> float:
    """The step on a contended node (module docstring): max(step_s, node work / slots + comm_s). `work_s` is
    each pipeline rank's compute per step; every one of the node's ranks holds one of them, in equal numbers
    (on one node exactly; across nodes the node is assumed to hold an average mix of stages)."""
    if not work_s or not contended(world_size, topology):
        return step_s
    node_work = ranks_per_node(world_size, topology.gpus_per_node) * sum(work_s) / len(work_s)
    return max(step_s, node_work / topology.compute_slots_per_node + comm_s)
