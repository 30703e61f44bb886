"""The seam between the analytic model and measured profiles.

When a CostModel has a Profile, the compute times of each decoder layer type come from
planner.cost.profiled.profiled_layer_costs (owned by the profiler) at the candidate's tp, ep, micro-batch
size and sequence length; communication (TP, EP, CP) and memory stay analytic, and layer types or shapes the
profile does not cover stay analytic too. The CostModel records which shapes were measured and which analytic
so that the LaunchPlan's notes can say so.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from planner.cost.layer_terms import ModuleCost

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate


def _lookup(model: "CostModel", cand: "Candidate", layer_type: str):
    try:
        from planner.cost.profiled import profiled_layer_costs
    except ModuleNotFoundError as exc:
        if exc.name != "planner.cost.profiled":
            raise
        return None
    return profiled_layer_costs(model.profile, layer_type=layer_type, tp=cand.tp, ep=cand.ep,
                                microbatch_size=cand.microbatch_size, seq_len=model.request.seq_len)


def _measured_cost(analytic: ModuleCost, measured) -> ModuleCost:
    """The analytic module with measured compute times and, when the profile has them, measured saved bytes."""
    changes = {
        "compute_fwd_s": float(measured.forward_s),
        "compute_bwd_s": float(measured.backward_s),
        "selective_s": float(getattr(measured, "recompute_selective_s", 0.0) or 0.0),
        "recompute_compute_s": None,  # a full recompute reruns the measured forward
    }
    for ours, theirs in (("act_none", "saved_bytes"), ("act_selective", "saved_bytes_selective"), ("act_full", "saved_bytes_full")):
        value = getattr(measured, theirs, None)
        if value:
            changes[ours] = float(value)
    return dataclasses.replace(analytic, **changes)


def apply_profile(model: "CostModel", cand: "Candidate", kinds: dict[str, ModuleCost]) -> dict[str, ModuleCost]:
    """Replace the compute times of the profiled module types ("embedding", "decoder", "moe_decoder", "head");
    keep the analytic ones for the rest."""
    out: dict[str, ModuleCost] = {}
    for layer_type, analytic in kinds.items():
        name = f"{layer_type}(tp={cand.tp}, ep={cand.ep}, microbatch_size={cand.microbatch_size}, seq_len={model.request.seq_len})"
        measured = _lookup(model, cand, layer_type)
        if measured is None:
            model.analytic_shapes.add(name)
            out[layer_type] = analytic
        else:
            model.profiled_shapes.add(name)
            out[layer_type] = _measured_cost(analytic, measured)
    return out
