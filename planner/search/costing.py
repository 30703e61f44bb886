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
    return CostModel(request, profile, framework=framework)
