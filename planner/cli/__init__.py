"""`planner` command line: a thin typer adapter over `planner.api`.

Each command lives in its own module under planner/cli/ and exposes `register(app)`. Exit codes:
0 ok, 1 no feasible plan or regression found, 2 bad input. Errors print one line, never a traceback.

Commands are imported lazily: `planner --help` lists them from COMMANDS below without importing any command
module (nor pydantic, rich or numpy), and `planner plan ...` imports only planner/cli/plan.py. A CLI call is
mostly interpreter start and imports (the cost model itself runs in milliseconds), so this is what keeps
`planner --help` fast (benchmarks/cli_startup.py).
"""

import importlib
import sys

import typer
from typer import _click
from typer._click import exceptions as click_exceptions
from typer.core import TyperGroup
from typer.exceptions import Abort

from planner.cli.common import BoolHelpFlag
from planner.errors import PlannerError

# name: (module under planner/cli, one line for `planner --help`), in the order --help lists them.
COMMANDS = {
    "estimate": ("estimate", "Predict one configuration: step time and its breakdown, tokens/s, MFU, memory per pipeline rank."),
    "plan": ("plan", "Find the fastest plan that fits: DP x TP x PP x EP x CP, ZeRO, SP, micro-batching, recompute, schedule."),
    "run": ("run", "Run a LaunchPlan on this machine with torchrun and write a run report (needs the torch extra)."),
    "launch": ("launch", "Print the per-node torchrun commands and a SLURM sbatch script that start a LaunchPlan on a cluster."),
    "export": ("export", "Translate a LaunchPlan into a framework's own configuration."),
    "check": ("check", "CI regression: recompute committed plans and compare (exit 1 on a regression)."),
    "explain": ("explain", "Explain a plan: why these degrees, where time and memory go, what the runner-up was."),
    "serve": ("serve", "Run the optimizer service (HTTP JSON API, OpenAPI docs at /docs; needs the service extra)."),
    "schema": ("schema", "Print the JSON Schema (draft 2020-12) of a file format, or of all of them."),
    "models": ("models", "Model presets and imported configs (HuggingFace config.json, spec files) with their parameter counts."),
    "topology": ("topology", "Cluster topologies: devices, fabrics and the bandwidth a process group sees."),
    "framework": ("framework", "Framework profiles: what each software stack runs, overlaps and calls its flags."),
    "calibrate": ("calibrate", "Derive a calibration overlay for your cluster and stack from your own runs' logs (Megatron-LM, torchtitan, JSON)."),
    "profile": ("profile", "Measure per-layer and per-operator costs with torch, or collective times (needs the torch extra)."),
}


class LazyGroup(BoolHelpFlag, TyperGroup):
    """The top-level group: commands listed from COMMANDS, each module imported only when its command runs."""

    def list_commands(self, ctx: _click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: _click.Context, cmd_name: str) -> _click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        try:
            module = importlib.import_module(f"planner.cli.{entry[0]}")
        except ModuleNotFoundError as exc:
            if exc.name == f"planner.cli.{entry[0]}":
                return None  # command not built yet
            raise
        holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
        module.register(holder)
        return typer.main.get_group(holder).get_command(ctx, cmd_name)

    def format_help(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        """Plain click help (no rich import) with the one-line helps of COMMANDS (no command module import)."""
        _click.Command.format_help(self, ctx, formatter)

    def format_commands(self, ctx: _click.Context, formatter: _click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(name, text) for name, (_, text) in COMMANDS.items()])


app = typer.Typer(
    name="planner",
    cls=LazyGroup,
    help="Auto-parallel planner for LLM training: plan, estimate, profile, run and export DP x TP x PP x EP x CP plans.\n\n"
         "Start with: planner plan --model llama3-8b --gpus 8. Every command has --help with examples.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _print_version(value: bool) -> None:
    """`planner --version`: the version, then where the data is and what it was built from, one fact a line."""
    if not value:
        return
    from planner import api

    info = api.version_info()
    print(f"planner {info.pop('version')}")
    for key, text in info.items():
        print(f"{key.replace('_', ' ')}: {text}")
    raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and the data's provenance (package folder, git commit), then exit."),
) -> None:
    """The group itself does nothing; its commands do."""


def main() -> None:
    """Console-script entry point. Commands map PlannerError to exit codes themselves (see common.guarded);
    this is the last line of defence for errors raised while building the app or parsing options."""
    try:
        code = app(prog_name="planner", standalone_mode=False)
    except click_exceptions.NoArgsIsHelpError as exc:  # `planner` alone: the help, as click shows it
        exc.show()
        sys.exit(exc.exit_code)
    except click_exceptions.UsageError as exc:  # a bad option value or name: one line, exit 2 (click's box is 4)
        where = f" (see `{exc.ctx.command_path} --help`)" if exc.ctx is not None else ""
        print(f"error: {exc.format_message()}{where}", file=sys.stderr)
        sys.exit(2)
    except Abort:  # Ctrl-C at a prompt, or typer's own abort (typer.exceptions, not typer._click.exceptions)
        sys.exit(1)
    except PlannerError as exc:
        from planner.cli.common import print_error

        print_error(exc)
        sys.exit(exc.exit_code)
    sys.exit(code if isinstance(code, int) else 0)
