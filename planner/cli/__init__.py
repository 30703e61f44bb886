"""`planner` command line: a thin typer adapter over `planner.api`.

Each command lives in its own module under planner/cli/ and exposes `register(app)`. Exit codes:
0 ok, 1 no feasible plan or regression found, 2 bad input. Errors print one line, never a traceback.
"""

import importlib
import sys

import typer

from planner.errors import PlannerError

# Command modules, registered in this order (each defines `register(app: typer.Typer) -> None`).
COMMAND_MODULES = (
    "models",
    "topology",
    "framework",
    "estimate",
    "plan",
    "profile",
    "run",
    "launch",
    "export",
    "check",
    "explain",
    "serve",
    "schema",
)

app = typer.Typer(
    name="planner",
    help="Auto-parallel planner for LLM training: plan, estimate, profile, run and export DP x TP x PP x EP x CP plans.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register_all() -> None:
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(f"planner.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"planner.cli.{name}":
                continue  # command not built yet
            raise
        module.register(app)


_register_all()


def main() -> None:
    """Console-script entry point. Commands map PlannerError to exit codes themselves (see common.guarded);
    this is the last line of defence for errors raised while building the app."""
    try:
        app(standalone_mode=True)
    except PlannerError as exc:
        from planner.cli.common import print_error

        print_error(exc)
        sys.exit(exc.exit_code)
