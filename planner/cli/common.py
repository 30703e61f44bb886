"""Shared CLI plumbing: error mapping, JSON output, atomic file output. No planning logic here."""

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from planner.errors import PlannerError

F = TypeVar("F", bound=Callable[..., Any])


def print_error(exc: BaseException) -> None:
    """One line on stderr: `error: <message>` (no markup interpretation of the message)."""
    from planner.report import console

    err = console(stderr=True)
    err.print("error:", style="bold red", end=" ")
    err.print(str(exc), markup=False, highlight=False)


def guarded(fn: F) -> F:
    """Wrap a command: a PlannerError prints one line and exits with its code (2 bad input, 1 infeasible)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlannerError as exc:
            print_error(exc)
            raise typer.Exit(code=exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def emit_text(text: str, output: Path | None) -> None:
    """Write text atomically to `output`, or to stdout when no file is given."""
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    from planner.io import atomic_write_text

    atomic_write_text(output, text)
