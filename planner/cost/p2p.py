"""The pipeline's point-to-point term of a step (the breakdown's pp_comm_s), read by evaluate and, over the
cheapest pp footprint, by the search's bounds (planner.cost.bounds.pp_comm_floor_s).

It sits below both so that evaluate need not reach up into the bounds: one formula, two readers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from planner.cost import comm
from planner.cost.memory import p2p_activation_bytes
from planner.schedules import schedule as schedule_of

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate


def p2p_transfers(model: "CostModel", cand: "Candidate") -> int:
    """The sequential boundary transfers of the candidate's schedule (planner.schedules.Schedule.p2p_transfers)."""
    return schedule_of(cand.schedule).p2p_transfers(pp=cand.pp, vpp=cand.vpp, num_microbatches=cand.num_microbatches,
                                  overlapped=model.options.pp_overlap)


def p2p_bytes(model: "CostModel", cand: "Candidate") -> float:
    """One boundary send: s*b*h bf16 (/t with SP); with the scatter/gather optimisation (Narayanan et al. 2021,
    Sec. 4.1: each of the t TP ranks sends 1/t of the replicated tensor over the NIC and the receiver all-gathers
    it over NVLink) also /t without SP. The NVLink all-gather is not charged (bytes / NVLink bandwidth, ~10x less)."""
    size = p2p_activation_bytes(model.spec, model.shape(cand))
    if model.options.pp_scatter_gather and not cand.sp:
        size /= cand.tp
    return size


def pp_comm_s(model: "CostModel", cand: "Candidate") -> float:
    """Pipeline point-to-point time of one step (the breakdown's pp_comm_s): 2 directions x the sequential
    boundary transfers of the schedule (planner.schedules.Schedule.p2p_transfers) x one activation send."""
    transfers = p2p_transfers(model, cand)
    if transfers == 0:
        return 0.0
    return 2 * transfers * comm.p2p_s(p2p_bytes(model, cand), group=model.links(cand).pp)
