"""`planner check plans/ [--tolerance 0.02] [--allow-change] [--json]`: CI regression of committed plans."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded

HELP = """CI regression: recompute committed plans and compare (exit 1 on a regression).

Each plan is recomputed from the request inside it.

Exit 1 when a predicted step time got worse than the tolerance, a plan no longer fits, or the chosen
configuration changed (unless --allow-change); exit 2 on a file that is not a plan. Prints a diff of
degrees, stages, memory and time for each plan that moved.

Examples:

  planner check examples/plans

  planner check plans/ --tolerance 0.05 --allow-change

  planner check plans/llama3-8b.json --json
"""

STYLE = {"ok": "green", "improved": "green", "changed": "yellow", "regressed": "red", "no_longer_fits": "red"}


def register(app: typer.Typer) -> None:
    app.command("check", help=HELP)(check_command)


@guarded
def check_command(
    target: Path = typer.Argument(..., help="A plan JSON or a folder of them (searched recursively)."),
    tolerance: float = typer.Option(0.02, "--tolerance", help="Allowed relative step-time increase (0.02 = 2%)."),
    allow_change: bool = typer.Option(False, "--allow-change", help="Accept a different configuration if it is not slower."),
    json_output: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    from planner import api
    from planner.io import canonical_json

    from rich.progress import Progress

    from planner.report import console

    with Progress(console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("recomputing plans", total=None)
        report = api.check(target, tolerance=tolerance, allow_change=allow_change,
                           progress=lambda done, total: bar.update(task, completed=done, total=total))
    if json_output:
        emit_text(canonical_json(api.check_report(report)), None)
    else:
        _render(report)
    if report.failed:
        raise typer.Exit(code=1)


def _render(report) -> None:
    from rich.table import Table

    from planner.report import console, print_table

    out = console()
    for result in report.results:
        rel = result.relative_change
        change = "" if rel is None else " (+0.0%)" if abs(rel) < 5e-4 else f" ({rel:+.1%})"
        out.print(f"[{STYLE[result.status]}]{result.status.upper():>14}[/] {result.path}{change}")
        for message in result.messages:
            out.print(f"               {message}", markup=False)
        moved = [d for d in result.differences if d.old != d.new]
        if moved and result.status != "ok":
            table = Table(show_header=True, box=None, padding=(0, 2))
            for column in ("", "committed", "recomputed"):
                table.add_column(column)
            for diff in result.differences:
                style = "bold" if diff.old != diff.new else "dim"
                table.add_row(diff.what, diff.old, diff.new, style=style)
            print_table(out, table)
    failed = sum(r.failed for r in report.results)
    verdict = "[red]FAILED[/]" if report.failed else "[green]passed[/]"
    out.print(f"{verdict}: {len(report.results)} plan(s), {failed} failing (tolerance {report.tolerance:.1%}"
              f"{', changes allowed' if report.allow_change else ''})")
