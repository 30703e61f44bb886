"""Shared CLI plumbing: error mapping, JSON output, atomic file output, optional extras. No planning logic here."""

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import typer

from planner.errors import PlannerError

F = TypeVar("F", bound=Callable[..., Any])


class BoolHelpFlag:
    """A mixin for typer command and group classes: their --help flag defaults to False, not None.

    Why: typer 0.29 leaves that default at None, and a value that is not a bool is coerced through a pydantic
    TypeAdapter on every call, importing pydantic (about 40 ms of start-up) even for a command that needs no
    schema (`planner models list`; benchmarks/cli_startup.py). False is what an absent flag means."""

    def get_help_option(self, ctx: Any) -> Any:
        option = super().get_help_option(ctx)  # type: ignore[misc]
        if option is not None and option.default is None:
            option.default = False
        return option


def print_error(exc: BaseException | str) -> None:
    """One line on stderr: `error: <message>` (no markup interpretation of the message)."""
    from planner.report import console

    err = console(stderr=True)
    err.print("error:", style="bold red", end=" ")
    err.print(str(exc), markup=False, highlight=False)


# The optional dependency groups of pyproject.toml, by the top-level module that needs them.
EXTRA_OF_MODULE = {"torch": "torch", "fastapi": "service", "uvicorn": "service", "httpx": "service",
                   "starlette": "service", "matplotlib": "plot", "transformers": "hf"}


def missing_extra_message(command: str, module: str) -> str:
    """One line naming the pip install that brings `module` (an optional extra's package)."""
    extra = EXTRA_OF_MODULE.get(module.split(".")[0])
    fix = f"pip install 'llm-planner[{extra}]'" if extra else f"pip install {module.split('.')[0]}"
    return f"`planner {command}` needs {module.split('.')[0]}, which is not installed: {fix}"


def require_extra(command: str, *modules: str) -> None:
    """Fail in one line (exit 2) before any work when an optional extra `command` needs is not installed."""
    import importlib.util

    for module in modules:
        if importlib.util.find_spec(module) is None:
            raise PlannerError(missing_extra_message(command, module))


def guarded(fn: F) -> F:
    """Wrap a command: a PlannerError prints one line and exits with its code (2 bad input, 1 infeasible).

    Also one line, never a traceback, for what a user's environment or input causes below the library's own
    checks: a missing optional extra (names the pip install), an OS error on a file (exit 2), memory
    exhausted (exit 2), a pydantic ValidationError of a schema built from the flags (exit 2)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except PlannerError as exc:
            print_error(exc)
            raise typer.Exit(code=exc.exit_code) from None
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] not in EXTRA_OF_MODULE:
                raise
            print_error(missing_extra_message(fn.__name__.removesuffix("_command").replace("_", " "), exc.name))
            raise typer.Exit(code=2) from None
        except OSError as exc:
            where = f" {str(exc.filename)[:120]}" if exc.filename else ""
            print_error(f"{exc.strerror or exc}:{where}: check the path and its permissions")
            raise typer.Exit(code=2) from None
        except MemoryError:
            print_error("out of memory: the input is too large for this machine; use a smaller model, fewer GPUs or a shorter sequence")
            raise typer.Exit(code=2) from None
        except Exception as exc:  # a schema built from flags (SearchLimits, Parallelism) refusing a value
            if type(exc).__name__ != "ValidationError" or "pydantic" not in type(exc).__module__:
                raise
            from planner.io import format_validation_error

            print_error(format_validation_error(exc, "option"))
            raise typer.Exit(code=2) from None

    return wrapper  # type: ignore[return-value]


def path_text(value: str) -> Path:
    """typer `parser=` for an output file option: the path as typed. typer's own Path conversion drops a
    trailing '/', so `-o newdir/` (a folder meant) would be written as a file named `newdir`; kept as text,
    planner.io.check_writable sees the separator and refuses it in one line (exit 2)."""
    return value  # type: ignore[return-value]  # a str is what every writer below accepts as a path


def emit_text(text: str, output: Path | None) -> None:
    """Write text atomically to `output`, or to stdout when no file is given."""
    if output is None:
        typer.echo(text, nl=not text.endswith("\n"))
        return
    from planner.io import atomic_write_text

    atomic_write_text(output, text)


def recompute_modules_of(text: str | None) -> tuple[str, ...]:
    """--recompute-modules as a tuple of Megatron-Core module names (comma-separated; none given: ())."""
    from typing import get_args

    from planner.errors import BadInputError
    from planner.schemas.plan import RecomputeModule

    modules = tuple(m.strip() for m in (text or "").split(",") if m.strip())
    unknown = [m for m in modules if m not in get_args(RecomputeModule)]
    if unknown:
        raise BadInputError(f"--recompute-modules={text}: {', '.join(unknown)} is not a module; choose from "
                            f"{', '.join(get_args(RecomputeModule))} (Megatron-Core --recompute-modules names)")
    return modules
