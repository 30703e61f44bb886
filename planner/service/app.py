"""The optimizer service: FastAPI over planner.api, solves in a worker pool, answers kept in SQLite.

Routes: POST /v1/plan, POST /v1/estimate, GET /v1/plans/{id}, GET /v1/models, GET /v1/topologies,
GET /healthz; OpenAPI docs at /docs. Statuses: 200 plan (the LaunchPlan JSON; headers X-Plan-Id,
X-Cache hit|miss, Location), 401 missing/wrong bearer token (when PLANNER_TOKEN is set), 404 unknown
plan id, 409 infeasible, 413 body over the size limit, 422 bad input (the field, or the planner's
message), 504 past the per-request time limit.
Identical requests (same sha256 of the canonical request JSON) are answered from the store, and
concurrent identical requests share one solve.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import secrets
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from planner.service.schemas import EstimateBody, PlanBody, request_key
from planner.service.store import PlanStore
from planner.service.worker import solve

TOKEN_ENV = "PLANNER_TOKEN"
DB_ENV = "PLANNER_DB"
DEFAULT_DB = "planner-service.sqlite"


@dataclass(frozen=True)
class Settings:
    """Service limits and wiring; defaults suit one machine."""

    db_path: str = DEFAULT_DB
    workers: int = 2
    use_processes: bool = True
    token: str | None = None
    max_body_bytes: int = 1 << 20
    max_gpus: int = 16384
    max_time_limit_s: float = 300.0
    grace_s: float = 30.0

    @classmethod
    def from_env(cls, **overrides) -> "Settings":
        """PLANNER_DB and PLANNER_TOKEN from the environment unless given explicitly."""
        values = {"db_path": os.environ.get(DB_ENV, DEFAULT_DB), "token": os.environ.get(TOKEN_ENV) or None}
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)


def _json(status: int, body: str, **headers: str) -> Response:
    return Response(content=body, status_code=status, media_type="application/json", headers=headers)


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
    from planner.models import list_presets

    return list_presets()


def _frameworks() -> list[str]:
    from planner.frameworks import list_frameworks

    return list_frameworks()


def _topologies() -> list[str]:
    from planner.topology import list_topologies

    return list_topologies()


async def _answer(app: FastAPI, kind: str, body: PlanBody) -> Response:
    """From the store, from an identical solve in flight, or from a new solve in the pool."""
    settings: Settings = app.state.settings
    _check_limits(body, settings)
    key = request_key(kind, body)
    stored = await asyncio.to_thread(app.state.store.get, key)
    headers = {"X-Plan-Id": key, "Location": f"/v1/plans/{key}"}
    if stored is not None:
        return _json(200, stored.plan_json, **headers, **{"X-Cache": "hit"})
    inflight: dict[str, asyncio.Future] = app.state.inflight
    if key not in inflight:
        future = asyncio.wrap_future(app.state.pool.submit(solve, kind, body.model_dump_json(), settings.max_gpus))
        inflight[key] = future
        future.add_done_callback(lambda _f: inflight.pop(key, None))
    try:
        status, text = await asyncio.wait_for(asyncio.shield(inflight[key]), timeout=body.time_limit_s + settings.grace_s)
    except asyncio.TimeoutError:
        raise HTTPException(504, f"no answer within time_limit_s={body.time_limit_s} + {settings.grace_s} s grace") from None
    if status == 200:
        await asyncio.to_thread(app.state.store.put, key, kind, body.model_dump_json(), text)
        return _json(200, text, **headers, **{"X-Cache": "miss"})
    return _json(status, text)


def _make_pool(settings: Settings) -> Executor:
    if settings.use_processes:
        # spawn, not fork: the server process has threads (event loop, to_thread pool) that fork would copy mid-lock
        return ProcessPoolExecutor(max_workers=settings.workers, mp_context=multiprocessing.get_context("spawn"))
    return ThreadPoolExecutor(max_workers=settings.workers)


def _stop_pool(pool: Executor) -> None:
    """Cancel queued solves and stop the workers now: a solve past its time limit must not outlive the server."""
    terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
    if terminate is not None:
        terminate()
        return
    processes = list((getattr(pool, "_processes", None) or {}).values())  # read before shutdown() clears it
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:  # idle workers exit on the shutdown sentinel; busy ones are stopped
        process.join(timeout=2)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5)


def create_app(settings: Settings | None = None) -> FastAPI:
    """The ASGI app; pool and store are opened at startup and closed at shutdown."""
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.settings = settings
        app.state.store = PlanStore(Path(settings.db_path))
        app.state.inflight = {}
        app.state.pool = _make_pool(settings)
        try:
            yield
        finally:
            _stop_pool(app.state.pool)

    app = FastAPI(title="planner optimizer service", version="1", lifespan=lifespan,
                  description="Auto-parallel plans for LLM training over HTTP: the same API as the `planner` CLI.")

    def authorize(request: Request) -> None:
        if settings.token is None:
            return
        given = request.headers.get("authorization", "")
        if not secrets.compare_digest(given.encode(), f"Bearer {settings.token}".encode()):
            raise HTTPException(401, "missing or wrong bearer token (Authorization: Bearer $PLANNER_TOKEN)", headers={"WWW-Authenticate": "Bearer"})

    @app.middleware("http")
    async def limit_body(request: Request, call_next):
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > settings.max_body_bytes:
            return JSONResponse({"detail": f"request body of {declared} bytes exceeds the {settings.max_body_bytes}-byte limit"}, status_code=413)
        if request.method == "POST" and declared is None:
            if len(await request.body()) > settings.max_body_bytes:
                return JSONResponse({"detail": f"request body exceeds the {settings.max_body_bytes}-byte limit"}, status_code=413)
        return await call_next(request)

    _add_routes(app, [Depends(authorize)])
    return app


def _add_routes(app: FastAPI, guard: list) -> None:
    """The HTTP routes; `guard` (the bearer-token check) protects everything under /v1."""

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"status": "ok", "stored_plans": await asyncio.to_thread(app.state.store.count)}

    @app.post("/v1/plan", dependencies=guard, summary="Search for the fastest plan that fits (returns a LaunchPlan)")
    async def post_plan(body: PlanBody) -> Response:
        return await _answer(app, "plan", body)

    @app.post("/v1/estimate", dependencies=guard, summary="Estimate one fixed configuration (returns a LaunchPlan)")
    async def post_estimate(body: EstimateBody) -> Response:
        return await _answer(app, "estimate", body)

    @app.get("/v1/plans/{plan_id}", dependencies=guard, summary="A stored plan by id (the X-Plan-Id of its answer)")
    async def get_plan(plan_id: str) -> Response:
        stored = await asyncio.to_thread(app.state.store.get, plan_id)
        if stored is None:
            raise HTTPException(404, f"no stored plan with id {plan_id!r}")
        return _json(200, stored.plan_json, **{"X-Plan-Id": plan_id})

    @app.get("/v1/models", dependencies=guard, summary="Model presets")
    async def get_models() -> dict:
        return {"models": _presets()}

    @app.get("/v1/frameworks", dependencies=guard, summary="Framework profiles a plan can be made for")
    async def get_frameworks() -> dict:
        return {"frameworks": _frameworks()}

    @app.get("/v1/topologies", dependencies=guard, summary="Topology presets")
    async def get_topologies() -> dict:
        return {"topologies": _topologies()}
