"""`planner plan`: search the plan space for the fastest configuration that fits and write the LaunchPlan."""

from pathlib import Path
from typing import Optional

import typer

from planner.cli.common import emit_text, guarded, path_text, recompute_modules_of
from planner.cli.moe_options import (MOE_CHOICES, CapacityFactorOption, CpCommTypeOption, MoeDispatcherOption,
                                       MoeOverlapOption, RoutingSkewOption)
from planner.schedules import NAMES as SCHEDULE_NAMES
from planner.schedules import schedule as schedule_of

HELP = """Find the fastest plan that fits: DP x TP x PP x EP x CP, ZeRO, SP, micro-batching, recompute, schedule.

Searches the whole space and writes a versioned LaunchPlan JSON: the chosen configuration, stages, rank map, predicted step time and memory, the next best alternatives with why they lost, what was pruned and why, and how many configurations were considered. Exit 1 when nothing fits (the message says how far the closest configuration is and what would make it fit), 2 on bad input.

Examples:

  planner plan --model llama3-8b --topology dgx-h100 --gpus 8

  planner plan --model llama3-70b --topology dgx-h100 --nodes 8 --global-batch-size 512 -o plan.json

  planner plan --model mixtral-8x7b --topology dgx-a100-80g --nodes 4 --framework megatron-core --json

  planner plan --model llama3-70b --topology dgx-h100 --nodes 4 --framework torchtitan -o plan.json

  planner plan --model llama3-405b --topology dgx-h100 --nodes 2048 --tp 8 --top-k 5

  planner plan --model llama3-70b --nodes 8 --framework megatron-core --tp 8 --pp 4 --sp   # "what micro-batch and recompute?"
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
    routing_skew: RoutingSkewOption = None,
    capacity_factor: CapacityFactorOption = None,
    precision: str = typer.Option("bf16", "--precision", help="bf16 | amp-bf16 | fp32 | fp8"),
    profile: Optional[str] = typer.Option(None, "--profile", help="Measured profile for compute costs (default: analytic)."),
    top_k: int = typer.Option(3, "--top-k", min=0, help="Alternatives to keep in the plan."),
    time_limit: float = typer.Option(60.0, "--time-limit", min=0.1, help="Time limit of the whole search in seconds."),
    framework: str = typer.Option("planner", "--framework", help="Stack that runs the plan: planner (our executor, "
                                  "the default) | megatron-core | torchtitan | deepspeed | a profile file."),
    calibration: Optional[str] = typer.Option(None, "--calibration", help="Calibration overlay from `planner calibrate` "
                                              "(constants re-derived from your own runs of this GPU family and stack)."),
    runnable: bool = typer.Option(False, "--runnable", help="Alias of --framework planner (what `planner run` executes)."),
    allow_stale_weights: bool = typer.Option(False, "--allow-stale-weights", help="Let the search choose PipeDream-2BW "
                                             "(one-step-stale weights) where the framework runs it."),
    fastest: bool = typer.Option(False, "--fastest", help="Take the fastest predicted plan even where a plan inside the "
                                 "framework's practice is within the model's ranking band of it (default: prefer that one)."),
    dp: Optional[int] = typer.Option(None, "--dp", min=1, help="Fix the data-parallel degree."),
    tp: Optional[int] = typer.Option(None, "--tp", min=1, help="Fix the tensor-parallel degree."),
    pp: Optional[int] = typer.Option(None, "--pp", min=1, help="Fix the pipeline-parallel degree."),
    cp: Optional[int] = typer.Option(None, "--cp", min=1, help="Fix the context-parallel degree."),
    ep: Optional[int] = typer.Option(None, "--ep", min=1, help="Fix the expert-parallel degree (MoE)."),
    sp: Optional[bool] = typer.Option(None, "--sp/--no-sp", help="Fix sequence parallelism on or off."),
    vpp: Optional[int] = typer.Option(None, "--vpp", min=1, help="Fix the virtual stages per pipeline rank."),
    microbatch_size: Optional[int] = typer.Option(None, "--microbatch-size", min=1, help="Fix the micro-batch size."),
    recompute: Optional[str] = typer.Option(None, "--recompute", help="Fix recomputation: none | selective | full."),
    recompute_modules: Optional[str] = typer.Option(None, "--recompute-modules", help=(
        "What selective reruns, Megatron-Core's names, comma-separated: core_attn, layernorm, mla_up_proj, mlp, moe, "
        "moe_act, shared_experts (default: the framework's own selective).")),
    tp_overlap: Optional[str] = typer.Option(None, "--tp-overlap", help="Fix the TP overlap: none | domino."),
    moe_dispatcher: MoeDispatcherOption = None,
    moe_overlap: MoeOverlapOption = None,
    cp_comm_type: CpCommTypeOption = None,
    zero: Optional[int] = typer.Option(None, "--zero", min=0, max=3, help="Fix the ZeRO stage."),
    dp_replicate: int = typer.Option(1, "--dp-replicate", min=1, help="Fix HSDP replicas (dp = dp_replicate x dp_shard, "
                                     "ZeRO-2/3 only; not searched otherwise)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", help="Fix the schedule: " + " | ".join(SCHEDULE_NAMES) + "."),
    compression: str = typer.Option("none", "--compression", help=(
        "Communication compression: none | auto (per configuration, what the framework runs that is fastest; "
        "lossy, so opt-in) | zeropp | a list of qwz, hpz[:N], qgz, powersgd:RANK, bf16-grads, fp16-grads, fp8-dispatch.")),
    trace_memory: Optional[bool] = typer.Option(None, "--trace-memory/--no-trace-memory", help="Verify the chosen plan and "
                                                "its alternatives by tracing the executor's step (needs torch): a plan that "
                                                "does not fit by trace is replaced by the next one. Default: on for "
                                                "--framework planner, off for the other stacks."),
    json_output: bool = typer.Option(False, "--json", help="Print the LaunchPlan JSON instead of the summary."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", parser=path_text, help="Write the LaunchPlan JSON to this file (atomically)."),
) -> None:
    from planner import api
    from planner.io import canonical_json, check_writable

    check_writable(output)
    limits = _limits(top_k=top_k, time_limit=time_limit, stale=allow_stale_weights, zero=zero, schedule=schedule, fastest=fastest,
                     degrees=dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep),
                     fixed=dict(sp=sp, vpp=vpp, microbatch_size=microbatch_size, recompute=recompute, tp_overlap=tp_overlap,
                                dp_replicate=dp_replicate, recompute_modules=recompute_modules_of(recompute_modules) or None,
                                moe_dispatcher=moe_dispatcher, moe_overlap=moe_overlap, cp_comm_type=cp_comm_type))
    request = api.build_request(
        model=model, topology=topology, nodes=nodes, gpus=gpus, global_batch_size=global_batch_size,
        seq_len=seq_len, precision=_precision(precision), profile=profile, search=limits,
        framework=_framework(framework, runnable), calibration=calibration,
        moe=dict(routing_skew=routing_skew, capacity_factor=capacity_factor),
    )
    if compression.strip().lower() != "none":
        chosen = api.compression(compression, request.topology, auto=True)
        request = request.model_copy(update={"search": limits.model_copy(update={"compression": chosen})})
    plan = _search_with_progress(api, request, quiet=json_output and output is None, trace_memory=trace_memory)
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


def _framework(framework: str, runnable: bool) -> str:
    from planner.errors import BadInputError

    if runnable and framework != "planner":
        raise BadInputError(f"--runnable with --framework {framework}: --runnable means --framework planner; drop one")
    return framework


def _limits(*, top_k: int, time_limit: float, stale: bool, zero, schedule, degrees: dict, fixed: dict, fastest: bool = False):
    """SearchLimits with every dimension the user fixed (degrees, sp, vpp, micro-batch, recompute, overlap, zero,
    schedule); the search explores the rest."""
    from planner.errors import BadInputError
    from planner.schemas.plan import SearchLimits

    asked_stale = schedule in SCHEDULE_NAMES and schedule_of(schedule).stale_weights  # --schedule 2bw allows it
    fields: dict = dict(top_k=top_k, time_limit_s=time_limit, allow_stale_weights=stale or asked_stale,
                        prefer_practice=not fastest)
    checked = {"recompute": (("none", "selective", "full"), "recompute_modes"), "tp_overlap": (("none", "domino"), "tp_overlap"),
               **{name: (allowed, None) for name, allowed in MOE_CHOICES.items()}}  # key: the searched dimension
    for name, (allowed, key) in checked.items():
        if fixed.get(name) is not None:
            if fixed[name] not in allowed:
                raise BadInputError(f"--{name.replace('_', '-')}={fixed[name]!r}: choose one of {', '.join(allowed)}")
            if key is not None:  # a searched dimension narrowed to the one value
                fields[key] = (fixed[name],)
    fields.update({k: fixed[k] for k in ("sp", "vpp", "microbatch_size", "dp_replicate", "recompute_modules", "cp_comm_type",
                                         *MOE_CHOICES) if fixed.get(k) is not None})
    if zero is not None:
        fields["zero_stages"] = (zero,)
    if schedule is not None:
        if schedule not in SCHEDULE_NAMES:
            raise BadInputError(f"--schedule={schedule!r}: choose one of {', '.join(SCHEDULE_NAMES)}")
        fields["schedules"] = (schedule,)
    fields["fixed"] = {axis: value for axis, value in degrees.items() if value is not None}
    return SearchLimits(**fields)


def _search_with_progress(api, request, *, quiet: bool, trace_memory: bool | None = False):
    """Run api.plan with a progress bar on stderr (factorisations visited of those worth visiting)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.report import console

    if quiet:
        return api.plan(request, trace_memory=trace_memory)
    with Progress(TextColumn("searching"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console(stderr=True), transient=True) as bar:
        task = bar.add_task("search", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        return api.plan(request, progress=progress, trace_memory=trace_memory)


def _traced_peak(alt) -> str:
    from planner.units import GiB

    return f", traced {alt.traced_peak_bytes / GiB:.1f} GiB" if alt.traced_peak_bytes is not None else ""


def _render(plan, output: Optional[Path]) -> None:
    from rich.table import Table

    from planner.report import console, describe_axis_order, describe_pruned, print_table
    from planner.units import GiB

    out, par, pred = console(), plan.parallelism, plan.prediction
    out.print(f"[bold]{plan.request.model.name}[/] on {plan.request.gpus} x {plan.request.topology.device.name} "
              f"({plan.request.topology.name}), global batch {plan.batch.global_batch_size} x {plan.batch.seq_len}, "
              f"for framework {plan.request.framework}")
    degrees = f"dp={par.dp} tp={par.tp} pp={par.pp} cp={par.cp} ep={par.ep} vpp={par.vpp} sp={'on' if par.sp else 'off'}"
    degrees += f" dp_replicate={par.dp_replicate}" if par.dp_replicate > 1 else ""
    out.print(f"[bold green]{degrees}[/] zero={par.zero_stage} schedule={plan.schedule} mbs={plan.batch.microbatch_size} "
              f"x {plan.batch.num_microbatches} micro-batches; {describe_axis_order(par.axis_order)}")
    band = f" (+/-{pred.error_band:.0%}, 9 in 10 published runs)" if pred.error_band else ""
    out.print(f"step {pred.step_time_s:.3f} s{band}, {pred.tokens_per_s:,.0f} tokens/s, MFU {pred.mfu:.1%}, "
              f"peak {plan.memory.peak_bytes / GiB:.1f} of {plan.memory.capacity_bytes / GiB:.1f} GiB")
    for note in plan.notes:
        if (note.startswith("practice") and "chose this plan" in note) or "fits by trace" in note:
            out.print(note, markup=False)
    if plan.memory.traced is not None:
        traced = plan.memory.traced
        peak = f"{traced.peak_bytes / GiB:.1f} GiB: " if traced.peak_bytes is not None else ""
        out.print(f"memory by trace: {peak}{traced.note}", markup=False)
    table = Table(title="stages", title_justify="left", box=None, padding=(0, 2))
    for column in ("stage", "layers", "recompute", "peak GiB"):
        table.add_column(column, justify="right" if column != "layers" else "left")
    for stage in plan.stages:
        first, last = stage.layers[0], stage.layers[-1]
        peak = f"{stage.memory.peak_bytes / GiB:.1f}" if stage.memory else "-"
        rec = stage.recompute.mode + (f" ({', '.join(stage.recompute.modules)})" if stage.recompute.modules else "")
        rec = f"{rec}+{stage.recompute.full_layers} full" if stage.recompute.full_layers else rec
        table.add_row(str(stage.stage), f"{first} .. {last} ({len(stage.layers)})", rec, peak)
    print_table(out, table)
    for alt in plan.alternatives:
        p = alt.parallelism
        out.print(f"  alternative dp={p.dp} tp={p.tp} pp={p.pp} cp={p.cp} ep={p.ep} vpp={p.vpp} zero={p.zero_stage} "
                  f"mbs={alt.batch.microbatch_size} {alt.schedule} recompute={alt.recompute}: {alt.step_time_s:.3f} s "
                  f"({alt.why_not}){_traced_peak(alt)}", markup=False)
    considered = plan.solver.configurations_considered
    out.print(f"searched {considered:,} configurations: {plan.solver.configurations_evaluated:,} evaluated, "
              f"pruned: {describe_pruned(plan.pruned)}", markup=False)
    if output is not None:
        out.print(f"wrote {output}")
