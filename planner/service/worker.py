"""The solve function the worker pool runs: a request body in, (HTTP status, body text) out.

It runs in a worker process (concurrent.futures.ProcessPoolExecutor), so it takes and returns plain
strings and ints: nothing unpicklable crosses the process boundary. User errors map to statuses here:
BadInputError -> 422, InfeasibleError / SolverTimeoutError / an infeasible estimate -> 409.
"""

from __future__ import annotations

import json

from planner.errors import BadInputError, InfeasibleError, PlannerError, SolverTimeoutError
from planner.io import canonical_json
from planner.schemas.plan import Configuration, Parallelism, SearchLimits
from planner.service.schemas import EstimateBody, PlanBody

STATUS_OF_ERROR = ((BadInputError, 422), (InfeasibleError, 409), (SolverTimeoutError, 409))


def _request(body: PlanBody, max_gpus: int):
    from planner import api

    request = api.build_request(
        model=body.model, topology=body.topology, nodes=body.nodes, gpus=body.gpus,
        global_batch_size=body.global_batch_size, seq_len=body.seq_len, precision=body.precision,
        search=SearchLimits(time_limit_s=body.time_limit_s, top_k=body.top_k, allow_stale_weights=body.allow_stale_weights),
        framework=body.framework,
    )
    if request.gpus > max_gpus:
        raise BadInputError(f"the request resolves to {request.gpus} GPUs, over this service's search limit of {max_gpus}: ask for fewer nodes")
    return request


def _configuration(body: EstimateBody, gpus: int) -> Configuration:
    model_parallel = body.tp * body.pp * body.cp
    dp = body.dp if body.dp is not None else gpus // model_parallel
    if dp < 1 or dp * model_parallel != gpus:
        raise BadInputError(f"dp={dp} x tp={body.tp} x pp={body.pp} x cp={body.cp} must equal gpus={gpus}: adjust the degrees")
    return Configuration(
        parallelism=Parallelism(dp=dp, tp=body.tp, pp=body.pp, ep=body.ep, cp=body.cp, sp=body.sp, vpp=body.vpp,
                                zero_stage=body.zero_stage, tp_overlap=body.tp_overlap),
        microbatch_size=body.microbatch_size, schedule=body.schedule, recompute=body.recompute,
    )


def solve(kind: str, body_json: str, max_gpus: int) -> tuple[int, str]:
    """Plan or estimate one request; (200, LaunchPlan JSON) or (4xx, {"detail": message})."""
    from planner import api

    try:
        if kind == "plan":
            plan = api.plan(_request(PlanBody.model_validate_json(body_json), max_gpus))
        else:
            body = EstimateBody.model_validate_json(body_json)
            request = _request(body, max_gpus)
            plan = api.estimate(request, _configuration(body, request.gpus))
            if not plan.feasible or not plan.memory.fits:
                reasons = "; ".join(plan.infeasible_reasons) or "does not fit in memory"
                return 409, json.dumps({"detail": f"infeasible configuration: {reasons}"})
    except PlannerError as exc:
        status = next((code for cls, code in STATUS_OF_ERROR if isinstance(exc, cls)), 422)
        return status, json.dumps({"detail": str(exc)})
    return 200, canonical_json(plan)
