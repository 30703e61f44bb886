"""Fuzz a real `planner serve` with schemathesis against its own OpenAPI document, bounded in time.

Generated requests (schema-valid and schema-invalid bodies, NaN, huge numbers, odd strings, missing and
unknown fields) go to every route. Checks: no 5xx (not_a_server_error), and every answer's status, content
type, headers and body conform to the OpenAPI document. The server runs with --max-time-limit-s 5 and
--grace-s 2 so no solve can hold a worker for long; the whole run is bounded by --max-time.
Needs `pip install 'llm-planner[fuzz]'` (schemathesis).

    python benchmarks/service_fuzz.py --max-time 240 --max-examples 30
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from service_load import Server  # noqa: E402

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-time", type=int, default=240, help="seconds for the whole fuzz run")
    parser.add_argument("--max-examples", type=int, default=30, help="examples per operation and phase")
    parser.add_argument("--seed", type=int, default=15)
    args = parser.parse_args()
    st = shutil.which("st") or shutil.which("schemathesis")
    if st is None:
        sys.exit("schemathesis is not installed: pip install 'llm-planner[fuzz]'")
    server = Server("--workers", "2", "--max-time-limit-s", "5", "--grace-s", "2")
    try:
        done = subprocess.run([st, "run", server.url + "/openapi.json", "--checks", CHECKS, "--max-examples", str(args.max_examples),
                               "--max-time", str(args.max_time), "--request-timeout", "30", "--workers", "2", "--seed", str(args.seed)],
                              capture_output=True, text=True, timeout=args.max_time + 120,
                              cwd=tempfile.mkdtemp(prefix="planner-fuzz-"))  # schemathesis keeps its state in ./.schemathesis
        health = Server.health(server)
    finally:
        server.stop()
    tail = done.stdout.strip().splitlines()
    summary = [line for line in tail if any(word in line for word in ("generated", "passed", "failures", "❌", "ST", "Seed"))]
    print("\n".join(summary[-15:]))
    print(f"schemathesis exit code {done.returncode}; server after the run: {health}")
    sys.exit(done.returncode)


if __name__ == "__main__":
    main()
