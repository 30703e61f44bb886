"""A topology as a networkx graph, and a process group's link derived by walking it.

Nodes (each with a `kind` attribute):
- ("gpu", node, local_rank): one per GPU, attrs `node`, `local_rank`, `device`;
- ("switch", node): the intra-node switch of a switched fabric (NVSwitch, PCIe switch, loopback);
  a point-to-point fabric (NVLink mesh, AMD Infinity Fabric) has direct GPU-GPU edges instead, each with
  the per-GPU bandwidth / (gpus_per_node - 1) (MI300X: 7 links of 64 GB/s per direction per GPU);
- ("nic", node, index): the node's NICs; GPU l attaches to the NICs its PCIe switch serves
  (nics < gpus: GPUs share a NIC; nics > gpus: a GPU owns several, as AWS p5's 4 EFA per GPU);
- the inter-node fabric: ("rail", index) per NIC index on a rail-optimized fabric, joined by one ("spine",)
  for cross-rail traffic; a fat tree is one ("spine",) that every NIC reaches through an uplink of
  nic_bandwidth / oversubscription.
Edges carry `bandwidth_GBps` (per direction), `latency_s` and `kind`. A path's latency is the sum of its
edges': the switch edges carry half the fabric latency each, so that GPU -> switch -> GPU is the fabric's
latency, and NIC -> rail/spine -> NIC is the inter-node latency (the rail-spine edges add none).

`group_link_from_graph` derives the GroupLink of a set of ranks by walking this graph; it agrees with the
arithmetic of planner.topology.placement (tests check both on many layouts). It is the reference that
the fast arithmetic is checked against, and the way to reason about a new fabric before writing its rule.
"""

from collections import Counter
from collections.abc import Sequence

import networkx as nx

from planner.errors import BadInputError
from planner.schemas.topology import Topology
from planner.topology.groups import GroupLink
from planner.topology.placement import MESH_FABRICS, intra_rates

SPINE = ("spine",)


def _gpu(node: int, local: int) -> tuple[str, int, int]:
    return ("gpu", node, local)


def _add_intra(graph: nx.Graph, topology: Topology, node: int) -> None:
    fabric = topology.intra_node
    gpn = topology.gpus_per_node
    if fabric.kind in MESH_FABRICS:
        per_pair = fabric.bandwidth_GBps / max(gpn - 1, 1)
        for a in range(gpn):
            for b in range(a + 1, gpn):
                graph.add_edge(_gpu(node, a), _gpu(node, b), bandwidth_GBps=per_pair, latency_s=fabric.latency_s, kind=fabric.kind)
        return
    switch = ("switch", node)
    graph.add_node(switch, kind=fabric.kind, node=node)
    for local in range(gpn):
        graph.add_edge(_gpu(node, local), switch, bandwidth_GBps=fabric.bandwidth_GBps, latency_s=fabric.latency_s / 2, kind=fabric.kind)


def nics_of_gpu(topology: Topology, local: int) -> list[int]:
    """Indices of the NICs GPU `local` uses: a regular share when one count divides the other, else all."""
    nics, gpn = topology.inter_node.nics_per_node, topology.gpus_per_node
    if nics == 0:
        return []
    if gpn % nics == 0:
        return [local // (gpn // nics)]
    if nics % gpn == 0:
        per_gpu = nics // gpn
        return list(range(local * per_gpu, (local + 1) * per_gpu))
    return list(range(nics))


def _add_nics(graph: nx.Graph, topology: Topology, node: int) -> None:
    net = topology.inter_node
    uplink = net.nic_bandwidth_GBps / (net.oversubscription if net.topology == "fat_tree" else 1.0)
    for index in range(net.nics_per_node):
        nic = ("nic", node, index)
        graph.add_node(nic, kind="nic", node=node, index=index)
        fabric_node = ("rail", index) if net.topology == "rail_optimized" else SPINE
        graph.add_edge(nic, fabric_node, bandwidth_GBps=uplink, latency_s=net.latency_s / 2, kind=net.kind)
    for local in range(topology.gpus_per_node):
        for index in nics_of_gpu(topology, local):
            graph.add_edge(_gpu(node, local), ("nic", node, index), bandwidth_GBps=net.nic_bandwidth_GBps, latency_s=0.0, kind="pcie")


def build_graph(topology: Topology) -> nx.Graph:
    """The cluster as a graph: GPUs, intra-node switches or mesh links, NICs and the inter-node fabric."""
    graph = nx.Graph(name=topology.name, gpus_per_node=topology.gpus_per_node, num_nodes=topology.num_nodes,
                     intra_bandwidth_GBps=topology.intra_node.bandwidth_GBps,
                     intra_latency_s=topology.intra_node.latency_s, inter_latency_s=topology.inter_node.latency_s)
    net = topology.inter_node
    if net.nics_per_node:
        if net.topology == "rail_optimized":
            graph.add_node(SPINE, kind="spine")
            for index in range(net.nics_per_node):
                graph.add_node(("rail", index), kind="rail", index=index)
                cross = net.nic_bandwidth_GBps * topology.num_nodes / net.oversubscription
                graph.add_edge(("rail", index), SPINE, bandwidth_GBps=cross, latency_s=0.0, kind="rail_spine")
        else:
            graph.add_node(SPINE, kind="spine")
    for node in range(topology.num_nodes):
        for local in range(topology.gpus_per_node):
            graph.add_node(_gpu(node, local), kind="gpu", node=node, local_rank=local, device=topology.device.name)
        _add_intra(graph, topology, node)
        if net.nics_per_node:
            _add_nics(graph, topology, node)
    return graph


def _path_latency_s(graph: nx.Graph, path: Sequence) -> float:
    return sum(graph.edges[a, b]["latency_s"] for a, b in zip(path, path[1:]))


def _path_bottleneck_GBps(graph: nx.Graph, path: Sequence) -> float:
    return min(graph.edges[a, b]["bandwidth_GBps"] for a, b in zip(path, path[1:]))


def _intra_view(graph: nx.Graph, node: int) -> nx.Graph:
    """The subgraph of one node's intra fabric: its GPUs and its switch, no NICs."""
    keep = [n for n, data in graph.nodes(data=True) if data.get("node") == node and data["kind"] != "nic"]
    return graph.subgraph(keep)


def _intra_link(graph: nx.Graph, members: list[tuple]) -> tuple[float, float]:
    """(bandwidth, latency) one member sees to the group's other members on its node.

    Paths are grouped by their first edge: a member sends to peers behind the same first edge through
    that edge (a switch port), and to peers behind different edges in parallel (mesh links).
    """
    source, peers = members[0], members[1:]
    view = _intra_view(graph, graph.nodes[source]["node"])
    if not peers:
        total = sum(view.edges[source, other]["bandwidth_GBps"] for other in view.neighbors(source))
        return total or graph.graph["intra_bandwidth_GBps"], graph.graph["intra_latency_s"]
    by_first_edge: dict[tuple, float] = {}
    latency_s = 0.0
    for peer in peers:
        path = nx.shortest_path(view, source, peer)
        first = path[1]
        by_first_edge[first] = min(by_first_edge.get(first, float("inf")), _path_bottleneck_GBps(view, path))
        latency_s = max(latency_s, _path_latency_s(view, path))
    return sum(by_first_edge.values()), latency_s


def _nic_share_GBps(graph: nx.Graph, gpu: tuple) -> float:
    """What `gpu` gets of its NICs when every GPU of its node sends at once: for each of its NICs, the
    slower of the GPU-NIC and NIC-fabric edges, divided among the GPUs attached to that NIC."""
    share = 0.0
    for nic in graph.neighbors(gpu):
        if graph.nodes[nic]["kind"] != "nic":
            continue
        users = sum(1 for n in graph.neighbors(nic) if graph.nodes[n]["kind"] == "gpu")
        uplink = max(graph.edges[nic, n]["bandwidth_GBps"] for n in graph.neighbors(nic) if graph.nodes[n]["kind"] in ("rail", "spine"))
        share += min(graph.edges[gpu, nic]["bandwidth_GBps"], uplink) / users
    return share


def _inter_latency_s(graph: nx.Graph, source: tuple, remote: tuple) -> float:
    return nx.shortest_path_length(graph, source, remote, weight="latency_s")


def group_link_from_graph(graph: nx.Graph, topology: Topology, ranks: Sequence[int]) -> GroupLink:
    """The GroupLink of the group `ranks` (rank r on node r // gpus_per_node), derived from the graph.

    num_nodes: nodes the group occupies; ranks_per_node: most ranks on one node; intra bandwidth and
    latency: seen by a member of the fullest node towards its co-located members; inter bandwidth: the
    member's share of its node's NICs when the whole node communicates; inter latency: the cheapest path
    to a member on another node (when the group stays in one node, to the same GPU on another node, or
    the NIC-to-fabric latency when the cluster has one node).
    """
    gpn = topology.gpus_per_node
    if not ranks or len(set(ranks)) != len(ranks):
        raise BadInputError(f"ranks={list(ranks)} must be a non-empty list of distinct ranks")
    if max(ranks) >= topology.num_gpus or min(ranks) < 0:
        raise BadInputError(f"ranks={list(ranks)} must lie in 0..{topology.num_gpus - 1} for topology {topology.name!r}")
    counts = Counter(rank // gpn for rank in ranks)
    fullest = min(node for node, count in counts.items() if count == max(counts.values()))
    members = [_gpu(fullest, rank % gpn) for rank in sorted(ranks) if rank // gpn == fullest]
    intra_bw, intra_lat = _intra_link(graph, members)
    source = members[0]
    remotes = [_gpu(rank // gpn, rank % gpn) for rank in sorted(ranks) if rank // gpn != fullest]
    if remotes:
        inter_lat = min(_inter_latency_s(graph, source, remote) for remote in remotes)
    else:
        inter_lat = _fabric_latency_s(graph, source)
    return GroupLink(
        size=len(ranks),
        ranks_per_node=max(counts.values()),
        num_nodes=len(counts),
        intra_bandwidth_GBps=intra_bw,
        intra_latency_s=intra_lat,
        inter_bandwidth_GBps=_nic_share_GBps(graph, source),
        inter_latency_s=inter_lat,
        intra_rates=intra_rates(topology),
    )


def _fabric_latency_s(graph: nx.Graph, gpu: tuple) -> float:
    """Latency GPU -> NIC -> fabric -> NIC -> GPU, as if to the same GPU on another node."""
    for nic in graph.neighbors(gpu):
        if graph.nodes[nic]["kind"] == "nic":
            hop = max(graph.edges[nic, n]["latency_s"] for n in graph.neighbors(nic) if graph.nodes[n]["kind"] in ("rail", "spine"))
            return graph.edges[gpu, nic]["latency_s"] * 2 + hop * 2
    return graph.graph["inter_latency_s"]  # no NICs: nothing to walk, report the fabric as written
