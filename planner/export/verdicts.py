"""What every acceptance judge shares (planner.export.judges and planner.export.judges_megatron): the verdict, the
"framework not installed" signal, and running a framework's validation quietly with a one-line reason.

A module of its own so that the dependency runs one way: judges.py calls judges_megatron.py, and both take these
pieces from here.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass


class JudgeUnavailable(RuntimeError):
    """The framework whose validation code would judge this export is not importable here."""


@dataclass(frozen=True)
class Verdict:
    accepted: bool
    reason: str = ""


@contextlib.contextmanager
def quiet():
    """Frameworks print their argument dumps and warnings; keep the benchmark table readable."""
    out, err = io.StringIO(), io.StringIO()
    logging.disable(logging.WARNING)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield err
    finally:
        logging.disable(logging.NOTSET)


def first_line(exc: BaseException, err: io.StringIO | None = None) -> str:
    """A one-line reason: the exception's message, or what the framework printed before exiting (tyro, argparse)."""
    printed = err.getvalue() if err is not None else ""
    text = (printed if isinstance(exc, SystemExit) and printed else str(exc)).strip() or type(exc).__name__
    lines = [line.strip(" │╭╰─╮╯") for line in text.splitlines()]
    lines = [line for line in lines if line and not set(line) <= set("─ ")]
    errors = [line for line in lines if "error:" in line.lower()]  # argparse prints usage first, the error last
    return " ".join(errors or lines[:3])[:300]
