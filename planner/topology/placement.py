"""Rank placement and the link each parallel axis's process groups see, by arithmetic.

Layout (Megatron-LM's RankGenerator, torchtitan's DeviceMesh): the parallel axes are nested outermost to
innermost by `axis_order` (default ("pp", "dp", "cp", "tp"): tp innermost, so a TP group is adjacent ranks
inside one node). With sizes n_a, the stride of axis a is the product of the sizes of the axes inside it,
and rank = sum_a coord_a * stride_a. Rank r runs on node r // gpus_per_node as local rank r % gpus_per_node.

Expert parallelism ("ep") is not an axis of its own: as in Megatron-Core (`expert_model_parallel` groups,
parallel_state.initialize_model_parallel) expert groups are carved out of the ranks that share the pp and
tp coordinates (the dp x cp ranks, in rank order): consecutive chunks of `ep` of them form one EP group.

Link rule (what `axis_link` returns; planner.topology.graph derives the same from a graph):
- A group's `num_nodes` is the number of nodes its ranks occupy and `ranks_per_node` the most ranks it has
  on one node. An axis has many groups; the link reported is the worst one (most nodes, then most ranks on
  one node), so a layout that straddles node boundaries is costed by its straddling groups.
- Intra-node bandwidth: a switched fabric (NVSwitch, PCIe switch, loopback) gives every GPU its full
  per-GPU bandwidth to any peer. A point-to-point mesh (AMD Infinity Fabric, NVLink mesh) gives each GPU
  bandwidth / (gpus_per_node - 1) per peer link, and a group of k ranks on a node uses the k - 1 links to
  its peers (RCCL/NCCL run one channel per link): bandwidth * (k - 1) / (gpus_per_node - 1).
- Inter-node bandwidth: the per-rank share of the node's NICs when every GPU of the node communicates at
  once (all groups of an axis run their collectives together): nics_per_node * nic_bandwidth_GBps /
  gpus_per_node. On a rail-optimized fabric this is not reduced: the fabric is non-blocking for
  rail-aligned traffic (NVIDIA DGX SuperPOD reference architecture, "rail-optimized" network; Wang et al.
  2023, "Rail-only: A Low-Cost High-Performance Network for Training LLMs", Sec. 3) and NCCL keeps
  inter-node traffic on one rail (PXN, NCCL 2.12 release notes) by first moving data over NVLink to the
  GPU on the destination's rail. On a fat tree the share is divided by `oversubscription`: we do not model
  which nodes share a leaf switch, so every multi-node group is assumed to cross the oversubscribed
  leaf-to-spine links (conservative for groups that would fit under one leaf).
"""

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache

import numpy as np

from planner.errors import BadInputError
from planner.schemas.dims import ParallelDims
from planner.schemas.plan import AXES, RankEntry
from planner.schemas.topology import Topology
from planner.topology.groups import GroupLink

DEFAULT_AXIS_ORDER = AXES
LINK_AXES = (*AXES, "ep")
MESH_FABRICS = frozenset({"nvlink_mesh", "infinity_fabric"})


def _check_order(axis_order: Sequence[str]) -> tuple[str, ...]:
    order = tuple(axis_order)
    if sorted(order) != sorted(AXES):
        raise BadInputError(f"axis_order={list(order)} must be a permutation of {list(AXES)}: e.g. {list(AXES)}")
    return order


def _sizes_tuple(sizes: Mapping[str, int], axis_order: Sequence[str]) -> tuple[int, ...]:
    """Sizes of the layout axes in `axis_order` (missing axes are 1), validated."""
    for axis, size in sizes.items():
        if axis not in LINK_AXES:
            raise BadInputError(f"unknown parallel axis {axis!r} (size {size}): axes are {list(LINK_AXES)}")
        if not isinstance(size, int) or size < 1:
            raise BadInputError(f"{axis}={size!r} must be a positive integer")
    return tuple(int(sizes.get(axis, 1)) for axis in axis_order)


def axis_stride(sizes: Mapping[str, int], axis_order: Sequence[str], axis: str) -> int:
    """Rank distance between neighbours along `axis`: the product of the sizes of the axes inside it."""
    order = _check_order(axis_order)
    if axis not in order:
        raise BadInputError(f"axis={axis!r} is not a layout axis: choose one of {list(order)}")
    dims = _sizes_tuple(sizes, order)
    return math.prod(dims[order.index(axis) + 1 :])


def world_size(sizes: Mapping[str, int]) -> int:
    """Number of ranks of the layout: pp * dp * cp * tp (ep lives inside dp * cp)."""
    return math.prod(int(sizes.get(axis, 1)) for axis in AXES)


def _strides(dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(math.prod(dims[i + 1 :]) for i in range(len(dims)))


def _coords(rank: int, dims: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, ...]:
    return tuple((rank // stride) % size for size, stride in zip(dims, strides, strict=True))


def expert_fold(sizes: Mapping[str, int]) -> int:
    """How many tp ranks an expert group takes, for a sizes mapping (ParallelDims.expert_fold, the one rule)."""
    return ParallelDims(dp=int(sizes.get("dp", 1)), tp=int(sizes.get("tp", 1)), pp=1, cp=int(sizes.get("cp", 1)),
                        ep=int(sizes.get("ep", 1))).expert_fold


def _check_ep(sizes: Mapping[str, int]) -> int:
    expert_fold(sizes)
    return int(sizes.get("ep", 1))


def axis_groups(sizes: Mapping[str, int], axis_order: Sequence[str], axis: str) -> list[list[int]]:
    """Every process group of `axis` (a layout axis or "ep"), each a sorted list of ranks; groups sorted."""
    order = _check_order(axis_order)
    dims = _sizes_tuple(sizes, order)
    strides = _strides(dims)
    fold = 1
    if axis == "ep":
        ep, fold = _check_ep(sizes), expert_fold(sizes)
        shared = tuple(i for i, name in enumerate(order) if name in ("pp", "tp"))
    elif axis in order:
        shared = tuple(i for i, name in enumerate(order) if name != axis)
    else:
        raise BadInputError(f"axis={axis!r} is not a parallel axis: choose one of {list(LINK_AXES)}")
    buckets: dict[tuple[int, ...], list[int]] = {}
    for rank in range(math.prod(dims)):
        coords = _coords(rank, dims, strides)
        buckets.setdefault(tuple(coords[i] // (fold if order[i] == "tp" else 1) for i in shared), []).append(rank)
    groups = list(buckets.values())
    if axis == "ep":
        groups = [members[i : i + ep] for members in groups for i in range(0, len(members), ep)]
    return sorted(groups)


def rank_map(topology: Topology, sizes: Mapping[str, int], axis_order: Sequence[str] = DEFAULT_AXIS_ORDER) -> list[RankEntry]:
    """Where each rank runs and its coordinate on every layout axis (the LaunchPlan's `ranks`)."""
    order = _check_order(axis_order)
    dims = _sizes_tuple(sizes, order)
    _check_fits(topology, math.prod(dims))
    strides = _strides(dims)
    gpn = topology.gpus_per_node
    return [
        RankEntry(
            rank=rank,
            node=rank // gpn,
            local_rank=rank % gpn,
            coords=dict(zip(order, _coords(rank, dims, strides), strict=True)),
        )
        for rank in range(math.prod(dims))
    ]


def _check_fits(topology: Topology, world: int) -> None:
    if world > topology.num_gpus:
        raise BadInputError(
            f"the layout needs {world} ranks but topology {topology.name!r} has {topology.num_gpus} GPUs "
            f"({topology.num_nodes} nodes x {topology.gpus_per_node}): use --nodes {-(-world // topology.gpus_per_node)} or smaller degrees"
        )


# ---------------------------------------------------------------------------------------------------------
# Link arithmetic.


def node_stats(ranks: Iterable[int], gpus_per_node: int) -> tuple[int, int]:
    """(num_nodes, ranks_per_node) of one group: nodes it occupies, most ranks on one node."""
    counts = Counter(rank // gpus_per_node for rank in ranks)
    return len(counts), max(counts.values())


def intra_bandwidth_GBps(topology: Topology, ranks_per_node: int) -> float:
    """Bandwidth one rank of a group sees to its peers on the same node (see the module docstring)."""
    fabric = topology.intra_node
    gpn = topology.gpus_per_node
    if fabric.kind in MESH_FABRICS and gpn > 1 and ranks_per_node > 1:
        return fabric.bandwidth_GBps / (gpn - 1) * (ranks_per_node - 1)
    return fabric.bandwidth_GBps


def nic_share_GBps(topology: Topology) -> float:
    """Per-rank share of a node's NICs when all its GPUs send at once, after oversubscription (module docstring)."""
    net = topology.inter_node
    share = net.nics_per_node * net.nic_bandwidth_GBps / topology.gpus_per_node
    if net.topology == "fat_tree":
        share /= net.oversubscription
    return share


def make_link(topology: Topology, *, size: int, num_nodes: int, ranks_per_node: int) -> GroupLink:
    """The GroupLink of a group with the given node footprint on `topology`."""
    return GroupLink(
        size=size,
        ranks_per_node=ranks_per_node,
        num_nodes=num_nodes,
        intra_bandwidth_GBps=intra_bandwidth_GBps(topology, ranks_per_node),
        intra_latency_s=topology.intra_node.latency_s,
        inter_bandwidth_GBps=nic_share_GBps(topology),
        inter_latency_s=topology.inter_node.latency_s,
        intra_rates=intra_rates(topology),
    )


def intra_rates(topology: Topology) -> tuple[tuple[str, float, float], ...]:
    """GroupLink.intra_rates: the topology's measured per-collective rates inside a node, if any."""
    return tuple((name, rate.bandwidth_GBps, rate.latency_s) for name, rate in sorted(topology.intra_node.collectives.items()))


def _residues(axes: Iterable[tuple[int, int]], modulus: int) -> frozenset[int]:
    """{sum_a c_a * stride_a mod modulus : 0 <= c_a < size_a}: where group bases fall inside a node."""
    reached = {0}
    for stride, size in axes:
        steps = {(c * stride) % modulus for c in range(min(size, modulus))}
        reached = {(a + b) % modulus for a in reached for b in steps}
    return frozenset(reached)


def _worst_footprint(patterns: Iterable[tuple[int, ...]], residues: frozenset[int], gpn: int) -> tuple[int, int]:
    """Worst (num_nodes, ranks_per_node) over groups base + pattern, base mod gpn in `residues`.

    A group's node footprint depends only on its base modulo gpus_per_node (shifting by a node shifts
    every member by one node), so at most gpus_per_node bases need checking per pattern.
    """
    worst = (1, 1)
    for pattern in patterns:
        if len(pattern) > 1 and all(b - a >= gpn for a, b in zip(pattern, pattern[1:])):
            worst = max(worst, (len(pattern), 1))  # every member on its own node, whatever the base
            continue
        if len(pattern) <= 64:
            for base in residues:
                worst = max(worst, node_stats((base + offset for offset in pattern), gpn))
            continue
        offsets = np.asarray(pattern, dtype=np.int64)
        for base in residues:  # node_stats of base + a long pattern (up to the world size), in numpy
            counts = np.bincount((base + offsets) // gpn - (base + int(offsets.min())) // gpn)
            worst = max(worst, (int(np.count_nonzero(counts)), int(counts.max())))
    return worst


def _axis_pattern(dims: tuple[int, ...], order: tuple[str, ...], axis: str) -> tuple[tuple[int, ...], list[tuple[int, int]]]:
    """Offsets of one group of a layout axis relative to its lowest rank, and the (stride, size) of the
    other axes, which move the group's base."""
    strides = _strides(dims)
    index = order.index(axis)
    pattern = tuple(k * strides[index] for k in range(dims[index]))
    return pattern, [(strides[i], dims[i]) for i in range(len(order)) if i != index]


@lru_cache(maxsize=65536)
def _footprint(gpn: int, dims: tuple[int, ...], order: tuple[str, ...], axis: str, ep: int) -> tuple[int, int]:
    """Worst (num_nodes, ranks_per_node) of `axis`'s groups; cached on a hashable signature."""
    if axis != "ep":
        pattern, base_axes = _axis_pattern(dims, order, axis)
        return _worst_footprint([pattern], _residues(base_axes, gpn), gpn)
    if ep == 1:
        return (1, 1)
    strides = _strides(dims)
    inner = [i for i, name in enumerate(order) if name in ("dp", "cp")]
    base_axes = [(strides[i], dims[i]) for i, name in enumerate(order) if name in ("pp", "tp")]
    residues = _residues(base_axes, gpn)
    worst = (1, 1)
    for key in _chunk_shapes(dims[inner[0]], strides[inner[0]], dims[inner[1]], strides[inner[1]], ep, gpn):
        shifted = frozenset((r + key[-1]) % gpn for r in residues)
        worst = max(worst, _worst_footprint([tuple(key[:-1])], shifted, gpn))
    return worst


def _chunk_shapes(size_a: int, stride_a: int, size_b: int, stride_b: int, ep: int, gpn: int) -> list[list[int]]:
    """The distinct (offsets relative to the first rank..., first rank mod gpn) of the ep groups carved, in rank
    order, from the dp x cp ranks of one (pp, tp) coordinate (chunks with one shape and phase fall alike)."""
    grid = np.add.outer(np.arange(size_a) * stride_a, np.arange(size_b) * stride_b)
    chunks = np.sort(grid, axis=None).reshape(-1, ep)
    rows = np.ascontiguousarray(np.column_stack([chunks - chunks[:, :1], chunks[:, 0] % gpn]), dtype=np.int64)
    _, first = np.unique(rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).ravel(), return_index=True)
    return rows[np.sort(first)].tolist()


def _groups_footprint(gpn: int, groups: list[list[int]]) -> tuple[int, int]:
    """Worst (num_nodes, ranks_per_node) over explicit groups (folded expert groups: enumerated, exact)."""
    worst = (1, 1)
    for members in groups:
        per_node: dict[int, int] = {}
        for rank in members:
            per_node[rank // gpn] = per_node.get(rank // gpn, 0) + 1
        worst = max(worst, (len(per_node), max(per_node.values())))
    return worst


def axis_link(
    topology: Topology, sizes: Mapping[str, int], axis_order: Sequence[str] = DEFAULT_AXIS_ORDER, axis: str = "tp"
) -> GroupLink:
    """The link the groups of `axis` (pp, dp, cp, tp or ep) see under this layout, by arithmetic.

    Equal to planner.topology.graph.group_link_from_graph on the worst group of the axis (tests check it).
    """
    order = _check_order(axis_order)
    dims = _sizes_tuple(sizes, order)
    _check_fits(topology, math.prod(dims))
    if axis == "ep":
        size = _check_ep(sizes)
    elif axis in order:
        size = dims[order.index(axis)]
    else:
        raise BadInputError(f"axis={axis!r} is not a parallel axis: choose one of {list(LINK_AXES)}")
    if axis == "ep" and expert_fold(sizes) > 1:
        num_nodes, ranks_per_node = _groups_footprint(topology.gpus_per_node, axis_groups(sizes, order, "ep"))
    else:
        num_nodes, ranks_per_node = _footprint(topology.gpus_per_node, dims, order, axis, size if axis == "ep" else 1)
    return make_link(topology, size=size, num_nodes=num_nodes, ranks_per_node=ranks_per_node)


def hsdp_links(topology: Topology, sizes: Mapping[str, int], axis_order: Sequence[str], dp_replicate: int
               ) -> tuple[GroupLink, GroupLink]:
    """(shard, replicate) links of HSDP's 2-D dp mesh: the dp coordinate d splits into (d // dp_shard, d % dp_shard)
    with dp_shard = dp / dp_replicate (planner.executor.parallelize.hsdp_mesh, torchtitan's [dp_replicate,
    dp_shard] mesh), so a shard group is dp_shard consecutive dp coordinates (stride: dp's) and a replicate group
    steps dp_shard dp coordinates at a time. Worst group of each, as axis_link."""
    order = _check_order(axis_order)
    dims = _sizes_tuple(sizes, order)
    _check_fits(topology, math.prod(dims))
    dp = dims[order.index("dp")]
    if dp_replicate < 1 or dp % dp_replicate:
        raise BadInputError(f"dp_replicate={dp_replicate} must divide dp={dp}: choose a divisor of dp, or 1")
    at = order.index("dp")
    split_order = (*order[:at], "dp_replicate", "dp_shard", *order[at + 1:])
    split_dims = (*dims[:at], dp_replicate, dp // dp_replicate, *dims[at + 1:])
    links = []
    for axis in ("dp_shard", "dp_replicate"):
        num_nodes, ranks_per_node = _footprint(topology.gpus_per_node, split_dims, split_order, axis, 1)
        links.append(make_link(topology, size=split_dims[split_order.index(axis)], num_nodes=num_nodes,
                               ranks_per_node=ranks_per_node))
    return links[0], links[1]


def worst_link_key(link: GroupLink) -> tuple[int, int]:
    """Order in which groups are 'worse': more nodes, then more ranks on one node."""
    return (link.num_nodes, link.ranks_per_node)
