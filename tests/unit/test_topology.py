"""Topology presets, loading and scaling, rank placement and the arithmetic group links."""

import math

import pytest

from planner.errors import BadInputError
from planner.schemas.topology import Topology
from planner.topology import list_topologies, load_topology, topologies_dir
from planner.topology.placement import axis_groups, axis_link, axis_stride, rank_map

DEFAULT = ("pp", "dp", "cp", "tp")
EXPECTED_PRESETS = {
    "aws-p4d", "aws-p5", "cpu", "dgx-a100-40g", "dgx-a100-80g", "dgx-b200", "dgx-h100", "dgx2-v100",
    "gb200-nvl72", "hgx-h200", "hgx-h800", "mi300x-8",
}


def custom(**changes) -> Topology:
    """dgx-h100 with some fields changed (nested fields as 'section__field')."""
    data = load_topology("dgx-h100").model_dump()
    for key, value in changes.items():
        if "__" in key:
            section, field = key.split("__")
            data[section][field] = value
        else:
            data[key] = value
    return Topology.model_validate(data)


def test_shipped_presets_all_load_with_sources():
    assert EXPECTED_PRESETS <= set(list_topologies())
    for name in list_topologies():
        topology = load_topology(name)
        assert topology.name == name
        assert topology.num_nodes == 1
        assert topology.source.strip(), f"{name} has no source for its numbers"
        assert topology.intra_node.bandwidth_GBps > 0


def test_device_numbers_are_the_vendors():
    h100 = load_topology("dgx-h100").device
    assert h100.memory_bytes == 81559 * 2**20  # nvidia-smi total for H100 80GB, not 80 GiB
    assert h100.peak_bf16_tflops == 989.0
    assert load_topology("dgx-a100-80g").device.peak_bf16_tflops == 312.0
    assert load_topology("dgx-b200").device.peak_bf16_tflops == 2250.0
    assert load_topology("gb200-nvl72").device.peak_bf16_tflops == 2500.0
    assert load_topology("mi300x-8").device.peak_bf16_tflops == 1307.4
    assert load_topology("gb200-nvl72").gpus_per_node == 72
    assert load_topology("aws-p5").inter_node.nics_per_node * 100 == 3200  # 32 x 100 Gb/s EFA
    # achieved numbers sit below the datasheet's per-direction peak
    assert load_topology("dgx-h100").intra_node.bandwidth_GBps < 450
    assert load_topology("dgx-a100-80g").intra_node.bandwidth_GBps < 300


def test_scaling_by_nodes_and_gpus():
    assert load_topology("dgx-h100", nodes=4).num_gpus == 32
    assert load_topology("dgx-h100", gpus=64).num_nodes == 8
    assert load_topology("dgx-h100", gpus=4).num_nodes == 1
    assert load_topology("dgx-h100", nodes=3, gpus=20).num_nodes == 3
    assert load_topology("gb200-nvl72", gpus=144).num_nodes == 2


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"gpus": 12}, "gpus=12 is not a multiple of gpus_per_node=8"),
        ({"nodes": 2, "gpus": 24}, "gpus=24 is more than nodes=2"),
        ({"nodes": 0}, "nodes=0"),
        ({"gpus": 0}, "gpus=0"),
    ],
)
def test_bad_scaling_names_the_problem(kwargs, needle):
    with pytest.raises(BadInputError, match=needle):
        load_topology("dgx-h100", **kwargs)


def test_cpu_box_cannot_span_nodes():
    with pytest.raises(BadInputError, match="no inter-node NICs"):
        load_topology("cpu", nodes=2)


def test_unknown_preset_suggests_close_names():
    with pytest.raises(BadInputError, match="did you mean dgx-h100"):
        load_topology("dgx-h10")


def test_file_errors(tmp_path):
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("name: x\ndevice: [unclosed\n")
    with pytest.raises(BadInputError, match="malformed YAML at line"):
        load_topology(str(bad_yaml))
    missing = tmp_path / "missing.yaml"
    data = load_topology("dgx-h100").model_dump(mode="json")
    del data["intra_node"]
    import yaml

    missing.write_text(yaml.safe_dump(data))
    with pytest.raises(BadInputError, match="intra_node: Field required"):
        load_topology(str(missing))
    data = load_topology("dgx-h100").model_dump(mode="json")
    data["device"]["memory_bytes"] = -1
    missing.write_text(yaml.safe_dump(data))
    with pytest.raises(BadInputError, match=r"device.memory_bytes.*got -1"):
        load_topology(str(missing))


def test_presets_folder_can_be_overridden(tmp_path, monkeypatch):
    data = load_topology("dgx-h100").model_dump(mode="json")
    data["name"] = "my-cluster"
    import yaml

    (tmp_path / "my-cluster.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("PLANNER_TOPOLOGIES", str(tmp_path))
    assert topologies_dir() == tmp_path
    assert list_topologies() == ["my-cluster"]
    assert load_topology("my-cluster", nodes=2).num_gpus == 16


# --- placement --------------------------------------------------------------------------------------


def test_strides_and_groups_default_layout():
    sizes = {"pp": 2, "dp": 2, "tp": 4}
    assert axis_stride(sizes, DEFAULT, "tp") == 1
    assert axis_stride(sizes, DEFAULT, "dp") == 4
    assert axis_stride(sizes, DEFAULT, "pp") == 8
    assert axis_groups(sizes, DEFAULT, "tp") == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert axis_groups(sizes, DEFAULT, "dp")[0] == [0, 4]
    assert axis_groups(sizes, DEFAULT, "pp")[0] == [0, 8]


@pytest.mark.parametrize("order", [DEFAULT, ("tp", "cp", "dp", "pp"), ("dp", "tp", "pp", "cp"), ("cp", "pp", "tp", "dp")])
def test_rank_map_inverts_the_layout(order):
    sizes = {"pp": 2, "dp": 3, "cp": 2, "tp": 2}
    topology = load_topology("dgx-h100", nodes=3)
    entries = rank_map(topology, sizes, order)
    assert [entry.rank for entry in entries] == list(range(24))
    seen = set()
    for entry in entries:
        assert entry.node == entry.rank // 8 and entry.local_rank == entry.rank % 8
        assert sum(entry.coords[axis] * axis_stride(sizes, order, axis) for axis in order) == entry.rank
        assert all(0 <= entry.coords[axis] < sizes[axis] for axis in order)
        seen.add(tuple(entry.coords[axis] for axis in order))
    assert len(seen) == 24
    for axis in order:  # a group of an axis = ranks equal on every other coordinate
        for group in axis_groups(sizes, order, axis):
            others = {tuple(v for k, v in entries[r].coords.items() if k != axis) for r in group}
            assert len(others) == 1 and sorted(entries[r].coords[axis] for r in group) == list(range(sizes[axis]))


def test_rank_map_rejects_too_many_ranks():
    with pytest.raises(BadInputError, match="needs 16 ranks"):
        rank_map(load_topology("dgx-h100"), {"dp": 2, "tp": 8}, DEFAULT)


def test_expert_groups_are_contiguous_dp_ranks():
    # Megatron-Core: EP groups are consecutive ranks of the dp (x cp) group sharing the tp coordinate
    sizes = {"dp": 4, "tp": 2, "ep": 2}
    assert axis_groups(sizes, DEFAULT, "ep") == [[0, 2], [1, 3], [4, 6], [5, 7]]
    sizes = {"dp": 4, "cp": 2, "ep": 4}
    assert axis_groups(sizes, DEFAULT, "ep") == [[0, 1, 2, 3], [4, 5, 6, 7]]
    for group in axis_groups({"pp": 2, "dp": 4, "tp": 2, "ep": 4}, DEFAULT, "ep"):
        assert len(group) == 4
    with pytest.raises(BadInputError, match=r"ep=3 must divide dp\*cp=4"):
        axis_groups({"dp": 4, "ep": 3}, DEFAULT, "ep")


# --- links by arithmetic ----------------------------------------------------------------------------


def test_tp_inside_a_dgx_node_sees_nvlink():
    topology = load_topology("dgx-h100", nodes=4)
    link = axis_link(topology, {"tp": 8, "dp": 4}, DEFAULT, "tp")
    assert (link.size, link.num_nodes, link.ranks_per_node) == (8, 1, 8)
    assert link.bandwidth_GBps == topology.intra_node.bandwidth_GBps == 360.0
    assert link.latency_s == topology.intra_node.latency_s


def test_dp_across_nodes_sees_the_nic_share():
    topology = load_topology("dgx-h100", nodes=4)
    link = axis_link(topology, {"tp": 8, "dp": 4}, DEFAULT, "dp")
    assert (link.size, link.num_nodes, link.ranks_per_node) == (4, 4, 1)
    assert link.bandwidth_GBps == pytest.approx(8 * 45.0 / 8)
    p4d = load_topology("aws-p4d", nodes=4)  # 4 x EFA shared by 8 GPUs
    assert axis_link(p4d, {"tp": 8, "dp": 4}, DEFAULT, "dp").bandwidth_GBps == pytest.approx(4 * 11.0 / 8)
    p5 = load_topology("aws-p5", nodes=2)  # 32 x EFA, 4 per GPU
    assert axis_link(p5, {"tp": 8, "dp": 2}, DEFAULT, "dp").bandwidth_GBps == pytest.approx(32 * 11.0 / 8)


def test_oversubscribed_fat_tree_divides_rail_optimized_does_not():
    fat = custom(num_nodes=2, inter_node__topology="fat_tree", inter_node__oversubscription=2.0)
    rail = custom(num_nodes=2, inter_node__topology="rail_optimized", inter_node__oversubscription=2.0)
    sizes = {"tp": 8, "dp": 2}
    assert axis_link(fat, sizes, DEFAULT, "dp").bandwidth_GBps == pytest.approx(45.0 / 2)
    assert axis_link(rail, sizes, DEFAULT, "dp").bandwidth_GBps == pytest.approx(45.0)


def test_tp_outermost_puts_tp_across_nodes():
    topology = load_topology("dgx-h100", nodes=2)
    link = axis_link(topology, {"tp": 2, "dp": 8}, ("tp", "pp", "dp", "cp"), "tp")
    assert (link.num_nodes, link.ranks_per_node) == (2, 1)
    assert link.bandwidth_GBps == pytest.approx(45.0)


def test_groups_straddling_nodes_are_costed_by_the_worst():
    topology = load_topology("dgx-h100", nodes=3)
    link = axis_link(topology, {"tp": 3, "dp": 8}, DEFAULT, "tp")  # group {6, 7, 8} spans two nodes
    assert (link.num_nodes, link.ranks_per_node) == (2, 2)
    assert link.bandwidth_GBps == pytest.approx(45.0)


def test_mesh_fabric_gives_a_small_group_fewer_links():
    topology = load_topology("mi300x-8")
    per_link = 315.0 / 7
    for tp in (2, 4, 8):
        link = axis_link(topology, {"tp": tp, "dp": 8 // tp}, DEFAULT, "tp")
        assert link.bandwidth_GBps == pytest.approx(per_link * (tp - 1))


def test_expert_links():
    topology = load_topology("dgx-h100", nodes=4)
    inside = axis_link(topology, {"tp": 1, "dp": 32, "ep": 8}, DEFAULT, "ep")
    assert (inside.size, inside.num_nodes, inside.ranks_per_node) == (8, 1, 8)
    across = axis_link(topology, {"tp": 8, "dp": 4, "ep": 4}, DEFAULT, "ep")
    assert (across.size, across.num_nodes, across.ranks_per_node) == (4, 4, 1)
    half = axis_link(topology, {"tp": 2, "dp": 16, "ep": 8}, DEFAULT, "ep")
    assert (half.num_nodes, half.ranks_per_node) == (2, 4)


def test_axis_link_rejects_bad_input():
    topology = load_topology("dgx-h100")
    with pytest.raises(BadInputError, match="needs 16 ranks"):
        axis_link(topology, {"tp": 16}, DEFAULT, "tp")
    with pytest.raises(BadInputError, match="axis_order"):
        axis_link(topology, {"tp": 8}, ("tp", "dp"), "tp")
    with pytest.raises(BadInputError, match="not a parallel axis"):
        axis_link(topology, {"tp": 8}, DEFAULT, "sp")
    with pytest.raises(BadInputError, match="unknown parallel axis"):
        axis_link(topology, {"xp": 2}, DEFAULT, "tp")


def test_axis_link_is_fast_on_large_layouts():
    import time

    topology = load_topology("gb200-nvl72", nodes=32)
    start = time.perf_counter()
    calls = 0
    for tp in (1, 2, 4, 8):
        for pp in (1, 2, 4, 8, 16):
            dp = topology.num_gpus // (tp * pp)
            for axis in ("tp", "dp", "pp", "ep"):
                sizes = {"tp": tp, "pp": pp, "dp": dp, "ep": math.gcd(dp, 64)}
                axis_link(topology, sizes, DEFAULT, axis)
                calls += 1
    first_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(2000):
        axis_link(topology, {"tp": 8, "pp": 4, "dp": 72, "ep": 8}, DEFAULT, "dp")
    cached_s = (time.perf_counter() - start) / 2000
    assert first_s < 10.0, f"{calls} uncached calls on 2304 GPUs took {first_s:.2f} s"
    assert cached_s < 1e-3, f"cached call {cached_s * 1e6:.0f} us"


def test_loading_topologies_does_not_import_networkx_or_torch():
    import subprocess
    import sys

    code = (
        "import sys; from planner.topology import load_topology; from planner.topology.placement import axis_link; "
        "axis_link(load_topology('dgx-h100', nodes=2), {'tp': 8, 'dp': 2}, ('pp', 'dp', 'cp', 'tp'), 'dp'); "
        "print(sorted(m for m in ('networkx', 'torch') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
