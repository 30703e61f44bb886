"""`planner profile` (measure layer costs with torch) and `planner profile comm` (calibrate collectives)."""

from __future__ import annotations

import shlex
from pathlib import Path

import typer

from planner.cli.common import guarded, path_text
from planner.errors import BadInputError

profile_app = typer.Typer(
    name="profile",
    help=(
        "Measure per-layer and per-operator costs with torch (or, with `comm`, collective times).\n\n"
        "Examples:\n\n"
        "  planner profile --model profiles/specs/small-llama.yaml --microbatch-size 1,2,4 --tp 1,2 -o profiles/cpu-small.json\n\n"
        "  planner profile --model tinyllama-1.1b --device cuda --dtype amp-bf16 --microbatch-size 1,2,4,8 -o profiles/h100-tinyllama.json\n\n"
        "  planner profile comm --nprocs 4 -o profiles/cpu-gloo-comm.json"
    ),
    invoke_without_command=True,
)


def _command_line(ctx: typer.Context, words: str) -> str:
    """The command, rebuilt from the parsed options (every option spelled out, so it re-runs the same way
    whichever defaults change later, and is exact also when invoked programmatically)."""
    parts = shlex.split(words)
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if value is None or not param.opts or not param.opts[0].startswith("--"):
            continue
        flag = param.opts[0]
        if isinstance(value, bool):
            if value:
                parts.append(flag)
            continue
        parts += [flag, str(value)]
    return shlex.join(parts)


def _progress():
    """A rich progress bar on stderr and the callback that advances it."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from planner.report import console

    bar = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=console(stderr=True), transient=True)
    task = bar.add_task("profiling", total=None)

    def advance(done: int, total: int, what: str) -> None:
        bar.update(task, completed=done, total=total, description=f"profiling {what}")

    return bar, advance


def _summary_table(profile):
    from rich.table import Table

    table = Table(title=f"Profile of {profile.model_name} on {profile.device} ({profile.dtype})", title_justify="left")
    for header in ("layer", "tp", "ep", "mbs", "seq", "fwd ms", "bwd ms", "sel+ ms", "full+ ms", "params MiB", "saved MiB", "status"):
        table.add_column(header, justify="left" if header in ("layer", "status") else "right", no_wrap=True)
    for e in profile.entries:
        table.add_row(e.layer_type, str(e.tp), str(e.ep), str(e.microbatch_size), str(e.seq_len),
                      f"{e.forward_s * 1e3:.3f}", f"{e.backward_s * 1e3:.3f}", f"{e.recompute_selective_s * 1e3:.3f}",
                      f"{e.recompute_full_s * 1e3:.3f}", f"{e.params_bytes / 2**20:.2f}", f"{e.saved_bytes / 2**20:.2f}",
                      e.status if e.status == "ok" else f"{e.status}: {e.message}")
    notes = sorted({e.message for e in profile.entries if e.status == "ok" and e.message})
    if notes:
        table.caption = "; ".join(notes)
    return table


@profile_app.callback()
@guarded
def profile_compute(
    ctx: typer.Context,
    model: str = typer.Option(None, "--model", "-m", help="Preset name, model spec YAML/JSON, or HuggingFace config.json."),
    hf: bool = typer.Option(False, "--hf", help="Profile the HuggingFace implementation (AutoModelForCausalLM.from_config, random weights)."),
    device: str = typer.Option("cpu", "--device", help="cpu or cuda."),
    dtype: str = typer.Option("fp32", "--dtype", help="fp32, bf16, fp16, or amp-bf16 (fp32 params, bf16 autocast)."),
    microbatch_size: str = typer.Option("1", "--microbatch-size", help="Comma-separated micro-batch sizes, e.g. 1,2,4."),
    seq_len: int = typer.Option(None, "--seq-len", help="Sequence length (default: the model's)."),
    tp: str = typer.Option("1", "--tp", help="Comma-separated TP degrees: layers are built at heads/tp, ffn/tp."),
    ep: str = typer.Option("1", "--ep", help="Comma-separated EP degrees for MoE layers (experts/ep)."),
    layer_types: str = typer.Option(None, "--layer-types", help="Comma-separated subset of embedding,decoder,moe_decoder,head."),
    warmup: int = typer.Option(2, "--warmup", help="Untimed iterations before timing."),
    repeats: int = typer.Option(5, "--repeats", help="Timed iterations (median kept on CUDA, minimum on CPU)."),
    no_ops: bool = typer.Option(False, "--no-ops", help="Skip the per-operator breakdown (faster)."),
    threads: int = typer.Option(None, "--threads", help="CPU only: intra-op threads (e.g. 1 = one gloo rank per core)."),
    clock: str = typer.Option("wall", "--clock", help="CPU only: wall (perf_counter) or process (CPU time; robust on a shared box with --threads 1)."),
    tp_runtime: str = typer.Option("sharded", "--tp-runtime", help="tp > 1 timed as: sharded (plain layers at heads/tp) or dtensor (the executor's DTensor TP on a fake process group: carries its per-op overhead)."),
    output: Path = typer.Option(None, "--output", "-o", parser=path_text, help="Profile JSON to write (kept up to date after every shape)."),
) -> None:
    """Measure forward/backward/recompute time, FLOPs, parameter and saved bytes of every layer type.

    Example: planner profile --model tinyllama-1.1b --microbatch-size 1,2 --seq-len 512 -o profiles/cpu-tinyllama.json
    """
    if ctx.invoked_subcommand is not None:
        return
    if model is None:
        raise BadInputError("--model is required: a preset name (planner models list), a model spec file or a config.json")
    if output is None:
        raise BadInputError("--output/-o is required, e.g. -o profiles/my-model.json")
    from planner.cli.common import require_extra
    from planner.io import check_writable

    require_extra("profile", "torch", *(("transformers",) if hf else ()))
    check_writable(output)
    from planner import api

    spec = api.load_model(model)
    opts = api.profile_options(
        device=device, dtype=dtype, seq_len=seq_len or spec.seq_len,
        microbatch_sizes=api.int_list(microbatch_size, name="--microbatch-size"), tp=api.int_list(tp, name="--tp"),
        ep=api.int_list(ep, name="--ep"), warmup=warmup, repeats=repeats, ops=not no_ops, threads=threads, clock=clock,
        tp_runtime=tp_runtime, layer_types=tuple(k.strip() for k in layer_types.split(",")) if layer_types else None,
    )
    _run_profile(spec, opts, hf=hf, model_ref=model, output=output, command=_command_line(ctx, "planner profile"))


def _run_profile(spec, opts, *, hf: bool, model_ref: str, output: Path, command: str) -> None:
    from planner import api
    from planner.io import atomic_write_text, canonical_json
    from planner.report import console, print_table

    bar, advance = _progress()
    written = {"entries": 0}

    def save(partial) -> None:
        atomic_write_text(output, canonical_json(partial))
        written["entries"] = len(partial.entries)

    try:
        with bar:
            result = api.profile(spec, opts, hf=hf, command=command, on_entry=save, progress=advance, **({"model_ref": model_ref} if hf else {}))
    except KeyboardInterrupt:
        console(stderr=True).print(f"interrupted: {written['entries']} measured shapes kept in {output}")
        raise typer.Exit(code=130) from None
    save(result)
    out = console()
    print_table(out, _summary_table(result))
    out.print(f"wrote {output} ({len(result.entries)} entries)")


@profile_app.command("comm")
@guarded
def profile_comm(
    ctx: typer.Context,
    nprocs: int = typer.Option(2, "--nprocs", "-n", help="Local processes (one per GPU with --device cuda)."),
    device: str = typer.Option("cpu", "--device", help="cpu (gloo) or cuda (NCCL)."),
    sizes: str = typer.Option("4096,65536,1048576,4194304,16777216", "--sizes", help="Message sizes in bytes, comma-separated."),
    collectives: str = typer.Option("all_reduce,all_gather,reduce_scatter,all_to_all,send_recv", "--collectives"),
    warmup: int = typer.Option(2, "--warmup"),
    repeats: int = typer.Option(5, "--repeats"),
    output: Path = typer.Option(..., "--output", "-o", parser=path_text, help="Calibration JSON to write (a topology's comm_calibration)."),
) -> None:
    """Time collectives vs message size with N local processes and fit latency + bandwidth per collective.

    Example: planner profile comm --nprocs 2 -o profiles/cpu-gloo-comm.json
    """
    from planner.cli.common import require_extra
    from planner.io import atomic_write_text, canonical_json, check_writable

    require_extra("profile comm", "torch")
    check_writable(output)
    from planner import api
    from planner.report import console

    calibration = api.comm_benchmark(
        nprocs=nprocs, device=device, sizes_bytes=api.int_list(sizes, name="--sizes"),
        collectives=tuple(c.strip() for c in collectives.split(",") if c.strip()), warmup=warmup, repeats=repeats,
        command=_command_line(ctx, "planner profile comm"),
    )
    atomic_write_text(output, canonical_json(calibration))
    out = console()
    for fit in calibration.fits:
        out.print(f"{fit.collective:15s} n={fit.world_size}  alpha {fit.alpha_s * 1e6:9.1f} us  "
                  f"bus bandwidth {fit.bus_bandwidth_GBps:8.3f} GB/s  latency/step {fit.latency_s * 1e6:8.1f} us")
    out.print(f"wrote {output}")


def register(app: typer.Typer) -> None:
    """Add `planner profile` and `planner profile comm` to the main app."""
    app.add_typer(profile_app, name="profile")
