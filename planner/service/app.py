"""The optimizer service: FastAPI over planner.api, solves in a worker pool, answers kept in SQLite.

Routes: POST /v1/plan, POST /v1/estimate, GET /v1/plans/{id}, GET /v1/models, GET /v1/topologies,
GET /healthz; OpenAPI docs at /docs. Statuses: 200 plan (the LaunchPlan JSON; headers X-Plan-Id,
X-Cache hit|miss, Location), 401 missing/wrong bearer token (when PLANNER_TOKEN is set), 404 unknown
plan id, 408 body not complete within the body time limit (planner.service.body_limit), 409 infeasible,
413 body over the size limit (counted as it arrives, chunked or not), 422 bad input (the field, or the
planner's message; NaN and Infinity and duplicate keys included), 503 solve queue full or the solve's worker
died (with Retry-After; the worker is replaced at once), 504 past the
per-request time limit. Every error body is `{"detail": ...}` (planner.service.schemas.ErrorBody).
Identical requests (same sha256 of the canonical request JSON) are answered from the store, and
concurrent identical requests share one solve. A new distinct solve is refused at once (503) when
`max_queue` solves already wait for a worker: queued longer, it would mostly end in a 504, and an
unbounded queue is unbounded memory; a cache hit or a request joining its identical solve in flight is
never refused. A solve is stopped at its own time limit plus the grace (planner.service.pool kills its
worker), and a solve that finishes after its client gave up (504 from queueing) is still stored, so the
retry is a cache hit.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import secrets
from collections.abc import Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from planner.service.pool import ProcessPool, ThreadPool
from planner.service.schemas import ErrorBody, EstimateBody, PlanBody, request_key
from planner.service.store import PlanStore

TOKEN_ENV = "PLANNER_TOKEN"
DB_ENV = "PLANNER_DB"


def default_db_path() -> str:
    """$PLANNER_DB, else $XDG_DATA_HOME/planner/service.sqlite (~/.local/share/...): not the working directory."""
    if os.environ.get(DB_ENV):
        return os.environ[DB_ENV]
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "planner", "service.sqlite")


@dataclass(frozen=True)
class Settings:
    """Service limits and wiring; defaults suit one machine (see benchmarks/service_load.py for `workers`)."""

    db_path: str = ""
    workers: int = 2
    use_processes: bool = True
    token: str | None = None
    max_body_bytes: int = 1 << 20
    max_gpus: int = 16384
    max_time_limit_s: float = 300.0
    grace_s: float = 30.0
    worker_memory_mb: int = 4096
    max_queue: int = 64  # solves waiting for a worker before a new one is refused (503); see _refuse_if_queue_full
    body_timeout_s: float = 10.0  # the whole request body must arrive within this (408); see body_limit

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        """PLANNER_DB and PLANNER_TOKEN from the environment unless given explicitly."""
        values = {"db_path": default_db_path(), "token": os.environ.get(TOKEN_ENV) or None}
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


ERRORS = {
    401: "missing or wrong bearer token (when PLANNER_TOKEN is set)",
    404: "no stored plan with this id",
    408: "the request body was not complete within the service's body time limit (--body-timeout-s); the connection is closed",
    409: "valid input, but no configuration fits (the detail says how far the closest is)",
    413: "request body over the service's size limit",
    422: "bad input: one line naming the field, the value and the fix, or the list of schema problems",
    503: "the solve queue is full (--max-queue solves already wait for a worker), or the solve's worker died and is "
         "being replaced: retry after Retry-After seconds; a cached or identical in-flight request is never refused",
    504: "no answer within time_limit_s + the service's grace (a solve that finishes later is still stored)",
}


RETRY_AFTER_S = 5  # the Retry-After of a 503: a few solves' time (0.1-1.5 s each, README) on a busy pool


def _responses(*codes: int) -> dict:
    out = {code: {"model": ErrorBody, "description": ERRORS[code]} for code in codes}
    if 503 in out:
        out[503]["headers"] = {"Retry-After": {"description": "seconds to wait before retrying", "schema": {"type": "integer"}}}
    return out


def _json(status: int, body: str, **headers: str) -> Response:
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


def _json_safe(value):
    """A validation error's `input` as JSON can carry it: NaN/Infinity as strings, long values cut."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, (dict, list)):
        return None  # the loc names the place; echoing whole sub-documents back is noise
    if isinstance(value, str) and len(value) > 200:
        return value[:200] + "..."
    if isinstance(value, int) and abs(value) > 2**63:
        return str(value)
    return value if isinstance(value, (str, int, float, bool, type(None))) else repr(value)[:200]


MAX_FIELD_ERRORS = 20  # a body of 50,000 unknown keys must not get a 5 MB answer


def field_errors(exc: RequestValidationError) -> list[dict]:
    """The 422 `detail` list: loc, msg, type and a JSON-safe input per problem (never a 500 on NaN), at most
    MAX_FIELD_ERRORS of them and then one saying how many more."""
    errors = exc.errors()
    out = [{"loc": [p if isinstance(p, (str, int)) else str(p) for p in err.get("loc", ())], "msg": str(err.get("msg", "")),
            "type": str(err.get("type", "")), "input": _json_safe(err.get("input"))} for err in errors[:MAX_FIELD_ERRORS]]
    if len(errors) > MAX_FIELD_ERRORS:
        out.append({"loc": ["body"], "msg": f"and {len(errors) - MAX_FIELD_ERRORS} more problems", "type": "too_many_errors",
                    "input": None})
    return out


def _check_limits(body: PlanBody, settings: Settings) -> None:
    if body.gpus is not None and body.gpus > settings.max_gpus:
        raise HTTPException(422, f"gpus={body.gpus} exceeds this service's search limit of {settings.max_gpus} GPUs")
    if body.time_limit_s > settings.max_time_limit_s:
        raise HTTPException(422, f"time_limit_s={body.time_limit_s} exceeds this service's limit of {settings.max_time_limit_s} s")
    if body.framework not in _frameworks():
        raise HTTPException(422, f"framework={body.framework!r} is not a shipped profile: choose one of GET /v1/frameworks")
    for name, ref, allowed in (("model", body.model, _presets()), ("topology", body.topology, _topologies())):
        if isinstance(ref, str) and ref not in allowed:
            raise HTTPException(422, f"{name}={ref!r} is not a preset: choose one of GET /v1/{name}s, or send an inline spec")


def _presets() -> list[str]:
    from planner import api

    return api.list_presets()


def _frameworks() -> list[str]:
    from planner import api

    return api.list_frameworks()


def _topologies() -> list[str]:
    from planner import api

    return api.list_topologies()


async def _answer(app: FastAPI, kind: str, body: PlanBody) -> Response:
    """From the store, from an identical solve in flight, or from a new solve in the pool."""
    settings: Settings = app.state.settings
    _check_limits(body, settings)
    key = request_key(kind, body)
    stored = await asyncio.to_thread(app.state.store.get, key)
    headers = {"X-Plan-Id": key, "Location": f"/v1/plans/{key}"}
    if stored is not None:
        return _json(200, stored.plan_json, **headers, **{"X-Cache": "hit"})
    inflight: dict[str, asyncio.Task] = app.state.inflight
    if key not in inflight:
        _refuse_if_queue_full(app)
        task = asyncio.get_running_loop().create_task(_solve_and_store(app, key, kind, body))
        inflight[key] = task
        task.add_done_callback(lambda _t: inflight.pop(key, None))
    try:
        status, text = await asyncio.wait_for(asyncio.shield(inflight[key]), timeout=body.time_limit_s + settings.grace_s)
    except asyncio.TimeoutError:
        raise HTTPException(504, f"no answer within time_limit_s={body.time_limit_s:g} + {settings.grace_s:g} s grace "
                                 f"({waiting_solves(app)} requests waiting for a worker): the solve goes on and its plan "
                                 f"will be at GET /v1/plans/{key}", headers=headers) from None
    if status == 200:
        return _json(200, text, **headers, **{"X-Cache": "miss"})
    if status == 503:  # the solve's worker died (planner.service.pool): retry on its replacement
        return _json(status, text, **{"Retry-After": str(RETRY_AFTER_S)})
    return _json(status, text)


def waiting_solves(app: FastAPI) -> int:
    """Distinct solves waiting for a worker: the pool's own count, or, where larger, the solves in flight beyond
    the workers (a solve just admitted is in flight before its task has asked the pool for a worker)."""
    pool = app.state.pool
    return max(pool.queued, len(app.state.inflight) - pool.size)


def _refuse_if_queue_full(app: FastAPI) -> None:
    """503 at once, before a new distinct solve is queued, when `max_queue` solves already wait for a worker."""
    settings: Settings = app.state.settings
    waiting = waiting_solves(app)
    if waiting >= settings.max_queue:
        raise HTTPException(503, f"the solve queue is full: {waiting} solves are waiting for {app.state.pool.size} "
                                 f"worker(s) (the service's max_queue is {settings.max_queue}): retry in {RETRY_AFTER_S} s",
                            headers={"Retry-After": str(RETRY_AFTER_S)})


async def _solve_and_store(app: FastAPI, key: str, kind: str, body: PlanBody) -> tuple[int, str]:
    """Solve in the pool (stopped at time_limit_s + grace after it starts) and store a plan, whether or not
    the client that asked is still waiting."""
    settings: Settings = app.state.settings
    status, text = await app.state.pool.solve(kind, body.model_dump_json(), settings.max_gpus,
                                              deadline_s=body.time_limit_s + settings.grace_s)
    if status == 200:
        await asyncio.to_thread(app.state.store.put, key, kind, body.model_dump_json(), text)
    return status, text


def _make_pool(settings: Settings):
    if settings.use_processes:
        return ProcessPool(settings.workers, memory_bytes=settings.worker_memory_mb << 20)
    return ThreadPool(settings.workers)


def create_app(settings: Settings | None = None, *, on_ready: Callable[[Settings], None] | None = None) -> FastAPI:
    """The ASGI app; pool and store are opened at startup and closed at shutdown; `on_ready` runs once the
    workers are up (`planner serve` prints its address there)."""
    settings = settings or Settings.from_env()
    if not settings.db_path:
        settings = Settings(**{**settings.__dict__, "db_path": default_db_path()})

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.settings = settings
        app.state.store = PlanStore(Path(settings.db_path))
        app.state.inflight = {}
        app.state.pool = _make_pool(settings)
        await app.state.pool.start()
        if on_ready is not None:
            on_ready(settings)
        try:
            yield
        finally:
            for task in list(app.state.inflight.values()):
                task.cancel()
            await app.state.pool.close()

    app = FastAPI(title="planner optimizer service", version="1", lifespan=lifespan,
                  description="Auto-parallel plans for LLM training over HTTP: the same API as the `planner` CLI. "
                              "Every error answer is {\"detail\": ...}: one line naming the field, the value and the fix.")

    @app.exception_handler(RequestValidationError)
    async def invalid_body(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"detail": field_errors(exc)}, status_code=422)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """As FastAPI's own handler, but a body it cannot decode (its 400) is bad input like any other: 422."""
        if exc.status_code == 400:
            return JSONResponse({"detail": "the request body could not be parsed (not UTF-8 JSON, nested too deeply, or a "
                                           "number too long): send a JSON object"}, status_code=422)
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    def authorize(request: Request) -> None:
        if settings.token is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {settings.token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer $PLANNER_TOKEN)", headers={"WWW-Authenticate": "Bearer"})

    from planner.service.body_limit import BodyLimit

    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, timeout_s=settings.body_timeout_s)
    _add_routes(app, [Depends(authorize)])
    return app


async def no_duplicate_keys(request: Request) -> None:
    """422 for a JSON body that gives one key twice at any depth (the README promises it; JSON parsers keep the last
    silently, so `{"gpus": 8, "gpus": 4096}` would be solved as 4096). The body is already buffered (BodyLimit);
    a body that is not JSON at all is left to FastAPI's own answer."""
    from planner.io import no_duplicate_pairs

    body = await request.body()
    try:
        json.loads(body, object_pairs_hook=no_duplicate_pairs)
    except json.JSONDecodeError:
        return
    except (ValueError, RecursionError) as exc:
        if "duplicate key" in str(exc):
            raise HTTPException(422, f"request body: {exc}") from None


def _add_routes(app: FastAPI, guard: list) -> None:
    """The HTTP routes; `guard` (the bearer-token check) protects everything under /v1."""
    solve_errors = _responses(401, 408, 409, 413, 422, 503, 504)

    @app.get("/healthz")
    async def healthz() -> dict:
        pool = app.state.pool
        return {"status": "ok", "stored_plans": await asyncio.to_thread(app.state.store.count),
                "workers": pool.size, "queued": waiting_solves(app), "max_queue": app.state.settings.max_queue,
                "solving": len(app.state.inflight), "workers_replaced": pool.replaced}

    @app.post("/v1/plan", dependencies=[*guard, Depends(no_duplicate_keys)], responses=solve_errors,
              summary="Search for the fastest plan that fits (returns a LaunchPlan)")
    async def post_plan(body: PlanBody) -> Response:
        return await _answer(app, "plan", body)

    @app.post("/v1/estimate", dependencies=[*guard, Depends(no_duplicate_keys)], responses=solve_errors,
              summary="Estimate one fixed configuration (returns a LaunchPlan)")
    async def post_estimate(body: EstimateBody) -> Response:
        return await _answer(app, "estimate", body)

    @app.get("/v1/plans/{plan_id}", dependencies=guard, responses=_responses(401, 404, 422),
             summary="A stored plan by id (the X-Plan-Id of its answer)")
    async def get_plan(plan_id: str) -> Response:
        if len(plan_id) > 128:
            raise HTTPException(404, f"no stored plan with id {plan_id[:16]!r}...: ids are 64 hex digits")
        stored = await asyncio.to_thread(app.state.store.get, plan_id)
        if stored is None:
            raise HTTPException(404, f"no stored plan with id {plan_id!r}")
        return _json(200, stored.plan_json, **{"X-Plan-Id": plan_id})

    @app.get("/v1/models", dependencies=guard, responses=_responses(401), summary="Model presets")
    async def get_models() -> dict:
        return {"models": _presets()}

    @app.get("/v1/frameworks", dependencies=guard, responses=_responses(401), summary="Framework profiles a plan can be made for")
    async def get_frameworks() -> dict:
        return {"frameworks": _frameworks()}

    @app.get("/v1/topologies", dependencies=guard, responses=_responses(401), summary="Topology presets")
    async def get_topologies() -> dict:
        return {"topologies": _topologies()}
