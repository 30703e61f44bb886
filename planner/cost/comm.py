"""Collective communication times on a GroupLink (alpha-beta model: time = latency terms + bytes / bandwidth).

Bandwidths are achieved per-GPU per-direction bus bandwidths (GB/s = 1e9 B/s), so the nccl-tests bus-bandwidth
factors apply: ring all-reduce moves 2(n-1)/n of the buffer through each GPU, all-gather and reduce-scatter
(n-1)/n (Thakur et al. 2005, "Optimization of collective communication operations in MPICH"; NCCL's
nccl-tests PERFORMANCE.md). A group spanning nodes is costed hierarchically (intra-node reduce-scatter, inter-node
ring on 1/ranks_per_node of the data over the rank's NIC share, intra-node all-gather), which is what NCCL's
tree/ring-across-nodes achieves in bus-bandwidth terms.
"""

from __future__ import annotations

from planner.topology.groups import GroupLink


def _bytes_per_s(bandwidth_GBps: float) -> float:
    return bandwidth_GBps * 1e9


def _ring_s(num_bytes: float, n: int, bandwidth_GBps: float, latency_s: float, *, factor: float) -> float:
    """One ring phase structure: factor*(n-1)/n * bytes / bw + factor*(n-1) * latency (factor 2 for all-reduce)."""
    if n <= 1 or num_bytes <= 0:
        return 0.0
    return factor * (n - 1) / n * num_bytes / _bytes_per_s(bandwidth_GBps) + factor * (n - 1) * latency_s


def ring_all_reduce_s(num_bytes: float, *, group: GroupLink) -> float:
    """Ring all-reduce: 2(n-1)/n * bytes / bandwidth + 2(n-1) * latency; hierarchical across nodes."""
    if group.size <= 1:
        return 0.0
    bandwidth, latency = group.intra("all_reduce")
    if not group.spans_nodes:
        return _ring_s(num_bytes, group.size, bandwidth, latency, factor=2)
    rpn, nodes = group.ranks_per_node, group.num_nodes
    intra = _ring_s(num_bytes, rpn, bandwidth, latency, factor=2)
    inter = _ring_s(num_bytes / rpn, nodes, group.inter_bandwidth_GBps, group.inter_latency_s, factor=2)
    return intra + inter


def all_gather_s(num_bytes: float, *, group: GroupLink) -> float:
    """All-gather of a `num_bytes` result (each rank holds num_bytes/n): (n-1)/n * bytes / bw + (n-1) * latency."""
    return _half_ring_s(num_bytes, group, "all_gather")


def reduce_scatter_s(num_bytes: float, *, group: GroupLink) -> float:
    """Reduce-scatter of a `num_bytes` input: the same traffic as all-gather, (n-1)/n * bytes / bw (its own
    measured rates where the link has them: gloo's reduce-scatter is slower than its all-gather)."""
    return _half_ring_s(num_bytes, group, "reduce_scatter")


def _half_ring_s(num_bytes: float, group: GroupLink, collective: str) -> float:
    if group.size <= 1 or num_bytes <= 0:
        return 0.0
    bandwidth, _ = group.intra(collective)
    if not group.spans_nodes:
        moved = _ring_s(num_bytes, group.size, bandwidth, 0.0, factor=1)
    else:
        rpn, nodes = group.ranks_per_node, group.num_nodes
        moved = (_ring_s(num_bytes, rpn, bandwidth, 0.0, factor=1)
                 + _ring_s(num_bytes / rpn, nodes, group.inter_bandwidth_GBps, 0.0, factor=1))
    return moved + half_ring_latency_s(group, collective)


def half_ring_latency_s(group: GroupLink, collective: str = "all_gather") -> float:
    """The fixed part of one all-gather or reduce-scatter: NCCL runs both as a ring over every rank of the group
    (the only algorithm it has for them, NCCL 2.x before PAT; a ring crosses a node boundary nodes-1 times), so
    one collective takes n-1 steps, nodes-1 of them over the network and the other n-nodes over NVLink
    (NVIDIA/nccl src/graph/tuning.cc, ncclTopoTuneModel: nsteps = nRanks-1, nInterSteps = nNodes-1, latency
    (nsteps-nInterSteps)*intraLat + nInterSteps*interLat). The bandwidth part is unchanged by this: each channel's
    ring crosses its own NIC, which is the hierarchical bus bandwidth above. A network step costs at least an
    NVLink step (NCCL's hwLat table: NET above NVLINK), so the latency grows with the nodes a group spans at a fixed
    size, what the search's placement floor (planner.cost.bounds) relies on."""
    if group.size <= 1:
        return 0.0
    _, latency = group.intra(collective)
    if not group.spans_nodes:
        return (group.size - 1) * latency
    nodes = group.num_nodes
    return (group.size - nodes) * latency + (nodes - 1) * max(group.inter_latency_s, latency)


def flat_ring_s(num_bytes: float, *, group: GroupLink) -> float:
    """All-gather or reduce-scatter as one flat ring over all ranks: (n-1)/n * bytes through each rank's slowest
    link (its NIC share when the group spans nodes) + (n-1) latencies; no per-node aggregation."""
    if not group.spans_nodes:
        return _half_ring_s(num_bytes, group, "all_gather")
    return _ring_s(num_bytes, group.size, group.inter_bandwidth_GBps, group.inter_latency_s, factor=1)


def all_to_all_s(num_bytes: float, *, group: GroupLink) -> float:
    """All-to-all where each rank sends `num_bytes` spread evenly over the n ranks: (rpn-1)/n of it stays on the
    node (NVLink), (n-rpn)/n crosses the NICs; both proceed at once, the slower bounds; (n-1) latencies."""
    n = group.size
    if n <= 1 or num_bytes <= 0:
        return 0.0
    rpn = group.ranks_per_node
    bandwidth, latency = group.intra("all_to_all")
    intra = (rpn - 1) / n * num_bytes / _bytes_per_s(bandwidth)
    inter = (n - rpn) / n * num_bytes / _bytes_per_s(group.inter_bandwidth_GBps) if group.spans_nodes else 0.0
    return max(intra, inter) + (n - 1) * (group.inter_latency_s if group.spans_nodes else latency)


def hierarchical_all_to_all_s(num_bytes: float, *, top_k: int, group: GroupLink, max_nodes: int | None = None,
                              fanout: int = 1) -> float:
    """MoE dispatch (or combine) that crosses the NICs once per destination node and fans out over NVLink there
    (DeepSeek-V3 report Sec. 3.2.2 and DeepEP; Megatron-Core's flex dispatcher). `num_bytes` = tokens * top_k * h
    * 2 sent by this rank. With N nodes in the group and top_k experts picked uniformly, a token reaches
    N * (1 - (1 - 1/N)^top_k) distinct nodes, (N - 1)/N of them remote: that many copies cross the NICs instead of
    top_k * (n - rpn)/n. Where routing is limited to `max_nodes` nodes (DeepSeek-V3's node-limited routing,
    report Sec. 2.1.2: group-limited top-k whose groups are whole nodes, moe_comm.routed_node_limit), the top_k
    experts fall on those M nodes: M * (1 - (1 - 1/M)^top_k) distinct nodes, each the token's own node with chance
    1/N. The NVLink side moves the on-node share as in all_to_all_s; the slower side bounds. `fanout`: each copy
    goes on to that many ranks of its destination node (the expert-TP ranks of an expert, Megatron-Core's flex
    dispatcher over the tp x ep group: MoEFlexTokenDispatcher, token_dispatcher.py, router_topk = tp_size * topk),
    which multiplies the NVLink bytes, not the NIC bytes."""
    n, rpn, nodes = group.size, group.ranks_per_node, group.num_nodes
    if n <= 1 or num_bytes <= 0:
        return 0.0
    if not group.spans_nodes or nodes <= 1:
        return all_to_all_s(num_bytes * fanout, group=group)
    bandwidth, _ = group.intra("all_to_all")
    per_copy = num_bytes / top_k
    if max_nodes is not None and max_nodes < nodes:
        reached = max_nodes * (1 - (1 - 1 / max_nodes) ** top_k)
        remote_nodes = reached * (1 - 1 / nodes)  # a reached node is the token's own with chance 1/N
    else:
        remote_nodes = nodes * (1 - (1 - 1 / nodes) ** top_k) * (nodes - 1) / nodes
    intra = (rpn - 1) / n * num_bytes * fanout / _bytes_per_s(bandwidth)
    inter = remote_nodes * per_copy / _bytes_per_s(group.inter_bandwidth_GBps)
    return max(intra, inter) + (nodes - 1) * group.inter_latency_s + (rpn - 1) * group.intra_latency_s


def p2p_s(num_bytes: float, *, group: GroupLink) -> float:
    """Point-to-point send between neighbouring pipeline stages: bytes / bw + latency."""
    if group.size <= 1 or num_bytes <= 0:
        return 0.0
    if not group.spans_nodes:
        bandwidth, latency = group.intra("send_recv")
        return num_bytes / _bytes_per_s(bandwidth) + latency
    return num_bytes / _bytes_per_s(group.bandwidth_GBps) + group.latency_s


def chunked_overlap_exposed_s(comm_s: float, gemm_s: float, *, chunks: int) -> float:
    """Exposed time of a TP all-gather/reduce-scatter pipelined with its dependent GEMM in `chunks` pieces
    (Transformer Engine userbuffers ring-exchange, Megatron-Core --tp-comm-overlap; Wang et al. 2023, "Overlap
    Communication with Dependent Computation via Decomposition in Large Deep Learning Models", Sec. 3): each
    chunk's transfer runs under the previous chunk's GEMM, so the first chunk (comm / chunks) is never hidden and
    what exceeds the GEMM time stays exposed."""
    if comm_s <= 0:
        return 0.0
    return max(comm_s / max(chunks, 1), comm_s - gemm_s)


def domino_exposed_s(comm_s: float, compute_s: float) -> float:
    """Exposed TP communication under Domino (Wang et al. 2024, "Domino: Eliminating Communication in LLM
    Training via Generic Tensor Slicing and Overlapping", Sec. 3): the batch is split in two halves and one
    half's all-reduce runs under the other half's compute. The bound: the last half's collective is never
    hidden (>= comm/2), and at most one half's compute can hide the rest (>= comm - compute/2)."""
    return max(comm_s / 2, comm_s - compute_s / 2)
