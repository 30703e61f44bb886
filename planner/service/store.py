"""SQLite store of requests and plans: the embedded default, one file, survives restarts.

Tables: `plans(id, kind, request_json, plan_json, created_s)` keyed by the request key (sha256 of the
canonical request), so an identical request is answered from here and `GET /v1/plans/{id}` reads it.
WAL journal mode lets readers proceed while one writer commits. A connection per operation keeps the
store safe to use from the server's threads without shared mutable state.
"""

from __future__ import annotations

import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS plans (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL,
    request_json TEXT NOT NULL,
    plan_json TEXT NOT NULL,
    created_s REAL NOT NULL
)
"""


@dataclass(frozen=True)
class StoredPlan:
    id: str
    kind: str
    request_json: str
    plan_json: str
    created_s: float


class PlanStore:
    """Plans and the requests that made them, in one SQLite file."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as conn, conn:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(SCHEMA)

    def _connect(self) -> sqlite3.Connection:
        return sqlite3.connect(self.path, timeout=30.0)

    def get(self, plan_id: str) -> StoredPlan | None:
        with closing(self._connect()) as conn:
            row = conn.execute("SELECT id, kind, request_json, plan_json, created_s FROM plans WHERE id = ?", (plan_id,)).fetchone()
        return StoredPlan(*row) if row else None

    def put(self, plan_id: str, kind: str, request_json: str, plan_json: str) -> None:
        """Insert once: the first answer to a request key is the one kept (answers are deterministic)."""
        with closing(self._connect()) as conn, conn:
            conn.execute(
                "INSERT OR IGNORE INTO plans (id, kind, request_json, plan_json, created_s) VALUES (?, ?, ?, ?, ?)",
                (plan_id, kind, request_json, plan_json, time.time()),
            )

    def count(self) -> int:
        with closing(self._connect()) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM plans").fetchone()[0])
