"""`planner launch plan.json [--hosts a,b]`: per-node torchrun commands and a SLURM sbatch script."""

from pathlib import Path

import typer

from planner.cli.common import emit_text, guarded

HELP = """Print (or write) the commands that start a LaunchPlan on a cluster: one torchrun per node with a static
rendezvous (--nnodes --node-rank --master-addr --master-port --nproc-per-node) so that the plan's rank map holds,
the environment each node needs, and a SLURM sbatch script.

Examples:

  planner launch plan.json --hosts node1,node2

  planner launch plan.json --hosts node1,node2 --out-dir launch/ --steps 1000 --checkpoint-dir /shared/ckpt --checkpoint-every 100
"""


def register(app: typer.Typer) -> None:
    app.command("launch", help=HELP)(launch_command)


@guarded
def launch_command(
    plan: Path = typer.Argument(..., help="A LaunchPlan JSON written by `planner plan` or `planner estimate`."),
    hosts: str | None = typer.Option(None, "--hosts", help="Comma-separated host names, one per node; the first is the master."),
    master_port: int = typer.Option(29500, "--master-port", help="Rendezvous port on the master host."),
    out_dir: Path | None = typer.Option(None, "--out-dir", help="Also write node-<i>.sh and job.sbatch here."),
    steps: int = typer.Option(10, "--steps", help="Passed to the runtime."),
    data: str | None = typer.Option(None, "--data", help="Token file path as the nodes see it."),
    checkpoint_dir: str | None = typer.Option(None, "--checkpoint-dir", help="Shared folder for checkpoints."),
    checkpoint_every: int = typer.Option(0, "--checkpoint-every", help="Save every K steps (0 = never)."),
    results_dir: str = typer.Option("planner-run", "--results-dir", help="Where each rank writes its result."),
    time_limit: str = typer.Option("04:00:00", "--time", help="SLURM time limit."),
    json_output: bool = typer.Option(False, "--json", help="Print {nodes, sbatch} as JSON."),
) -> None:
    from planner import api
    from planner.io import atomic_write_text, canonical_json

    options = api.run_options(steps=steps, data=data, checkpoint_dir=checkpoint_dir, checkpoint_every=checkpoint_every,
                         results_dir=results_dir)
    scripts = api.launch(plan, hosts=hosts, master_port=master_port, options=options, time_limit=time_limit)
    if out_dir is not None:
        for node in scripts.nodes:
            atomic_write_text(out_dir / f"node-{node.node_rank}.sh", node.script())
        atomic_write_text(out_dir / "job.sbatch", scripts.sbatch)
    if json_output:
        payload = {
            "nnodes": scripts.nnodes, "nproc_per_node": scripts.nproc_per_node, "master_addr": scripts.master_addr,
            "master_port": scripts.master_port, "sbatch": scripts.sbatch, "notes": list(scripts.notes),
            "nodes": [{"node_rank": n.node_rank, "host": n.host, "environment": list(n.environment), "command": n.command}
                      for n in scripts.nodes],
        }
        emit_text(canonical_json(payload), None)
        return
    emit_text(api.launch_text(scripts), None)
