"""`planner schema [plan|model|topology|profile|request] [-o FILE]`: JSON Schema of every file format."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded, path_text

HELP = """Print the JSON Schema (draft 2020-12) of a file format, or of all of them.

Examples:

  planner schema plan -o launch-plan.schema.json

  planner schema model

  planner schema            # {"plan": ..., "model": ..., "topology": ..., "profile": ..., "request": ...}
"""


def register(app: typer.Typer) -> None:
    app.command("schema", help=HELP)(schema_command)


@guarded
def schema_command(
    name: str | None = typer.Argument(None, help="plan | model | topology | profile | request (default: all)"),
    output: Path | None = typer.Option(None, "-o", "--output", parser=path_text, help="Write here (atomically) instead of stdout."),
) -> None:
    from planner import api
    from planner.io import canonical_json

    emit_text(canonical_json(api.schema(name)), output)
