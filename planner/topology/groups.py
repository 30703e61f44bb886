"""Process groups on a topology: which links a group spans, and the bandwidth and latency it sees.

CONTRACT (used by planner.cost.comm): `GroupLink` describes one process group of `size` ranks laid out as
`ranks_per_node` ranks on each of `num_nodes` nodes. Collectives are costed hierarchically from the intra-node
and inter-node components; `bandwidth_GBps` is the slowest link the group spans.
"""

from dataclasses import dataclass, replace


@dataclass(frozen=True, kw_only=True)
class GroupLink:
    size: int
    ranks_per_node: int
    num_nodes: int
    intra_bandwidth_GBps: float
    intra_latency_s: float
    inter_bandwidth_GBps: float  # per-rank share of the node's NICs when every rank of the node communicates at once
    inter_latency_s: float
    # Measured (collective, bandwidth_GBps, latency_s) inside a node (IntraNodeFabric.collectives, from
    # `planner profile comm`): a collective listed here uses its own rates instead of the two above.
    intra_rates: tuple[tuple[str, float, float], ...] = ()

    def intra(self, collective: str) -> tuple[float, float]:
        """(bandwidth_GBps, latency_s) of `collective` inside a node: its measured rates, else the fabric's."""
        for name, bandwidth, latency in self.intra_rates:
            if name == collective:
                return bandwidth, latency
        return self.intra_bandwidth_GBps, self.intra_latency_s

    def without_latency(self) -> "GroupLink":
        """The same link with every latency 0 (search bounds drop the fixed terms)."""
        rates = tuple((name, bandwidth, 0.0) for name, bandwidth, _ in self.intra_rates)
        return replace(self, intra_latency_s=0.0, inter_latency_s=0.0, intra_rates=rates)

    @property
    def spans_nodes(self) -> bool:
        return self.num_nodes > 1

    @property
    def bandwidth_GBps(self) -> float:
        """The slowest link the group spans (NVLink inside a node, the NIC share across nodes)."""
        if self.size <= 1:
            return float("inf")
        if self.spans_nodes:
            return min(self.intra_bandwidth_GBps, self.inter_bandwidth_GBps) if self.ranks_per_node > 1 else self.inter_bandwidth_GBps
        return self.intra_bandwidth_GBps

    @property
    def latency_s(self) -> float:
        return self.inter_latency_s if self.spans_nodes else self.intra_latency_s
