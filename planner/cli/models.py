"""`planner models list|show`: browse presets and inspect any model reference (preset, HF config.json, spec file)."""

import typer

from planner.cli.common import emit_text, guarded
from planner.models.hf import supported_model_types

models_app = typer.Typer(
    name="models",
    help=(
        "Model presets and imported configs with their parameter counts. A model is a preset name, a HuggingFace "
        f"config.json (or its folder; model_type {', '.join(supported_model_types())}) or a model spec YAML/JSON.\n\n"
        "Examples:\n\n"
        "  planner models list\n\n"
        "  planner models show llama3-70b\n\n"
        "  planner models show path/to/config.json --json"
    ),
    no_args_is_help=True,
)


@models_app.command("list")
@guarded
def list_models(
    json_output: bool = typer.Option(False, "--json", help="Print JSON (one object per preset) instead of a table."),
) -> None:
    """List the shipped presets: total and active parameters, layers, hidden, heads/kv heads, experts/top-k.

    Example: planner models list --json
    """
    from planner.io import canonical_json
    from planner.models import list_presets, load_preset
    from planner.models.summary import model_row

    rows = [model_row(load_preset(name)) for name in list_presets()]
    if json_output:
        emit_text(canonical_json(rows), None)
        return
    from planner.report import console, models_table

    console().print(models_table(rows))


@models_app.command("show")
@guarded
def show_model(
    ref: str = typer.Argument(..., metavar="NAME_OR_PATH", help="A preset name, a HuggingFace config.json, or a model spec YAML/JSON."),
    json_output: bool = typer.Option(False, "--json", help="Print the resolved spec and the parameter breakdown as JSON."),
) -> None:
    """Show the resolved model spec and where its parameters are.

    Example: planner models show mixtral-8x7b
    """
    from planner.io import canonical_json
    from planner.models import load_model
    from planner.models.summary import model_report

    report = model_report(load_model(ref))
    if json_output:
        emit_text(canonical_json(report), None)
        return
    from planner.report import console, model_detail_tables

    out = console()
    for table in model_detail_tables(report):
        out.print(table)


def register(app: typer.Typer) -> None:
    """Add `planner models` to the main app."""
    app.add_typer(models_app, name="models")
