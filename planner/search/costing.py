"""The cost model of a request (with its measured profile when the request names one): one home shared by the
driver (the search) and assemble (the plan of the winner), so neither imports the other."""

from __future__ import annotations

from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import PlanRequest


def make_cost_model(request: PlanRequest, framework: FrameworkProfile | None = None):
    """CostModel of `request` run by the stack `framework` (the request's profile, resolved once by the caller; else
    read by its name when first needed); the measured profile file it names is loaded and validated."""
    from planner.cost.model import CostModel

    profile = None
    if request.profile is not None:
        from planner.io import load_file
        from planner.schemas.profile import Profile

        profile = load_file(Profile, request.profile)
    return CostModel(request, profile, framework=framework, options=stated_options(request, framework))


def stated_options(request: PlanRequest, framework: FrameworkProfile | None):
    """The stack's CostOptions narrowed to the MoE dispatcher, MoE overlap and CP flavour the request's limits
    state (planner.cost.pins.narrowed); None (the CostModel's own) where they state none."""
    from planner.cost.pins import narrowed
    from planner.cost.stack import options_for
    from planner.frameworks import load_framework

    limits = request.search
    if limits is None or (limits.moe_dispatcher, limits.moe_overlap, limits.cp_comm_type) == (None, None, None):
        return None
    profile = framework if framework is not None else load_framework(request.framework)
    return narrowed(options_for(profile, request.precision), moe_dispatcher=limits.moe_dispatcher,
                    moe_overlap=limits.moe_overlap, cp_comm_type=limits.cp_comm_type, spec=request.model,
                    stack=profile.name)
