"""Output that reads at 80 columns and when captured to a file: tables too wide for the console fall back to a
plain layout (planner.report.print_table) that never breaks a word nor elides one with '…'; explain's prose wraps
at spaces; a run report names a loaded CPU beside its error (planner.executor.host)."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console
from rich.table import Table

from planner.executor.host import host_load
from planner.report import print_table

ROOT = Path(__file__).resolve().parents[2]


def captured(args: list[str], columns: str | None = "80") -> str:
    """The command's stdout through a pipe (not a terminal), as a file would get it."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")} | {"PYTHONPATH": str(ROOT)}
    if columns:
        env["COLUMNS"] = columns
    done = subprocess.run([sys.executable, "-m", "planner.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def assert_reads_at_80(text: str, words: list[str]) -> None:
    lines = text.splitlines()
    assert all(len(line) <= 80 for line in lines), max(lines, key=len)
    assert "…" not in text
    for word in words:  # whole, on one line: not folded mid-word
        assert any(word in line for line in lines), word


@pytest.mark.parametrize("columns", ["80", None])  # $COLUMNS=80, and captured with no width given (rich: 80)
def test_framework_and_topology_lists_read_at_80_columns_captured(columns):
    assert_reads_at_80(captured(["framework", "list"], columns),
                       ["megatron-core", "torchtitan", "zero-bubble", "none, selective, full", "stale weights: False"])
    assert_reads_at_80(captured(["topology", "list"], columns), ["dgx-h100", "H100-SXM5-80GB", "infiniband", "nvswitch"])


def test_explain_reads_at_80_columns():
    text = captured(["explain", "docs/plan.json"])
    assert_reads_at_80(text, ["Why this configuration", "Which frameworks run it", "megatron-core"])


def test_a_table_that_fits_stays_a_table_and_one_that_does_not_becomes_records():
    table = Table(title="Profile of tiny on cpu (fp32)")
    for header in ("layer", "tp", "fwd ms", "bwd ms", "sel+ ms", "full+ ms", "params MiB", "saved MiB", "status"):
        table.add_column(header, no_wrap=True)
    table.add_row("decoder_layer", "1", "12.345", "24.690", "3.210", "12.345", "123.45", "67.89",
                  "skipped: the shape needs more memory than this device has")
    narrow, wide = io.StringIO(), io.StringIO()
    print_table(Console(file=narrow, width=80), table)
    print_table(Console(file=wide, width=250), table)
    assert_reads_at_80(narrow.getvalue(), ["layer: decoder_layer", "params MiB: 123.45", "the shape needs more memory"])
    assert "┃" in wide.getvalue() or "│" in wide.getvalue()  # the rich table where it fits
    assert "layer: decoder_layer" not in wide.getvalue()


def test_a_loaded_cpu_is_named_beside_the_error():
    busy = host_load(before=3.9, after=4.1, cores=2, ranks=2, threads_per_rank=1)
    assert busy.loaded and busy.summary == "CPU loaded: load average 4.1 on 2 cores; timings unreliable"
    quiet = host_load(before=0.2, after=1.9, cores=2, ranks=2, threads_per_rank=1)  # the load after is the run's own
    assert not quiet.loaded and quiet.summary.startswith("CPU idle enough")
    oversubscribed = host_load(before=0.0, after=0.5, cores=2, ranks=4, threads_per_rank=1)
    assert oversubscribed.loaded and "4 ranks x 1 threads" in oversubscribed.summary
