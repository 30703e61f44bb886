"""Compute contention: more ranks on a node than the node can compute at once (CPU gloo runs).

A node with `slots` compute slots (CPU cores; `Topology.compute_slots_per_node`) hosting `ranks` runnable
ranks shares them fairly: under processor sharing each rank progresses at slots / ranks of its own speed
(Kleinrock 1967, "Time-shared Systems: A Theoretical Evaluation", the limit of round-robin as the quantum
goes to zero; Linux CFS approximates it). Every compute interval on the critical path, including the
pipeline bubble, which is the other ranks' compute, is therefore stretched by ranks / slots; waiting on
communication is not. This also keeps the step above the work-conserving bound total work / slots (Graham
1969, "Bounds on Multiprocessing Timing Anomalies"), since no rank computes less than the average.

Measured on the 2-core CPU box with 4 gloo ranks (benchmarks/executor_vs_predicted.py): data-parallel plans
(identical ranks, the two bounds coincide) and pipeline plans (pp4, dp2 x pp2: about twice the single-rank
critical path, not the smaller total / slots) both follow the stretched critical path.

Accelerators (one rank per device, no sharing) have no slots limit: the stretch is 1.
"""

from __future__ import annotations


def ranks_per_node(world_size: int, gpus_per_node: int) -> int:
    """Ranks the busiest node hosts: ranks fill nodes in order (planner.topology.placement)."""
    return min(world_size, gpus_per_node)


def fair_share_stretch(*, ranks: int, slots: int | None) -> float:
    """Factor by which a rank's compute takes longer when `ranks` runnable ranks share `slots` compute slots:
    ranks / slots, or 1 when every rank has a slot (or there is no limit)."""
    if slots is None or ranks <= slots:
        return 1.0
    return ranks / slots
