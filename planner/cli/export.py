"""`planner export plan.json --to torchtitan|megatron|deepspeed|torchrun|slurm [-o FILE] [--json]`."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded, path_text

HELP = """Translate a LaunchPlan into a framework's own configuration.

Each target re-checks the plan against that framework's profile and rules and refuses (exit 2, one line saying
why) what it cannot run or express; approximations are printed as warnings, and how to hand the file to the
framework (e.g. DeepSpeed's mpu/topology for tp or pp > 1) as usage lines, on stderr.

Examples:

  planner export plan.json --to torchtitan -o torchtitan_args.sh

  planner export plan.json --to megatron -o megatron_args.sh

  planner export plan.json --to deepspeed -o ds_config.json

  planner export plan.json --to slurm -o job.sbatch
"""


def register(app: typer.Typer) -> None:
    app.command("export", help=HELP)(export_command)


@guarded
def export_command(
    plan: Path = typer.Argument(..., help="A LaunchPlan JSON written by `planner plan` or `planner estimate`."),
    to: str = typer.Option(..., "--to", help="torchtitan | megatron | deepspeed | torchrun | slurm"),
    output: Path | None = typer.Option(None, "-o", "--output", parser=path_text, help="Write here (atomically) instead of stdout."),
    json_output: bool = typer.Option(False, "--json", help="Print {target, suffix, text, warnings, usage} as JSON."),
) -> None:
    from planner import api
    from planner.io import canonical_json, check_writable

    check_writable(output)
    result = api.export(plan, to)
    if json_output:
        payload = {"target": result.target, "suffix": result.suffix, "text": result.text, "warnings": list(result.warnings),
                   "usage": list(result.usage)}
        emit_text(canonical_json(payload), output)
        return
    emit_text(result.text, output)
    from planner.report import console

    err = console(stderr=True)
    for warning in result.warnings:
        err.print(f"warning: {warning}", style="yellow", markup=False)
    for line in result.usage:
        err.print(f"usage: {line}", markup=False)
    if output is not None:
        err.print(f"wrote {output} ({result.target})", markup=False)
