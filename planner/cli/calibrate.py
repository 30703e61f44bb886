"""`planner calibrate`: a calibration overlay from the user's measured runs (thin adapter over planner.api.calibrate).

Prints every run's measured and predicted step time (shipped constants, overlay, leave-one-run-out), the derived
constants beside the shipped ones and the leave-one-run-out error; writes the overlay (YAML, or JSON by suffix)
that `planner plan/estimate --calibration FILE` read. Exit 2 with one line on any input it cannot use.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from planner.cli.common import emit_text, guarded


def register(app: typer.Typer) -> None:
    app.command("calibrate")(calibrate_command)


@guarded
def calibrate_command(
    runs: list[str] = typer.Argument(..., help="Megatron-LM logs, torchtitan logs (with --config) or a JSON of measured runs."),
    topology: Optional[str] = typer.Option(None, "--topology", help="The cluster that ran them: preset or topology file."),
    config: list[str] = typer.Option([], "--config", help="torchtitan TOML config of each torchtitan log, in order."),
    model: Optional[str] = typer.Option(None, "--model", help="The model trained (preset, config.json, spec) when the log does not say."),
    framework: Optional[str] = typer.Option(None, "--framework", help="The stack (default: megatron-core for Megatron-LM logs, torchtitan for torchtitan's)."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="World size of torchtitan runs whose config leaves it open (dp_shard -1)."),
    output: Path = typer.Option(..., "-o", "--output", help="Write the overlay here (.yaml or .json)."),
) -> None:
    """Derive the cost model's GEMM ceiling and per-step overhead for your cluster and stack from your runs.

    Example: planner calibrate megatron-run1.log megatron-run2.log megatron-run3.log --topology dgx-h100 -o my-cluster.yaml
    then: planner plan --model llama3-70b --nodes 4 --framework megatron-core --calibration my-cluster.yaml
    """
    from planner import api
    from planner.io import canonical_json, check_writable

    check_writable(output)
    overlay = api.calibrate(runs, topology=topology, configs=config, model=model, framework=framework, gpus=gpus)
    if output.suffix == ".json":
        text = canonical_json(overlay)
    else:
        import json

        import yaml

        text = yaml.safe_dump(json.loads(canonical_json(overlay)), sort_keys=False)
    emit_text(text, output)
    print(render(overlay))
    print(f"wrote {output}")


def render(overlay) -> str:
    """Plain lines (no table: reads at any width and when captured)."""
    lines = [f"runs on {overlay.device} ({overlay.device_family}) with {overlay.framework}: step time measured / predicted"]
    for run in overlay.runs:
        loo = f"{run.leave_one_out_s / run.measured_step_s - 1:+.1%}" if run.leave_one_out_s else "n/a"
        memory = (f"; peak {run.measured_peak_gib:.1f} GiB measured, {run.predicted_peak_gib:.1f} predicted"
                  if run.measured_peak_gib else f"; peak {run.predicted_peak_gib:.1f} GiB predicted")
        lines.append(f"  {run.name}: {run.measured_step_s:.4g} s / shipped {run.predicted_shipped_s:.4g} s "
                     f"({run.predicted_shipped_s / run.measured_step_s - 1:+.1%}), overlay {run.predicted_overlay_s:.4g} s "
                     f"({run.predicted_overlay_s / run.measured_step_s - 1:+.1%}), leave-one-out {loo}{memory}")
    shipped = overlay.shipped
    lines.append(f"GEMM ceiling {overlay.matmul_ceiling_fraction:.4f} (shipped {shipped.get('matmul_ceiling_fraction', float('nan')):.4f}); "
                 f"step overhead {overlay.step_overhead_s:.3f} s (shipped {shipped.get('step_overhead_s', float('nan')):.3f}, "
                 f"{overlay.provenance.get('step_overhead', '')})")
    loo = overlay.leave_one_out
    lines.append(f"leave-one-run-out error: median {loo.median_abs_error:.1%}, max {loo.max_abs_error:.1%} over {loo.runs} runs"
                 if loo.median_abs_error is not None else "leave-one-run-out error: n/a (one run: calibrate with 2 or more)")
    return "\n".join(lines)
