"""`planner models list|show`: browse presets and inspect any model reference (preset, HF config.json, spec file)."""

import typer
from typer.core import TyperCommand, TyperGroup

from planner.cli.common import BoolHelpFlag, emit_text, guarded

HELP = (
    "Model presets and imported configs with their parameter counts. A model is a preset name, a HuggingFace "
    "config.json (or its folder; model_type {model_types}) or a model spec YAML/JSON.\n\n"
    "Examples:\n\n"
    "  planner models list\n\n"
    "  planner models show llama3-70b\n\n"
    "  planner models show path/to/config.json --json"
)


class ModelsGroup(BoolHelpFlag, TyperGroup):
    """`planner models`: its help names the HuggingFace model types, which are read (importing the importers and
    the schemas) only when the help is shown, not on every `planner models list`."""

    def format_help(self, ctx, formatter) -> None:
        from planner import api

        self.help = HELP.format(model_types=", ".join(api.model_types()))
        super().format_help(ctx, formatter)


class ModelsCommand(BoolHelpFlag, TyperCommand):
    """`planner models list|show`: typer's command with a bool --help default (see BoolHelpFlag)."""


models_app = typer.Typer(name="models", cls=ModelsGroup, help=HELP, no_args_is_help=True)


@models_app.command("list", cls=ModelsCommand)
@guarded
def list_models(
    json_output: bool = typer.Option(False, "--json", help="Print JSON (one object per preset) instead of a table."),
) -> None:
    """List the shipped presets: total and active parameters, layers, hidden, heads/kv heads, experts/top-k.

    Example: planner models list --json
    """
    from planner import api

    rows = api.model_rows()
    if json_output:
        from planner.io import canonical_json

        emit_text(canonical_json(rows), None)
        return
    from planner.report import console, models_table, print_table

    print_table(console(), models_table(rows))


@models_app.command("show", cls=ModelsCommand)
@guarded
def show_model(
    ref: str = typer.Argument(..., metavar="NAME_OR_PATH", help="A preset name, a HuggingFace config.json, or a model spec YAML/JSON."),
    json_output: bool = typer.Option(False, "--json", help="Print the resolved spec and the parameter breakdown as JSON."),
) -> None:
    """Show the resolved model spec and where its parameters are.

    Example: planner models show mixtral-8x7b
    """
    from planner import api
    from planner.io import canonical_json

    report = api.model_report(ref)
    if json_output:
        emit_text(canonical_json(report), None)
        return
    from planner.report import console, model_detail_tables, print_table

    out = console()
    for table in model_detail_tables(report):
        print_table(out, table)


def register(app: typer.Typer) -> None:
    """Add `planner models` to the main app."""
    app.add_typer(models_app, name="models")
