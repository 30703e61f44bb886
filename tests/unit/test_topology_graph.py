"""The topology graph, and agreement between graph-derived group links and placement arithmetic."""

import math
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.schemas.topology import Topology
from planner.topology import list_topologies, load_topology
from planner.topology.graph import build_graph, group_link_from_graph, nics_of_gpu
from planner.topology.placement import LINK_AXES, axis_groups, axis_link, worst_link_key

DEFAULT = ("pp", "dp", "cp", "tp")
ORDERS = [DEFAULT, ("tp", "cp", "dp", "pp"), ("dp", "tp", "pp", "cp"), ("cp", "pp", "tp", "dp"), ("pp", "tp", "dp", "cp")]


def variant(name: str, **changes) -> Topology:
    data = load_topology(name).model_dump()
    for key, value in changes.items():
        section, _, field = key.partition("__")
        if field:
            data[section][field] = value
        else:
            data[key] = value
    return Topology.model_validate(data)


@lru_cache(maxsize=None)
def fabric(kind: str, nodes: int) -> tuple[Topology, object]:
    """A few contrasting fabrics, each with its graph (built once per test session)."""
    topologies = {
        "dgx-h100": lambda: load_topology("dgx-h100", nodes=nodes),
        "mi300x-8": lambda: load_topology("mi300x-8", nodes=nodes),
        "aws-p4d": lambda: load_topology("aws-p4d", nodes=nodes),  # 2 GPUs per NIC, fat tree
        "aws-p5": lambda: load_topology("aws-p5", nodes=nodes),  # 4 NICs per GPU
        # 4 GPUs per node, 3 NICs (no regular sharing), oversubscribed fat tree
        "odd": lambda: variant("dgx-h100", num_nodes=nodes, gpus_per_node=4, inter_node__nics_per_node=3,
                               inter_node__topology="fat_tree", inter_node__oversubscription=3.0),
        "mesh6": lambda: variant("mi300x-8", num_nodes=nodes, gpus_per_node=6),
    }
    topology = topologies[kind]()
    return topology, build_graph(topology)


def assert_links_agree(topology, graph, sizes, order, axis):
    links = [group_link_from_graph(graph, topology, group) for group in axis_groups(sizes, order, axis)]
    worst = max(links, key=worst_link_key)
    fast = axis_link(topology, sizes, order, axis)
    assert (fast.size, fast.num_nodes, fast.ranks_per_node) == (worst.size, worst.num_nodes, worst.ranks_per_node), (sizes, order, axis)
    for field in ("intra_bandwidth_GBps", "intra_latency_s", "inter_bandwidth_GBps", "inter_latency_s"):
        assert getattr(fast, field) == pytest.approx(getattr(worst, field), rel=1e-12, abs=1e-15), (field, sizes, order, axis)


@pytest.mark.parametrize("name", sorted(list_topologies()))
def test_every_preset_builds_a_graph_with_its_gpus(name):
    topology = load_topology(name)
    if topology.inter_node.nics_per_node and topology.gpus_per_node <= 8:
        topology = load_topology(name, nodes=2)
    graph = build_graph(topology)
    gpus = [n for n, data in graph.nodes(data=True) if data["kind"] == "gpu"]
    assert len(gpus) == topology.num_gpus
    assert all(graph.nodes[gpu]["device"] == topology.device.name for gpu in gpus)
    for _, _, data in graph.edges(data=True):
        assert data["bandwidth_GBps"] > 0 and data["latency_s"] >= 0 and data["kind"]
    import networkx as nx

    assert nx.is_connected(graph)


def test_graph_shapes():
    h100, graph = fabric("dgx-h100", 2)
    assert graph.has_edge(("gpu", 0, 3), ("switch", 0))
    assert graph.has_edge(("nic", 1, 5), ("rail", 5))
    mesh, mesh_graph = fabric("mi300x-8", 1)
    assert mesh_graph.edges[("gpu", 0, 0), ("gpu", 0, 7)]["bandwidth_GBps"] == pytest.approx(315.0 / 7)
    assert not any(kind == "switch" for _, kind in mesh_graph.nodes(data="kind"))
    p4d, _ = fabric("aws-p4d", 1)
    assert [nics_of_gpu(p4d, gpu) for gpu in range(8)] == [[0], [0], [1], [1], [2], [2], [3], [3]]
    p5, _ = fabric("aws-p5", 1)
    assert nics_of_gpu(p5, 1) == [4, 5, 6, 7]


def test_graph_tp_in_node_and_dp_across_nodes():
    topology, graph = fabric("dgx-h100", 2)
    tp = group_link_from_graph(graph, topology, list(range(8)))
    assert (tp.num_nodes, tp.ranks_per_node, tp.bandwidth_GBps) == (1, 8, 360.0)
    assert tp.intra_latency_s == pytest.approx(3e-6)
    dp = group_link_from_graph(graph, topology, [0, 8])
    assert (dp.num_nodes, dp.ranks_per_node) == (2, 1)
    assert dp.bandwidth_GBps == pytest.approx(45.0) and dp.latency_s == pytest.approx(5e-6)
    cross_rail = group_link_from_graph(graph, topology, [6, 7, 8, 9])  # no two members on one rail
    assert cross_rail.inter_latency_s == pytest.approx(5e-6) and cross_rail.bandwidth_GBps == pytest.approx(45.0)


@pytest.mark.parametrize("kind", ["dgx-h100", "mi300x-8", "aws-p4d", "aws-p5", "odd", "mesh6"])
@pytest.mark.parametrize("order", ORDERS)
def test_arithmetic_agrees_with_graph_on_common_layouts(kind, order):
    topology, graph = fabric(kind, 4)
    world = topology.num_gpus
    tp = min(topology.gpus_per_node, 4)
    for sizes in ({"tp": tp, "pp": 2, "dp": world // (2 * tp), "ep": 2},
                  {"tp": 2, "cp": 2, "dp": world // 8, "pp": 2, "ep": 4},
                  {"dp": world, "ep": topology.gpus_per_node}):
        sizes["ep"] = math.gcd(sizes["ep"], sizes["dp"] * sizes.get("cp", 1))
        for axis in LINK_AXES:
            assert_links_agree(topology, graph, sizes, order, axis)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kind=st.sampled_from(["dgx-h100", "mi300x-8", "aws-p4d", "odd", "mesh6"]),
    pp=st.integers(1, 3), dp=st.integers(1, 6), cp=st.integers(1, 2), tp=st.integers(1, 5),
    order=st.permutations(DEFAULT), ep_index=st.integers(0, 10), axis=st.sampled_from(LINK_AXES),
)
def test_arithmetic_agrees_with_graph_on_random_layouts(kind, pp, dp, cp, tp, order, ep_index, axis):
    divisors = [d for d in range(1, dp * cp + 1) if dp * cp % d == 0]
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": divisors[ep_index % len(divisors)]}
    world = pp * dp * cp * tp
    probe, _ = fabric(kind, 1)
    nodes = -(-world // probe.gpus_per_node)
    topology, graph = fabric(kind, nodes)
    assert_links_agree(topology, graph, sizes, tuple(order), axis)
