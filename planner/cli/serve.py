"""`planner serve`: the optimizer service (HTTP JSON API with OpenAPI docs at /docs)."""

from pathlib import Path

import typer

from planner.cli.common import guarded, path_text

HELP = """Run the optimizer service (HTTP JSON API, OpenAPI docs at /docs).

Routes: POST /v1/plan, POST /v1/estimate, GET /v1/plans/{id}, GET /v1/models, GET /v1/topologies,
GET /healthz. Plans persist in SQLite (--db, $PLANNER_DB, else ~/.local/share/planner/service.sqlite); set
$PLANNER_TOKEN to require `Authorization: Bearer <token>`. Each solve runs in a worker process that is
stopped at the request's time_limit_s + --grace-s and capped at --worker-memory-mb. When --max-queue
solves already wait for a worker, a new distinct solve is answered 503 with Retry-After at once (a cached
or identical in-flight request never is); a request body not complete within --body-timeout-s is answered
408. Needs the service extra: pip install 'llm-planner[service]'.

Examples:

  planner serve

  PLANNER_TOKEN=secret planner serve --port 8080 --db /var/lib/planner/plans.sqlite

  curl -s localhost:8000/v1/plan -H 'content-type: application/json' -d '{"model": "llama3-8b", "gpus": 64}'
"""


def register(app: typer.Typer) -> None:
    app.command("serve", help=HELP)(serve_command)


@guarded
def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Interface to bind (loopback by default)."),
    port: int = typer.Option(8000, "--port", min=1, max=65535),
    db: Path | None = typer.Option(None, "--db", parser=path_text, help="SQLite file for requests and plans (default $PLANNER_DB, else ~/.local/share/planner/service.sqlite)."),
    workers: int = typer.Option(2, "--workers", min=1, max=256, help="Solver worker processes (about one per CPU core; see the README's load figures)."),
    threads: bool = typer.Option(False, "--threads", help="Solve in threads instead of processes."),
    max_gpus: int = typer.Option(16384, "--max-gpus", min=1, help="Search size limit: the most GPUs a request may ask for."),
    max_body_bytes: int = typer.Option(1 << 20, "--max-body-bytes", min=1024, help="Request size limit (413 above it)."),
    grace_s: float = typer.Option(30.0, "--grace-s", min=0.0, max=3600.0, help="Seconds past a request's time_limit_s before it is answered 504 and its solve stopped."),
    max_time_limit_s: float = typer.Option(300.0, "--max-time-limit-s", min=0.1, max=86400.0, help="The largest time_limit_s a request may ask for (422 above)."),
    worker_memory_mb: int = typer.Option(4096, "--worker-memory-mb", min=512, help="Address-space cap of each solver worker (a solve over it is answered 422)."),
    max_queue: int = typer.Option(64, "--max-queue", min=1, max=100_000, help="Solves that may wait for a worker; a new distinct solve beyond them is answered 503 with Retry-After (64: about what 2 workers clear within a 30 s time limit)."),
    body_timeout_s: float = typer.Option(10.0, "--body-timeout-s", min=0.1, max=3600.0, help="Seconds a request body may take to arrive in full after its headers (408 after)."),
) -> None:
    from planner.cli.common import require_extra
    from planner.io import check_writable

    require_extra("serve", "fastapi", "uvicorn")
    check_writable(db, flag="--db")
    from planner.service import serve

    serve(host=host, port=port, db_path=str(db) if db else None, workers=workers, use_processes=not threads,
          max_gpus=max_gpus, max_body_bytes=max_body_bytes, grace_s=grace_s, max_time_limit_s=max_time_limit_s,
          worker_memory_mb=worker_memory_mb, max_queue=max_queue, body_timeout_s=body_timeout_s)
