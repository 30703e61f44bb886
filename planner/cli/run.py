"""`planner run plan.json --steps N --report run.json`: train the plan on this machine and report."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded, path_text

HELP = """Run a LaunchPlan on this machine with torchrun (the plan's world size, one node) and write a run report.

The report holds the loss of every step, the median step time after warm-up, tokens/s, peak memory per rank
(CUDA max allocated, or peak RSS on CPU) and the plan's predictions beside them with their relative error.
A failing rank stops the job: one line names the rank and the cause (exit 1), and no report is written.

Examples:

  planner run plan.json --steps 20 --report run.json

  planner run plan.json --steps 4 --checkpoint-dir ckpt --checkpoint-every 2

  planner run plan.json --steps 8 --checkpoint-dir ckpt --resume --report run.json
"""


def register(app: typer.Typer) -> None:
    app.command("run", help=HELP)(run_command)


@guarded
def run_command(
    plan: Path = typer.Argument(..., help="A LaunchPlan JSON written by `planner plan` or `planner estimate`."),
    steps: int = typer.Option(10, "--steps", help="Run optimizer steps up to this one (1-based)."),
    report: Path | None = typer.Option(None, "--report", "-o", parser=path_text, help="Write the run report JSON here (atomically)."),
    data: str | None = typer.Option(None, "--data", help="Flat token file (.npy, or .bin of --data-dtype); default synthetic."),
    data_dtype: str = typer.Option("uint16", "--data-dtype", help="uint16 | int32, for .bin token files."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Folder of DCP checkpoints (step-NNNNNN/)."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Save every K steps (0 = never)."),
    resume: bool = typer.Option(False, "--resume", help="Continue from the newest committed checkpoint."),
    seed: int = typer.Option(0, "--seed", help="Seed of the weights and of the synthetic data."),
    lr: float = typer.Option(3e-4, "--lr", help="AdamW learning rate."),
    warmup_steps: int = typer.Option(1, "--warmup-steps", help="Steps left out of the median step time."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    timeout_s: float = typer.Option(600.0, "--timeout-s", help="Process-group timeout: bounds every hang."),
    json_output: bool = typer.Option(False, "--json", help="Print the run report JSON instead of a table."),
) -> None:
    from planner import api
    from planner.cli.common import require_extra
    from planner.io import canonical_json

    require_extra("run", "torch")
    options = api.run_options(steps=steps, seed=seed, lr=lr, data=data, data_dtype=data_dtype, checkpoint_dir=checkpoint_dir,
                         checkpoint_every=checkpoint_every, resume=resume, device=device, timeout_s=timeout_s)
    result = api.run(plan, options=options, report_path=report, warmup_steps=warmup_steps)
    if json_output:
        emit_text(canonical_json(result), None)
        return
    from planner.report import console, print_table

    out = console()
    print_table(out, run_report_table(result))
    if report is not None:
        console(stderr=True).print(f"wrote {report}", markup=False)


def run_report_table(result):
    """Measured beside predicted (rich is allowed in the CLI)."""
    from rich.table import Table

    def pct(value):
        return "-" if value is None else f"{value:+.1%}"

    table = Table(title=f"run: {result.model} on {result.world_size} x {result.device} ({result.backend})", title_justify="left")
    for header in ("", "measured", "predicted", "error"):
        table.add_column(header, justify="right" if header else "left")
    pred, err = result.predicted, result.errors
    loaded = f" ({result.host.summary})" if result.host is not None and result.host.loaded else ""
    table.add_row("step time (s)", f"{result.step_time_s:.4g}", f"{pred.step_time_s:.4g}", pct(err.step_time_rel) + loaded)
    table.add_row("tokens/s", f"{result.tokens_per_s:,.0f}", f"{pred.tokens_per_s:,.0f}", pct(err.tokens_per_s_rel) + loaded)
    peak = max(m.peak_bytes for m in result.memory)
    table.add_row(f"peak memory (GiB, {result.memory[0].kind})", f"{peak / 2**30:.3f}", f"{pred.peak_bytes / 2**30:.3f}", pct(err.peak_bytes_rel))
    if result.tp_overlap is not None:
        t = result.tp_overlap
        table.add_row("Domino block fwd+bwd (s)", f"{t.domino_s:.4g}", f"plain TP {t.none_s:.4g}", f"gain {t.gain:+.1%}")
    if result.routing_skew is not None:
        table.add_row("MoE routing skew (slowest EP rank / mean - 1)", f"{result.routing_skew:.3f}",
                      f"{pred.routing_skew or 0.0:.3f}", "")
    if result.mfu is not None:
        table.add_row("MFU", f"{result.mfu:.1%}", f"{pred.mfu:.1%}", "")
    losses = ", ".join(f"{x:.4f}" for x in result.losses)
    table.caption = f"steps {result.first_step}..{result.steps}, losses: {losses}"
    if result.routed_tokens:
        table.caption += f"; MoE dropped {result.dropped_tokens} of {result.routed_tokens} token-expert assignments"
    return table
