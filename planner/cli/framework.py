"""`planner framework list|show|validate`: the software stacks a plan can be made for, what each runs, check a file."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded

framework_app = typer.Typer(
    name="framework",
    help=(
        "Framework profiles: what each software stack runs (schedules, recompute, ZeRO, CP, EP, SP), which\n"
        "communication it overlaps, its memory habits and its flag names. Plans are made for one (--framework).\n\n"
        "Examples:\n\n"
        "  planner framework list\n\n"
        "  planner framework show megatron-core\n\n"
        "  planner framework validate my-stack.yaml"
    ),
    no_args_is_help=True,
)


def _row(profile) -> dict:
    caps = profile.capabilities
    return {
        "name": profile.name,
        "schedules": ", ".join(s.name for s in caps.schedules),
        "zero": ",".join(map(str, caps.zero.stages)), "zero_with_pp": ",".join(map(str, caps.zero.stages_with_pp)),
        "recompute": ", ".join(caps.recompute.modes), "cp": caps.context_parallel.supported,
        "ep_span": caps.expert_parallel.span if caps.expert_parallel.supported else "-",
        "precisions": ", ".join(caps.precisions), "stale_weights": caps.stale_weights,
    }


@framework_app.command("list")
@guarded
def list_command(json_output: bool = typer.Option(False, "--json", help="Print JSON rows instead of a table.")) -> None:
    """List the shipped framework profiles and what each runs.

    Example: planner framework list --json
    """
    from planner import api
    from planner.io import canonical_json

    rows = [_row(api.load_framework(name)) for name in api.list_frameworks()]
    if json_output:
        emit_text(canonical_json(rows), None)
        return
    from rich import box
    from rich.table import Table

    from planner.report import console, print_table

    table = Table(title="Framework profiles (planner/data/frameworks)", title_justify="left", box=box.SIMPLE_HEAD)
    for key in rows[0] if rows else ():
        table.add_column(key.replace("_", " "), overflow="fold", no_wrap=key == "name")
    for row in rows:
        table.add_row(*(str(v) for v in row.values()))
    print_table(console(), table)


@framework_app.command("show")
@guarded
def show_command(
    ref: str = typer.Argument(..., metavar="NAME_OR_PATH", help="A shipped profile name or a profile YAML/JSON file."),
    json_output: bool = typer.Option(False, "--json", help="Print the whole profile as JSON."),
) -> None:
    """Show one profile: every capability, behaviour and export name with its source.

    Example: planner framework show torchtitan
    """
    from planner import api
    from planner.io import canonical_json

    profile = api.load_framework(ref)
    if json_output:
        emit_text(canonical_json(profile), None)
        return
    from rich.table import Table

    from planner.report import console, print_table

    table = Table(title=f"{profile.display_name} ({profile.name}, {profile.versions})", title_justify="left", show_header=False)
    table.add_column("section", no_wrap=True)
    table.add_column("facts", overflow="fold")
    for section, value in _sections(profile):
        table.add_row(section, value)
    print_table(console(), table)


def _sections(profile) -> list[tuple[str, str]]:
    """(section, 'key=value, ...') rows of a profile, nested sections flattened one level."""
    rows = []
    for top in ("capabilities", "behaviour"):
        for key, value in getattr(profile, top).model_dump(mode="json").items():
            if isinstance(value, dict):
                value = ", ".join(f"{k}={v}" for k, v in value.items())
            elif isinstance(value, list) and value and isinstance(value[0], dict):
                value = "; ".join(", ".join(f"{k}={v}" for k, v in item.items()) for item in value)
            rows.append((f"{top}.{key}", str(value)))
    rows.append(("export", f"{profile.export.exporter}: " + ", ".join(f"{k}={v}" for k, v in profile.export.names.items())))
    rows.append(("practice", ", ".join(f"{k}={v}" for k, v in profile.practice.model_dump(mode="json").items())))
    return rows


@framework_app.command("validate")
@guarded
def validate_command(path: Path = typer.Argument(..., metavar="FILE", help="A framework profile YAML/JSON file.")) -> None:
    """Check a profile file against the schema: exit 0 when valid, 2 with the field, value and fix otherwise.

    Example: planner framework validate my-stack.yaml
    """
    from planner.errors import BadInputError
    from planner.io import load_file
    from planner.schemas.framework import FrameworkProfile

    try:
        profile = load_file(FrameworkProfile, path)
    except BadInputError as exc:
        raise BadInputError(f"{exc}; fix: correct the field named above (`planner framework show planner --json` "
                            f"prints a complete, valid profile)") from None
    emit_text(f"{path}: valid framework profile {profile.name!r} ({profile.display_name}, {profile.versions})\n", None)


def register(app: typer.Typer) -> None:
    """Add `planner framework` to the main app."""
    app.add_typer(framework_app, name="framework")
