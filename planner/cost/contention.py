"""Compute contention: more ranks on a node than the node can compute at once (CPU gloo runs).

A node with `slots` compute slots (CPU cores; `Topology.compute_slots_per_node`) that hosts `ranks` ranks
cannot execute more than `slots` ranks' compute at any instant, so a step is at least the node's total busy
compute time divided by its slots (the work-conserving bound of list scheduling on identical machines,
Graham 1969, "Bounds on Multiprocessing Timing Anomalies", Sec. 2: makespan >= total work / machines).
The gradient reduction that follows the last backward comes after that work. Ranks that wait (a pipeline
bubble, a collective) give their slot to another rank, which is why this bound, not the per-rank critical
path, sets the step time of oversubscribed data-parallel plans while pipeline plans are less affected.

Accelerators (one rank per device, no sharing) have no slots limit: the bound does not apply.
"""

from __future__ import annotations


def ranks_per_node(world_size: int, gpus_per_node: int) -> int:
    """Ranks the busiest node hosts: ranks fill nodes in order (planner.topology.placement)."""
    return min(world_size, gpus_per_node)


def node_compute_bound_s(mean_rank_busy_s: float, *, ranks: int, slots: int | None, tail_s: float = 0.0) -> float:
    """Lower bound on the step time of a node hosting `ranks` ranks whose average busy compute per step is
    `mean_rank_busy_s`, with `slots` compute slots: ranks * busy / slots + tail (work that can only start when
    the compute is done, e.g. the exposed gradient reduction). 0 when the node has a slot per rank (or no
    limit), so that the per-rank critical path alone sets the step time."""
    if slots is None or ranks <= slots:
        return 0.0
    return ranks * mean_rank_busy_s / slots + tail_s
