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

from planner.cost.layers import ModuleCost

if TYPE_CHECKING:
    from planner.cost.model import Candidate, CostModel


def _lookup(model: "CostModel", cand: "Candidate", layer_type: str):
    try:
        from planner.cost.profiled import profiled_layer_costs
    except ModuleNotFoundError as exc:
        if exc.name != "planner.cost.profiled":
            raise
        return None
    return profiled_layer_costs(model.profile, layer_type=layer_type, tp=cand.tp, ep=cand.ep,
                                microbatch_size=cand.microbatch_size, seq_len=model.request.seq_len)


def apply_profile(model: "CostModel", cand: "Candidate", kinds: dict[bool, ModuleCost]) -> dict[bool, ModuleCost]:
    """Replace the compute times of the profiled decoder layer types; keep the analytic ones for the rest."""
    out: dict[bool, ModuleCost] = {}
    for moe_layer, analytic in kinds.items():
        layer_type = "moe_decoder" if moe_layer else "decoder"
        name = f"{layer_type}(tp={cand.tp}, ep={cand.ep}, microbatch_size={cand.microbatch_size}, seq_len={model.request.seq_len})"
        measured = _lookup(model, cand, layer_type)
        if measured is None:
            model.analytic_shapes.add(name)
            out[moe_layer] = analytic
            continue
        model.profiled_shapes.add(name)
        out[moe_layer] = dataclasses.replace(
            analytic,
            compute_fwd_s=float(measured.forward_s),
            compute_bwd_s=float(measured.backward_s),
            selective_s=float(measured.recompute_selective_s),
        )
    return out
