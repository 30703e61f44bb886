"""`planner estimate`: predict step time, throughput, MFU and memory of one fully given configuration.

A thin adapter: options -> planner.api.build_request + planner.api.estimate -> a rich table or the LaunchPlan
JSON. Exit codes: 0 fits, 1 does not fit or does not divide (the reason is printed), 2 bad input.
"""

from __future__ import annotations

from pathlib import Path

import typer
from pydantic import ValidationError
from rich import box
from rich.table import Table

from planner.cli.common import emit_text, guarded, path_text, recompute_modules_of
from planner.cli.moe_options import (MOE_CHOICES, CapacityFactorOption, CpCommTypeOption, MoeDispatcherOption,
                                       MoeOverlapOption, RoutingSkewOption)
from planner.errors import BadInputError
from planner.io import format_validation_error
from planner.schedules import DEFAULT as DEFAULT_SCHEDULE
from planner.schedules import NAMES as SCHEDULE_NAMES
from planner.schedules import V_PLACED
from planner.schemas.compression import NONE, Compression
from planner.schemas.dims import ParallelDims
from planner.schemas.plan import Configuration, LaunchPlan, Parallelism, PlanRequest
from planner.units import GiB


def _summary_table(plan: LaunchPlan) -> Table:
    par, batch, pred = plan.parallelism, plan.batch, plan.prediction
    table = Table(title=f"Estimate: {plan.request.model.name} on {plan.request.gpus} x {plan.request.topology.device.name}",
                  title_justify="left", show_header=False, box=box.SIMPLE)
    table.add_column("what", style="bold")
    table.add_column("value")
    degrees = f"dp={par.dp} tp={par.tp} pp={par.pp} ep={par.ep} cp={par.cp} sp={par.sp} vpp={par.vpp} zero={par.zero_stage}"
    degrees += f" dp_replicate={par.dp_replicate} (HSDP)" if par.dp_replicate > 1 else ""
    table.add_row("parallelism", degrees + f" tp_overlap={par.tp_overlap} order={'/'.join(par.axis_order)}")
    priced = [f"{name}={value}" for name, value in (("moe_dispatcher", par.moe_dispatcher), ("moe_overlap", par.moe_overlap),
                                                    ("cp_comm_type", par.cp_comm_type)) if value is not None]
    if priced:
        table.add_row("communication", " ".join(priced))
    table.add_row("batch", f"global {batch.global_batch_size} x seq {batch.seq_len}; micro-batch {batch.microbatch_size} x {batch.num_microbatches}")
    rec = plan.stages[0].recompute
    mode = f"{rec.mode} ({', '.join(rec.modules)})" if rec.modules else rec.mode
    table.add_row("schedule / recompute / precision", f"{plan.schedule} / {mode} / {plan.request.precision}")
    table.add_row("framework", plan.request.framework)
    table.add_row("step time", f"{pred.step_time_s:.4g} s" + (f" +/-{pred.error_band:.0%}" if pred.error_band else ""))
    table.add_row("tokens/s", f"{pred.tokens_per_s:,.0f}")
    table.add_row("TFLOP/s per GPU", f"model {pred.model_tflops_per_gpu:.1f}, hardware {pred.hardware_tflops_per_gpu:.1f}")
    table.add_row("MFU / HFU", f"{pred.mfu:.1%} / {pred.hfu:.1%}")
    fits = "[green]fits[/green]" if plan.feasible else "[red]does not fit[/red]"
    table.add_row("memory", f"peak {plan.memory.peak_bytes / GiB:.2f} GiB of {plan.memory.capacity_bytes / GiB:.2f} GiB: {fits}")
    if plan.memory.traced is not None:
        table.add_row("memory by trace", plan.memory.traced.note)
    return table


def _breakdown_table(plan: LaunchPlan) -> Table:
    pred = plan.prediction
    table = Table(title="Step time breakdown", title_justify="left", box=box.SIMPLE_HEAD)
    table.add_column("part")
    table.add_column("seconds", justify="right")
    table.add_column("share", justify="right")
    for name, value in pred.breakdown.model_dump().items():
        table.add_row(name.removesuffix("_s"), f"{value:.4g}", f"{value / pred.step_time_s:.1%}" if pred.step_time_s else "-")
    return table


def _memory_table(plan: LaunchPlan) -> Table:
    table = Table(title="Memory per pipeline rank (GiB)", title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("rank", "params", "grads", "optimizer", "activations", "other", "peak", "layers"):
        table.add_column(header, justify="right" if header not in ("layers",) else "left")
    from planner import api

    layers_of: dict[int, int] = {}
    for stage in plan.stages:
        rank = api.stage_rank(stage.stage, pp=plan.parallelism.pp, schedule=plan.schedule)
        layers_of[rank] = layers_of.get(rank, 0) + sum(name.startswith("layers.") for name in stage.layers)
    for mem in plan.memory.per_stage:
        style = "red" if mem.peak_bytes > plan.memory.capacity_bytes else None
        cells = [mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes, mem.activations_bytes, mem.other_bytes, mem.peak_bytes]
        table.add_row(str(mem.stage), *(f"{c / GiB:.2f}" for c in cells), str(layers_of.get(mem.stage, 0)), style=style)
    return table


def _traced_table(plan: LaunchPlan) -> Table | None:
    """Traced (the executor's step on fake tensors) vs formula, per part, for each traced rank."""
    traced = plan.memory.traced
    if traced is None or not traced.ranks:
        return None
    table = Table(title="Memory traced vs formula (GiB)", title_justify="left", box=box.SIMPLE_HEAD)
    for header in ("pp rank", "", "params", "grads", "optimizer", "activations", "transient+other", "peak"):
        table.add_column(header, justify="right")
    formula = {m.stage: m for m in plan.memory.per_stage}
    for rank in traced.ranks:
        cells = [rank.params_bytes, rank.grads_bytes, rank.optimizer_bytes, rank.activations_bytes,
                 rank.transient_bytes + rank.other_bytes, rank.peak_bytes]
        table.add_row(str(rank.pp_rank), "traced", *(f"{c / GiB:.2f}" for c in cells))
        if (mem := formula.get(rank.pp_rank)) is not None:
            cells = [mem.params_bytes, mem.grads_bytes, mem.optimizer_bytes, mem.activations_bytes, mem.other_bytes, mem.peak_bytes]
            table.add_row("", "formula", *(f"{c / GiB:.2f}" for c in cells))
    return table


def plan_tables(plan: LaunchPlan) -> list[Table]:
    """The tables `planner estimate` prints (reusable by other commands)."""
    traced = _traced_table(plan)
    return [_summary_table(plan), _breakdown_table(plan), _memory_table(plan), *([traced] if traced is not None else [])]


CHOICES = {
    "recompute": ("none", "selective", "full"),
    "schedule": SCHEDULE_NAMES,
    "tp_overlap": ("none", "domino"),
    "zero": (0, 1, 2, 3),
    "precision": ("bf16", "amp-bf16", "fp32", "fp8"),
    **MOE_CHOICES,
}


def check_request_flags(*, precision: str, global_batch_size: int | None, seq_len: int | None) -> None:
    """Flags that go into the PlanRequest, checked first so that bad values are one line, not a traceback."""
    if precision not in CHOICES["precision"]:
        raise BadInputError(f"--precision={precision}: choose one of {', '.join(CHOICES['precision'])}")
    for name, value in (("global-batch-size", global_batch_size), ("seq-len", seq_len)):
        if value is not None and value < 1:
            raise BadInputError(f"--{name}={value} must be at least 1")


def stage_layers_of(text: str | None, first: int | None, last: int | None, *, num_layers: int, pp: int,
                    vpp: int) -> tuple[int, ...] | None:
    """--stage-layers "3,2*29,0,0" (decoder layers per virtual stage, stage = v*pp + r; "n*k" repeats n k times)
    or --first-stage-layers/--last-stage-layers (layers of the first/last pipeline rank over its vpp chunks, the
    middle ranks sharing the rest evenly: Megatron-Core's --decoder-first/last-pipeline-num-layers rule,
    planner.frameworks_split.megatron_split); None: the balanced split."""
    from planner import api

    if text is not None and (first is not None or last is not None):
        raise BadInputError("--stage-layers with --first-stage-layers/--last-stage-layers: give one or the other")
    if text is not None:
        counts: list[int] = []
        for item in text.split(","):
            parts = item.strip().split("*")
            if len(parts) > 2 or not all(p.strip().isdigit() for p in parts) or len(counts) > 100_000:
                raise BadInputError(f"--stage-layers={text!r}: give decoder layers per virtual stage as integers, e.g. "
                                    "'3,4*14,2' (n*k repeats n k times)")
            counts += [int(parts[0])] * (int(parts[1]) if len(parts) == 2 else 1)
        return tuple(counts)
    if first is None and last is None:
        return None
    try:
        return api.megatron_split(num_layers, pp, vpp, first=first, last=last)
    except BadInputError as exc:
        raise BadInputError(f"--first-stage-layers={first} --last-stage-layers={last}: {exc}") from None


def configuration(request: PlanRequest, *, dp: int | None, tp: int, pp: int, ep: int, cp: int, sp: bool, vpp: int,
                  zero: int, tp_overlap: str, microbatch_size: int, schedule: str, recompute: str,
                  compression: Compression = NONE, stage_layers: tuple[int, ...] | None = None,
                  dp_replicate: int = 1, recompute_modules: str | None = None,
                  stated: dict[str, str | None] | None = None) -> Configuration:
    """The Configuration of the flags; dp defaults to gpus / (tp*pp*cp), which must divide. `stated`: the MoE
    dispatcher, MoE overlap and context-parallel flavour the job runs (Parallelism fields; None: the cost's choice)."""
    stated = {name: value for name, value in (stated or {}).items() if value is not None}
    checked = [("recompute", recompute), ("schedule", schedule), ("tp_overlap", tp_overlap), ("zero", zero)]
    for name, value in checked + [(name, value) for name, value in stated.items() if name in CHOICES]:
        if value not in CHOICES[name]:
            raise BadInputError(f"--{name.replace('_', '-')}={value}: choose one of {', '.join(map(str, CHOICES[name]))}")
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("cp", cp), ("vpp", vpp), ("microbatch-size", microbatch_size),
                        ("dp-replicate", dp_replicate)):
        if value < 1:
            raise BadInputError(f"--{name}={value} must be at least 1")
    modules = recompute_modules_of(recompute_modules)
    dims = ParallelDims.resolve(request.gpus, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, dp_replicate=dp_replicate)
    try:
        parallelism = Parallelism(**dims.as_dict(), sp=sp, vpp=vpp, zero_stage=zero, tp_overlap=tp_overlap, compression=compression,
                                  **stated)
        return Configuration(parallelism=parallelism, microbatch_size=microbatch_size, schedule=schedule, recompute=recompute,
                             recompute_modules=modules, stage_layers=stage_layers)
    except ValidationError as exc:
        raise BadInputError(format_validation_error(exc, "configuration")) from None


def register(app: typer.Typer) -> None:
    """Add `planner estimate` to the main app."""
    app.command("estimate")(estimate)


@guarded
def estimate(
    model: str = typer.Option("llama3-8b", "--model", help="Preset name, HuggingFace config.json or model spec file."),
    topology: str = typer.Option("dgx-h100", "--topology", help="Topology preset or file."),
    nodes: int | None = typer.Option(None, "--nodes", help="Nodes to use (default: as the topology says, or enough for --gpus)."),
    gpus: int | None = typer.Option(None, "--gpus", help="GPUs to use (default: all of the nodes)."),
    dp: int | None = typer.Option(None, "--dp", help="Data-parallel degree (default gpus / (tp*pp*cp))."),
    tp: int = typer.Option(1, "--tp", help="Tensor-parallel degree."),
    pp: int = typer.Option(1, "--pp", help="Pipeline-parallel degree."),
    ep: int = typer.Option(1, "--ep", help="Expert-parallel degree (MoE; carved out of dp*cp)."),
    cp: int = typer.Option(1, "--cp", help="Context-parallel degree."),
    sp: bool = typer.Option(False, "--sp/--no-sp", help="Sequence parallelism (needs tp>1)."),
    vpp: int = typer.Option(1, "--vpp", help="Virtual stages per pipeline rank (interleaved schedule)."),
    stage_layers: str | None = typer.Option(None, "--stage-layers", help="Decoder layers per virtual stage (pp*vpp "
                                            "entries, stage = v*pp + r; 'n*k' repeats), e.g. '3,2*29,0,0'; the stack "
                                            "must be able to spell it (exit 2 naming its rule)."),
    first_stage_layers: int | None = typer.Option(None, "--first-stage-layers", help="Decoder layers on the first "
                                                  "pipeline rank (all its virtual stages), as Megatron's "
                                                  "--decoder-first-pipeline-num-layers; the middle ranks share the rest."),
    last_stage_layers: int | None = typer.Option(None, "--last-stage-layers", help="Decoder layers on the last pipeline "
                                                 "rank, as Megatron's --decoder-last-pipeline-num-layers."),
    microbatch_size: int = typer.Option(1, "--microbatch-size", help="Sequences per micro-batch."),
    global_batch_size: int | None = typer.Option(None, "--global-batch-size", help="Sequences per optimizer step (default ~4M tokens)."),
    seq_len: int | None = typer.Option(None, "--seq-len", help="Sequence length (default: the model's)."),
    recompute: str = typer.Option("none", "--recompute", help="none | selective | full."),
    recompute_modules: str | None = typer.Option(None, "--recompute-modules", help=(
        "With --recompute selective: what it reruns, Megatron-Core's names, comma-separated: core_attn, layernorm, "
        "mla_up_proj, mlp, moe, moe_act, shared_experts (default: the framework's own selective).")),
    zero: int = typer.Option(0, "--zero", help="ZeRO stage 0 | 1 | 2 | 3."),
    dp_replicate: int = typer.Option(1, "--dp-replicate", help="HSDP: dp as dp_replicate x dp_shard, ZeRO-2/3 state "
                                     "sharded within a replica and replicated across them (needs --zero 2|3; 1 = plain)."),
    schedule: str = typer.Option(DEFAULT_SCHEDULE.name, "--schedule", help=" | ".join(SCHEDULE_NAMES) + (
                                  f" ({', '.join(s.name for s in V_PLACED)}: --vpp 2, a V).")),
    tp_overlap: str = typer.Option("none", "--tp-overlap", help="none | domino."),
    compression: str = typer.Option("none", "--compression", help=(
        "Communication compression: none | zeropp | a list of qwz, hpz[:N], qgz, powersgd:RANK, bf16-grads, "
        "fp16-grads, fp8-dispatch (what the framework runs: `planner framework show`).")),
    moe_dispatcher: MoeDispatcherOption = None,
    moe_overlap: MoeOverlapOption = None,
    cp_comm_type: CpCommTypeOption = None,
    routing_skew: RoutingSkewOption = None,
    capacity_factor: CapacityFactorOption = None,
    precision: str = typer.Option("bf16", "--precision", help="bf16 | amp-bf16 | fp32 | fp8."),
    profile: str | None = typer.Option(None, "--profile", help="Measured profile file for compute costs."),
    framework: str = typer.Option("planner", "--framework", help="Stack that runs it: planner | megatron-core | torchtitan | "
                                  "deepspeed | a profile file; a configuration the stack cannot run is refused (exit 2)."),
    calibration: str | None = typer.Option(None, "--calibration", help="Calibration overlay from `planner calibrate` "
                                              "(constants re-derived from your own runs of this GPU family and stack)."),
    trace_memory: bool = typer.Option(False, "--trace-memory", help="Also trace the executor's step on fake tensors (needs "
                                      "torch; --framework planner) and show traced vs formula per part."),
    json_output: bool = typer.Option(False, "--json", help="Print the LaunchPlan JSON instead of tables."),
    output: Path | None = typer.Option(None, "-o", "--output", parser=path_text, help="Write the LaunchPlan JSON to this file (atomically)."),
) -> None:
    """Predict one configuration: step time and its breakdown, tokens/s, MFU, memory per pipeline rank.

    Example: planner estimate --model llama3-70b --nodes 8 --tp 8 --pp 4 --sp --recompute selective --zero 1 --framework megatron-core
    """
    from planner import api
    from planner.io import check_writable

    check_writable(output)
    check_request_flags(precision=precision, global_batch_size=global_batch_size, seq_len=seq_len)
    request = api.build_request(model=model, topology=topology, nodes=nodes, gpus=gpus, global_batch_size=global_batch_size,
                                seq_len=seq_len, precision=precision, profile=profile, framework=framework,
                                calibration=calibration, moe=dict(routing_skew=routing_skew, capacity_factor=capacity_factor))
    split = stage_layers_of(stage_layers, first_stage_layers, last_stage_layers, num_layers=request.model.num_layers,
                            pp=pp, vpp=vpp)
    config = configuration(request, dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, sp=sp, vpp=vpp, zero=zero, tp_overlap=tp_overlap,
                           microbatch_size=microbatch_size, schedule=schedule, recompute=recompute,
                           compression=api.compression(compression, request.topology), stage_layers=split,
                           dp_replicate=dp_replicate, recompute_modules=recompute_modules,
                           stated=dict(moe_dispatcher=moe_dispatcher, moe_overlap=moe_overlap, cp_comm_type=cp_comm_type))
    plan = api.estimate(request, config, trace_memory=trace_memory)
    _emit(plan, json_output=json_output, output=output)
    if not plan.feasible:
        raise typer.Exit(code=1)


def _emit(plan: LaunchPlan, *, json_output: bool, output: Path | None) -> None:
    from planner.io import canonical_json

    text = canonical_json(plan)
    if output is not None:
        emit_text(text, output)
    if json_output:
        emit_text(text, None)
    else:
        from planner.report import console, print_table

        out = console()
        for table in plan_tables(plan):
            print_table(out, table)
        for reason in plan.infeasible_reasons:
            out.print(f"[red]does not fit:[/red] {reason}")
        for note in plan.notes:
            out.print(f"[dim]note: {note}[/dim]")
