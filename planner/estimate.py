"""`planner estimate`: evaluate one fully given configuration and write its LaunchPlan.

Malformed configurations for the model (tp not dividing the heads, ep without experts, degrees that do not
multiply to the GPU count) and configurations that do not divide the batch or the layers are bad input
(BadInputError, exit 2, HTTP 422) naming the numbers: the user's fixed configuration is inconsistent, which
the command line contract answers with 2. Configurations that do not fit in memory come back as a LaunchPlan with
feasible=False and the reasons (which rank, by how much, which part dominates). A configuration the request's
framework cannot run is refused with that framework's reason (bad input: the user asked for something the stack
does not have), and so is a given stage split the stack cannot spell (planner.frameworks_split.split_refusal: uneven
first/last stages, layouts, stages without decoder layers); an explicit 2BW schedule is the user's opt-in. A stated
MoE dispatcher, MoE overlap or context-parallel flavour is priced as stated (planner.cost.pins). Sits above the cost
model (it builds a plan).
"""

from __future__ import annotations

from planner.cost.calibration import DeviceCalibration
from planner.cost.model import CostModel, CostOptions
from planner.cost.notes import candidate_of, model_notes
from planner.cost.pins import pin_reasons, pinned
from planner.cost.stack import options_for
from planner.cost.validity import input_reasons
from planner.errors import BadInputError
from planner.frameworks import config_of, load_framework, model_refusal, refusal
from planner.frameworks_split import split_refusal
from planner.plan import build_launch_plan
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import Configuration, LaunchPlan, PlanRequest


def estimate(request: PlanRequest, config: Configuration, *, framework: FrameworkProfile | None = None,
             options: CostOptions | None = None, calibration: DeviceCalibration | None = None) -> LaunchPlan:
    """Evaluate `config` on `request`; the LaunchPlan says whether it fits and why not. `framework`: the request's
    stack profile, resolved once by the caller (planner.api), else read here by its name."""
    cand = candidate_of(request, config)
    profile = framework if framework is not None else load_framework(request.framework)
    options = pinned(options or options_for(profile, request.precision), config.parallelism, spec=request.model,
                     stack=profile.name)  # what the user states they run (planner.cost.pins)
    model = CostModel(request, framework=profile, options=options, calibration=calibration)
    bad = input_reasons(request, cand)
    if bad:
        raise BadInputError("; ".join(bad))
    model_refused = model_refusal(profile, request.model)
    if model_refused is not None:
        raise BadInputError(model_refused)
    refused = refusal(profile, config_of(cand, model=request.model, precision=request.precision))
    if refused is not None:
        raise BadInputError(refused[1])
    if config.stage_layers is not None:  # the split given: the stack's rule for it (uneven first/last, layouts)
        rule = split_refusal(profile, num_layers=request.model.num_layers, pp=cand.pp, vpp=cand.vpp, counts=config.stage_layers)
        if rule is not None:
            raise BadInputError(rule)
    reasons = [*model.validity_reasons(cand), *pin_reasons(model, cand, config.parallelism)]
    if reasons:
        raise BadInputError("; ".join(reasons))
    evaluation = model.evaluate(cand, stage_layers=config.stage_layers)
    return build_launch_plan(model, cand, evaluation, kind="estimate", notes=model_notes(model))
