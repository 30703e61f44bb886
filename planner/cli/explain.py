"""`planner explain plan.json [--plot out.png] [--json]`: a readable account of a plan, and its pictures."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded, path_text

HELP = """Explain a plan: why these degrees, where time and memory go, what the runner-up was.

Also what the search pruned. --plot draws the pipeline schedule, memory per stage and the candidates.

Examples:

  planner explain plan.json

  planner explain plan.json --plot plan.png

  planner explain plan.json --json
"""


def register(app: typer.Typer) -> None:
    app.command("explain", help=HELP)(explain_command)


@guarded
def explain_command(
    plan: Path = typer.Argument(..., help="A LaunchPlan JSON."),
    plot: Path | None = typer.Option(None, "--plot", parser=path_text, help="Write a PNG: schedule timeline, memory per stage, candidates."),
    json_output: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
    framework: list[str] | None = typer.Option(None, "--framework", help="Judge the plan against this stack (repeatable; "
                                               "default: every shipped profile): runs it, or the stack's reason."),
) -> None:
    from planner import api
    from planner.cli.common import require_extra
    from planner.io import canonical_json, check_writable, load_file
    from planner.schemas.plan import LaunchPlan

    if plot is not None:
        require_extra("explain --plot", "matplotlib")
        check_writable(plot, flag="--plot")
    loaded = load_file(LaunchPlan, plan)
    explanation = api.explain(loaded, frameworks=framework or None)
    if plot is not None:
        from planner.plot import plot_plan

        plot_plan(loaded, plot)
    if json_output:
        emit_text(canonical_json(explanation.to_dict() | ({"plot": str(plot)} if plot else {})), None)
        return
    _render(explanation)
    if plot is not None:
        from planner.report import console

        console().print(f"wrote {plot}", markup=False)


def _table(title: str, columns: tuple[str, ...]):
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for index, column in enumerate(columns):
        table.add_column(column, justify="left" if index == 0 else "right")
    return table


def _render(ex) -> None:
    from planner.report import console, print_table, print_wrapped

    out = console()
    print_wrapped(out, ex.headline)
    out.print("\n[bold]Why this configuration[/]")
    for reason in ex.reasons:
        print_wrapped(out, f"  - {reason}")
    time = _table("Where the time goes (per step)", ("part", "seconds", "share"))
    for part in ex.time:
        time.add_row(part.part, f"{part.seconds:.4g}", f"{part.fraction:.1%}")
    print_table(out, time)
    memory = _table(f"Memory per pipeline rank (GiB, capacity {ex.capacity_gib:.1f})",
                    ("rank", "weights", "grads", "optimizer", "activations", "other", "peak", "of capacity"))
    for row in ex.memory:
        memory.add_row(str(row.stage), *(f"{v:.2f}" for v in (row.params_gib, row.grads_gib, row.optimizer_gib,
                       row.activations_gib, row.other_gib, row.peak_gib)), f"{row.capacity_fraction:.0%}")
    print_table(out, memory)
    if ex.runner_up is not None:
        alts = _table("Runner-up and other candidates", ("differs from the chosen plan", "step s", "vs chosen", "peak GiB", "why not"))
        for alt in ex.alternatives:
            alts.add_row(alt.differs, f"{alt.step_time_s:.4g}", f"{alt.slower_by:+.1%}", f"{alt.peak_gib:.1f}", alt.why_not)
        print_table(out, alts)
    if ex.pruned:
        print_wrapped(out, "Pruned by the search: " + ", ".join(f"{k}={v:,}" for k, v in ex.pruned.items()))
    out.print("[bold]Which frameworks run it[/]")
    for name, verdict in ex.frameworks.items():
        print_wrapped(out, f"  - {name}: {verdict}")
    if ex.compression:
        print_wrapped(out, "Communication compression on this cluster (what the framework runs at this configuration)")
        for row in ex.compression:
            print_wrapped(out, f"  - {row.compression}: {row.step_time_s:.4g} s ({row.change:+.1%}), peak "
                               f"{row.peak_gib:.1f} GiB: {row.verdict}")
    for note in ex.notes:
        print_wrapped(out, f"note: {note}")
