"""The optimizer service (`planner serve`): FastAPI app, SQLite store, worker pool.

fastapi and uvicorn are imported only inside this package.
"""

from __future__ import annotations


def serve(*, host: str = "127.0.0.1", port: int = 8000, **settings) -> None:
    """Run the service with uvicorn until interrupted (settings: see planner.service.app.Settings)."""
    import uvicorn

    from planner.service.app import Settings, create_app

    app = create_app(Settings.from_env(**settings))
    uvicorn.run(app, host=host, port=port, log_level="warning")
