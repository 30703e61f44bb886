"""The process-group links of a candidate's layout, from planner.topology.placement (rank arithmetic)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from planner.cost.layer_terms import Links
from planner.schemas.topology import Topology
from planner.topology.placement import axis_link, hsdp_links

if TYPE_CHECKING:
    from planner.cost.types import Candidate


def candidate_links(topology: Topology, cand: "Candidate") -> Links:
    """Links of the tp, cp, ep, dp and pp groups. The data-parallel gradient reduction runs over the dp x cp
    ranks (Megatron-LM reduces over the combined data/context-parallel group): we cost it on the dp axis's node
    footprint with size dp*cp (exact when cp = 1), and the experts' over dp*cp/ep ranks. HSDP (dp_replicate > 1):
    dp and expert_dp are the shard groups' (placement.hsdp_links, size Candidate.zero_shard / expert_shard) and
    dp_replicate the replicas' all-reduce group."""
    sizes = cand.sizes()
    order = tuple(cand.axis_order)
    if cand.dp_replicate > 1:
        shard, replicate = hsdp_links(topology, sizes, order, cand.dp_replicate)
        return Links(
            tp=axis_link(topology, sizes, order, "tp"), cp=axis_link(topology, sizes, order, "cp"),
            ep=axis_link(topology, sizes, order, "ep"), pp=axis_link(topology, sizes, order, "pp"),
            dp=dataclasses.replace(shard, size=cand.zero_shard),
            expert_dp=dataclasses.replace(shard, size=cand.expert_shard), dp_replicate=replicate)
    dp = axis_link(topology, sizes, order, "dp")
    return Links(
        tp=axis_link(topology, sizes, order, "tp"),
        cp=axis_link(topology, sizes, order, "cp"),
        ep=axis_link(topology, sizes, order, "ep"),
        dp=dataclasses.replace(dp, size=cand.dp_cp),
        expert_dp=dataclasses.replace(dp, size=cand.expert_dp),
        pp=axis_link(topology, sizes, order, "pp"),
    )
