"""The solve function the worker pool runs: a request body in, (HTTP status, body text) out.

It runs in a worker process (`python -m planner.service.worker MEMORY_BYTES PARENT_PID`, planner.service.pool),
saying `["ready", pid]` once imported, then reading one JSON line `[kind, body_json, max_gpus]` at a time on stdin and answering one JSON line
`[status, text, rss_bytes]` on its own copy of stdout (fd 1 itself goes to stderr, so a stray print cannot corrupt the
protocol). User errors map to statuses here: BadInputError -> 422, InfeasibleError / SolverTimeoutError / an
infeasible estimate -> 409, MemoryError (over the worker's address-space limit) -> 422. Any other exception is
a bug: 500 with its one-line summary, its traceback on the server's stderr, and the worker lives on.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

from pydantic import ValidationError

from planner.errors import BadInputError, InfeasibleError, PlannerError, SolverTimeoutError
from planner.io import canonical_json, format_validation_error
from planner.schemas.dims import ParallelDims
from planner.schemas.plan import Configuration, Parallelism, SearchLimits
from planner.service.schemas import EstimateBody, PlanBody

STATUS_OF_ERROR = ((BadInputError, 422), (InfeasibleError, 409), (SolverTimeoutError, 409))


def _request(body: PlanBody, max_gpus: int):
    from planner import api

    # a plan's search prices only what the body states; an estimate states it in its Parallelism (_configuration_of)
    stated = {} if isinstance(body, EstimateBody) else dict(moe_dispatcher=body.moe_dispatcher,
                                                            moe_overlap=body.moe_overlap, cp_comm_type=body.cp_comm_type)
    request = api.build_request(
        model=body.model, topology=body.topology, nodes=body.nodes, gpus=body.gpus,
        global_batch_size=body.global_batch_size, seq_len=body.seq_len, precision=body.precision,
        search=SearchLimits(time_limit_s=body.time_limit_s, top_k=body.top_k, allow_stale_weights=body.allow_stale_weights,
                            prefer_practice=body.prefer_practice, **stated),
        framework=body.framework, moe=dict(routing_skew=body.routing_skew, capacity_factor=body.capacity_factor),
    )
    if request.gpus > max_gpus:
        raise BadInputError(f"the request resolves to {request.gpus} GPUs, over this service's search limit of {max_gpus}: ask for fewer nodes")
    if not isinstance(body, EstimateBody) and body.compression.strip() != "none":
        chosen = api.compression(body.compression, request.topology, auto=True)
        request = request.model_copy(update={"search": request.search.model_copy(update={"compression": chosen})})
    return request


def _configuration(body: EstimateBody, request) -> Configuration:
    dims = ParallelDims.resolve(request.gpus, dp=body.dp, tp=body.tp, pp=body.pp, cp=body.cp, ep=body.ep)
    try:
        return _configuration_of(body, request, dims)
    except ValidationError as exc:  # a combination each field allows but the record does not (HTTP 422, one line)
        raise BadInputError(format_validation_error(exc, "configuration")) from None


def _configuration_of(body: EstimateBody, request, dims: ParallelDims) -> Configuration:
    from planner import api

    return Configuration(
        parallelism=Parallelism(**dims.as_dict(), sp=body.sp, vpp=body.vpp,
                                zero_stage=body.zero_stage, tp_overlap=body.tp_overlap,
                                compression=api.compression(body.compression, request.topology),
                                moe_dispatcher=body.moe_dispatcher, moe_overlap=body.moe_overlap,
                                cp_comm_type=body.cp_comm_type),
        microbatch_size=body.microbatch_size, schedule=body.schedule, recompute=body.recompute,
        recompute_modules=body.recompute_modules, stage_layers=body.stage_layers,
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
            plan = api.estimate(request, _configuration(body, request))
            if not plan.feasible or not plan.memory.fits:
                reasons = "; ".join(plan.infeasible_reasons) or "does not fit in memory"
                return 409, json.dumps({"detail": f"infeasible configuration: {reasons}"})
    except PlannerError as exc:
        status = next((code for cls, code in STATUS_OF_ERROR if isinstance(exc, cls)), 422)
        return status, json.dumps({"detail": str(exc)})
    except MemoryError:
        return 422, json.dumps({"detail": "the solve needs more memory than the worker's limit (planner serve --worker-memory-mb): "
                                          "ask for a smaller model, fewer GPUs or a shorter sequence"})
    return 200, canonical_json(plan)


def _die_with_parent(parent_pid: int) -> None:
    """Exit when the server exits, even by SIGKILL: PR_SET_PDEATHSIG on Linux, and a watch thread everywhere."""
    import signal
    import threading
    import time

    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(0)

    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _limit_memory(memory_bytes: int) -> None:
    """Cap this process's address space: a solve that outgrows it raises MemoryError instead of growing the box."""
    if memory_bytes <= 0:
        return
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = memory_bytes if hard == resource.RLIM_INFINITY else min(memory_bytes, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))


def _rss_bytes() -> int:
    """This process's resident memory now (the pool replaces a worker that a big solve left large)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


def main(argv: list[str]) -> None:
    """The worker loop: one request line in, one answer line out, until stdin closes."""
    memory_bytes, parent_pid = int(argv[0]), int(argv[1])
    _die_with_parent(parent_pid)
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    from planner import api  # import before the memory cap, and before the first request

    api.preload()

    _limit_memory(memory_bytes)
    answers.write(json.dumps(["ready", os.getpid()]) + "\n")
    answers.flush()
    for line in sys.stdin:
        try:
            kind, body_json, max_gpus = json.loads(line)
            status, text = solve(kind, body_json, max_gpus)
        except MemoryError:
            status, text = 422, json.dumps({"detail": "the solve needs more memory than the worker's limit"})
        except Exception as exc:  # a bug: answer 500 in one line, keep the traceback for the server log
            traceback.print_exc()
            status, text = 500, json.dumps({"detail": f"internal error: {type(exc).__name__}: {exc}"[:500]})
        answers.write(json.dumps([status, text, _rss_bytes()]) + "\n")
        answers.flush()


if __name__ == "__main__":
    main(sys.argv[1:])
