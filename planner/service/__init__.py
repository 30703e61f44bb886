"""The optimizer service (`planner serve`): FastAPI app, SQLite store, worker pool.

fastapi and uvicorn are imported only inside this package.
"""

from __future__ import annotations

import sys


def serve(*, host: str = "127.0.0.1", port: int = 8000, **settings) -> None:
    """Run the service with uvicorn until interrupted (settings: see planner.service.app.Settings); one line on
    stderr says where it listens once its workers are up."""
    import uvicorn

    from planner.service.app import Settings, create_app

    def ready(s: Settings) -> None:
        where = f"http://{host if ':' not in host else f'[{host}]'}:{port}"
        print(f"planner service on {where} (docs {where}/docs): {s.workers} solver "
              f"{'threads' if not s.use_processes else f'workers of at most {s.worker_memory_mb} MiB'}, "
              f"plans stored in {s.db_path}{', bearer token required' if s.token else ''}; Ctrl-C stops",
              file=sys.stderr, flush=True)

    _check_address(host, port)
    app = create_app(Settings.from_env(**settings), on_ready=ready)
    uvicorn.run(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=5)


def _check_address(host: str, port: int) -> None:
    """Refuse an address that cannot be bound before any worker starts (uvicorn would start them, print the
    banner, then fail to bind)."""
    import socket

    from planner.errors import BadInputError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        with socket.socket(infos[0][0], socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(infos[0][4])
    except OSError as exc:
        raise BadInputError(f"--host {host} --port {port}: {exc.strerror or exc}: choose another --port or --host") from None
