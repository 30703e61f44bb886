"""Start-up cost of the CLI: `planner --help`, `planner models list` and `planner plan --help` against a bare
`python -c pass` (the interpreter's own start), as the median of --runs fresh processes each.

Why: a CLI call is mostly interpreter start and imports (the cost model itself runs in milliseconds), so
commands are imported lazily (planner/cli/__init__.py). Prints each median and its ratio to `python -c pass`.

    python benchmarks/cli_startup.py --runs 15
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "python -c pass": [sys.executable, "-c", "pass"],
    "planner --help": [sys.executable, "-m", "planner.cli", "--help"],
    "planner models list": [sys.executable, "-m", "planner.cli", "models", "list"],
    "planner plan --help": [sys.executable, "-m", "planner.cli", "plan", "--help"],
}


def median_s(argv: list[str], runs: int) -> float:
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True, timeout=60)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    print(f"median of {args.runs} runs, cpus={os.cpu_count()}, load1={os.getloadavg()[0]:.1f}")
    base = None
    for name, argv in CASES.items():
        seconds = median_s(argv, args.runs)
        base = base or seconds
        print(f"{name:<22} {seconds * 1000:7.0f} ms   x{seconds / base:.2f} of python -c pass")


if __name__ == "__main__":
    main()
