"""Plain-data summaries of a topology for `planner topology list|show` and the service (no rendering here)."""

from typing import Any

from planner.schemas.topology import Topology
from planner.topology.groups import GroupLink
from planner.topology.placement import DEFAULT_AXIS_ORDER, axis_link, nic_share_GBps
from planner.units import GiB


def topology_row(topology: Topology) -> dict[str, Any]:
    """One line of `planner topology list`: device, memory, peak, fabrics."""
    net = topology.inter_node
    return {
        "name": topology.name,
        "device": topology.device.name,
        "gpus_per_node": topology.gpus_per_node,
        "memory_GiB": round(topology.device.memory_bytes / GiB, 2),
        "peak_bf16_tflops": topology.device.peak_bf16_tflops,
        "intra_kind": topology.intra_node.kind,
        "intra_bandwidth_GBps": topology.intra_node.bandwidth_GBps,
        "inter_kind": net.kind,
        "nic_share_GBps": round(nic_share_GBps(topology), 3),
    }


def link_row(label: str, link: GroupLink) -> dict[str, Any]:
    """A process group's link as a row: footprint, the slowest link it spans, its latency."""
    return {
        "group": label,
        "size": link.size,
        "num_nodes": link.num_nodes,
        "ranks_per_node": link.ranks_per_node,
        "bandwidth_GBps": link.bandwidth_GBps if link.size > 1 else None,
        "latency_s": link.latency_s,
    }


def representative_groups(topology: Topology) -> list[dict[str, Any]]:
    """Links of the groups a plan typically makes on this cluster, under the default layout (tp innermost):
    TP groups of 2 .. gpus_per_node ranks inside a node, and the DP group across nodes with a full-node TP."""
    gpn, nodes = topology.gpus_per_node, topology.num_nodes
    rows = []
    size = 2
    while size <= gpn:
        if gpn % size == 0:
            sizes = {"tp": size, "dp": topology.num_gpus // size}
            rows.append(link_row(f"tp={size}", axis_link(topology, sizes, DEFAULT_AXIS_ORDER, "tp")))
        size *= 2
    if gpn not in [row["size"] for row in rows] and gpn > 1:
        rows.append(link_row(f"tp={gpn}", axis_link(topology, {"tp": gpn, "dp": nodes}, DEFAULT_AXIS_ORDER, "tp")))
    if nodes > 1:
        rows.append(link_row(f"dp={nodes} (tp={gpn})", axis_link(topology, {"tp": gpn, "dp": nodes}, DEFAULT_AXIS_ORDER, "dp")))
        rows.append(link_row(f"dp={topology.num_gpus} (tp=1)", axis_link(topology, {"dp": topology.num_gpus}, DEFAULT_AXIS_ORDER, "dp")))
    return rows


def topology_report(topology: Topology) -> dict[str, Any]:
    """Everything `planner topology show` prints: the resolved topology and its representative group links."""
    return {
        "topology": topology.model_dump(mode="json"),
        "num_gpus": topology.num_gpus,
        "groups": representative_groups(topology),
    }
