"""What every acceptance judge shares (planner.export.judges and the judges_* modules, one per framework): the
verdict, the "framework not installed" signal, running a framework's validation quietly with a one-line reason,
the plan's GPU as the frameworks ask torch.cuda for it, an exported bash array's words, and the stub pipeline
stage torch's schedule constructors read.

A module of its own so that the dependency runs one way: judges.py calls the judges_* modules, and all take these
pieces from here.
"""

from __future__ import annotations

import contextlib
import io
import logging
import shlex
from dataclasses import dataclass

from planner.schemas.plan import LaunchPlan


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


# NVIDIA compute capability by device-name prefix: the frameworks ask torch.cuda, which this CPU machine lacks.
CAPABILITIES = (("GB200", (10, 0)), ("B200", (10, 0)), ("H100", (9, 0)), ("H200", (9, 0)), ("H800", (9, 0)),
                ("A100", (8, 0)), ("A800", (8, 0)), ("L40", (8, 9)))


def device_capability(plan: LaunchPlan) -> tuple[int, int]:
    """The compute capability of the plan's GPU (its topology's device name); (9, 0) when the name is unknown."""
    name = plan.request.topology.device.name.upper()
    return next((cap for prefix, cap in CAPABILITIES if name.startswith(prefix)), (9, 0))

def script_array(text: str, name: str) -> list[str]:
    """The words of `NAME=( ... )` in an exported bash script, as bash would pass them."""
    body = text.split(f"{name}=(", 1)[1].split("\n)", 1)[0]
    return shlex.split("\n".join(line for line in body.splitlines() if not line.strip().startswith("#")))


class StubStage:
    """What torch's schedule constructors read of a PipelineStage (no model, no process group)."""

    def __init__(self, index: int, stages: int, pp: int, rank: int):
        import torch

        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, pp, rank
        self.is_first, self.is_last, self.group = index == 0, index == stages - 1, None
        self.submod = torch.nn.Module()
