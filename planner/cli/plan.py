"""`planner plan`: search the plan space for the fastest configuration that fits and write the LaunchPlan."""

from pathlib import Path
from typing import Optional

import typer

from planner.cli.common import emit_text, guarded

HELP = """Find the fastest plan that fits: DP x TP x PP x EP x CP, ZeRO, SP, micro-batching, recompute, schedule.

Searches the whole space and writes a versioned LaunchPlan JSON: the chosen configuration, stages, rank map, predicted step time and memory, the next best alternatives with why they lost, what was pruned and why, and how many configurations were considered. Exit 1 when nothing fits (the message says how far the closest configuration is and what would make it fit), 2 on bad input.

Examples:

  planner plan --model llama3-8b --topology dgx-h100 --gpus 8

  planner plan --model llama3-70b --topology dgx-h100 --nodes 8 --global-batch-size 512 -o plan.json

  planner plan --model mixtral-8x7b --topology dgx-a100-80g --nodes 4 --runnable --json

  planner plan --model llama3-405b --topology dgx-h100 --nodes 2048 --tp 8 --top-k 5
"""


def register(app: typer.Typer) -> None:
    app.command("plan", help=HELP)(plan_command)


@guarded
def plan_command(
    model: str = typer.Option("llama3-8b", "--model", help="Preset name, HuggingFace config.json, or model spec file."),
    topology: str = typer.Option("dgx-h100", "--topology", help="Topology preset or file."),
    nodes: Optional[int] = typer.Option(None, "--nodes", min=1, help="Nodes to use (default: enough for --gpus, else the preset's)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="GPUs to use (default: all GPUs of the nodes)."),
    global_batch_size: Optional[int] = typer.Option(None, "--global-batch-size", min=1, help="Sequences per step (default ~4M tokens)."),
    seq_len: Optional[int] = typer.Option(None, "--seq-len", min=1, help="Sequence length (default: the model's)."),
    precision: str = typer.Option("bf16", "--precision", help="bf16 | amp-bf16 | fp32 | fp8"),
    profile: Optional[str] = typer.Option(None, "--profile", help="Measured profile for compute costs (default: analytic)."),
    top_k: int = typer.Option(3, "--top-k", min=0, help="Alternatives to keep in the plan."),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1, help="Solver time limit in seconds (per ILP)."),
    runnable: bool = typer.Option(False, "--runnable", help="Only what the executor can run (planner.capabilities: no cp, no fp8, no domino with sp or MoE)."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Fix the tensor-parallel degree."),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="Fix the pipeline-parallel degree."),
    zero: Optional[int] = typer.Option(None, "--zero", min=0, max=3, help="Fix the ZeRO stage."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="Fix the schedule: gpipe | 1f1b | interleaved | 2bw | zero-bubble."),
    json_output: bool = typer.Option(False, "--json", help="Print the LaunchPlan JSON instead of the summary."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Write the LaunchPlan JSON to this file (atomically)."),
) -> None:
    from planner import api
    from planner.io import canonical_json

    limits = _limits(top_k=top_k, time_limit=time_limit, runnable=runnable, tp=tp, pp=pp, zero=zero, schedule=schedule)
    request = api.build_request(
        model=model, topology=topology, nodes=nodes, gpus=gpus, global_batch_size=global_batch_size,
        seq_len=seq_len, precision=_precision(precision), profile=profile, search=limits,
    )
    plan = _search_with_progress(api, request, quiet=json_output and output is None)
    text = canonical_json(plan)
    if output is not None:
        emit_text(text, output)
    if json_output:
        emit_text(text, None)
    else:
        _render(plan, output)


def _precision(value: str):
    from planner.errors import BadInputError

    allowed = ("bf16", "amp-bf16", "fp32", "fp8")
    if value not in allowed:
        raise BadInputError(f"--precision={value!r}: choose one of {', '.join(allowed)}")
    return value


def _limits(*, top_k: int, time_limit: float, runnable: bool, tp, pp, zero, schedule):
    from planner.errors import BadInputError
    from planner.schemas.plan import SearchLimits

    fields: dict = dict(top_k=top_k, time_limit_s=time_limit, runnable=runnable)
    if zero is not None:
        fields["zero_stages"] = (zero,)
    if schedule is not None:
        allowed = ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble")
        if schedule not in allowed:
            raise BadInputError(f"--schedule={schedule!r}: choose one of {', '.join(allowed)}")
        fields["schedules"] = (schedule,)
    fields["fixed"] = {axis: value for axis, value in (("tp", tp), ("pp", pp)) if value is not None}
    return SearchLimits(**fields)


def _search_with_progress(api, request, *, quiet: bool):
    """Run api.plan with a progress bar on stderr (factorisations visited of those worth visiting)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.report import console

    if quiet:
        return api.plan(request)
    with Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("search", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return api.plan(request, progress=progress)


def _render(plan, output: Optional[Path]) -> None:
    from rich.table import Table

    from planner.report import console
    from planner.units import GiB

    out, par, pred = console(), plan.parallelism, plan.prediction
    out.print(f"[bold]{plan.request.model.name}[/] on {plan.request.gpus} x {plan.request.topology.device.name} "
              f"({plan.request.topology.name}), global batch {plan.batch.global_batch_size} x {plan.batch.seq_len}")
    degrees = f"dp={par.dp} tp={par.tp} pp={par.pp} cp={par.cp} ep={par.ep} vpp={par.vpp} sp={'on' if par.sp else 'off'}"
    out.print(f"[bold green]{degrees}[/] zero={par.zero_stage} schedule={plan.schedule} mbs={plan.batch.microbatch_size} "
              f"x {plan.batch.num_microbatches} micro-batches, axes {'>'.join(par.axis_order)}")
    out.print(f"step {pred.step_time_s:.3f} s, {pred.tokens_per_s:,.0f} tokens/s, MFU {pred.mfu:.1%}, "
              f"peak {plan.memory.peak_bytes / GiB:.1f} of {plan.memory.capacity_bytes / GiB:.1f} GiB")
    table = Table(title="stages", title_justify="left", box=None, padding=(0, 2))
    for column in ("stage", "layers", "recompute", "peak GiB"):
        table.add_column(column, justify="right" if column != "layers" else "left")
    for stage in plan.stages:
        first, last = stage.layers[0], stage.layers[-1]
        peak = f"{stage.memory.peak_bytes / GiB:.1f}" if stage.memory else "-"
        rec = f"{stage.recompute.mode}+{stage.recompute.full_layers} full" if stage.recompute.full_layers else stage.recompute.mode
        table.add_row(str(stage.stage), f"{first} .. {last} ({len(stage.layers)})", rec, peak)
    out.print(table)
    for alt in plan.alternatives:
        p = alt.parallelism
        out.print(f"  alternative dp={p.dp} tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep} vpp={p.vpp} zero={p.zero_stage} "
                  f"mbs={alt.batch.microbatch_size} {alt.schedule} recompute={alt.recompute}: {alt.step_time_s:.3f} s "
                  f"({alt.why_not})", markup=False)
    considered = plan.solver.configurations_considered
    out.print(f"searched {considered:,} configurations: {plan.solver.configurations_evaluated:,} evaluated, "
              f"pruned {', '.join(f'{k} {v:,}' for k, v in sorted(plan.pruned.items()))}", markup=False)
    if output is not None:
        out.print(f"wrote {output}")
