"""LaunchPlan -> launch scripts for our own executor: per-node torchrun (static rendezvous) and SLURM sbatch.

The command lines and the node layout come from planner.launch_spec.commands (`planner launch` uses them too), so the
two never disagree; planner.launch_spec sits below both planner.export and planner.executor, and planner.export imports
nothing of planner.executor.

torchrun's rules: every node starts the same --nproc-per-node, and the world size is nnodes * nproc-per-node;
with a static rendezvous (--node-rank, --master-addr, --master-port) rank r lives on node r // nproc_per_node
at local rank r % nproc_per_node. The plan's rank map must agree, or the scripts would start the wrong
processes on the wrong GPUs: that is refused.
"""

from __future__ import annotations

from planner.errors import BadInputError
from planner.export.common import (
    Export,
    check_exportable,
    check_framework,
    header_lines,
    refuse,
    target_profile,
    torch_schedule_reason,
)
from planner.launch_spec.commands import DEFAULT_PORT, environment, launch_scripts, node_layout, torchrun_line
from planner.launch_spec.options import RunOptions
from planner.launch_spec.runnable import check_runnable
from planner.schemas.plan import LaunchPlan


def _executor_ready(plan: LaunchPlan, target: str) -> None:
    """The scripts start our executor, so they are refused for what it cannot run (planner.launch_spec.runnable) and for
    what torch's schedule constructor refuses (the executor builds the profile's native class, pipeline.py)."""
    try:
        check_runnable(plan)
    except BadInputError as exc:
        raise BadInputError(f"cannot export to {target}: the executor cannot run this plan: {exc}") from None
    profile = target_profile(target)
    native = profile.native_schedule(plan.schedule) if plan.schedule in profile.schedule_names() else ""
    reason = torch_schedule_reason(plan, native)
    if reason is not None:
        raise refuse(target, f"the executor's pipeline schedule would refuse this plan: {reason}",
                     f"choose a global batch that gives a multiple of pp={plan.parallelism.pp} micro-batches")


def export_torchrun(plan: LaunchPlan) -> Export:
    """A script run once per node with NODE_RANK and MASTER_ADDR set; it execs torchrun for that node.

    The torchrun line and environment are `planner launch`'s (planner.launch_spec.commands), parameterised by node.
    """
    target = "torchrun"
    check_exportable(plan, target)
    check_framework(plan, target)
    _executor_ready(plan, target)
    nnodes, nproc = node_layout(plan, target)
    command = torchrun_line(nnodes, nproc, '"$NODE_RANK"', '"$MASTER_ADDR"', '"$MASTER_PORT"', '"$PLAN"', RunOptions())
    lines = [
        "#!/usr/bin/env bash",
        *header_lines(plan, target),
        f"# Run on each of the {nnodes} node(s): NODE_RANK=<0..{nnodes - 1}> MASTER_ADDR=<node 0 host> bash $0 plan.json",
        "set -euo pipefail",
        'PLAN="${1:-plan.json}"',
        'NODE_RANK="${NODE_RANK:-0}"',
        'MASTER_ADDR="${MASTER_ADDR:-127.0.0.1}"',
        f'MASTER_PORT="${{MASTER_PORT:-{DEFAULT_PORT}}}"',
        f'if [ "$NODE_RANK" -ge {nnodes} ]; then echo "NODE_RANK=$NODE_RANK but the plan has {nnodes} node(s)" >&2; exit 2; fi',
        *(f"export {variable}" for variable in environment(plan, nproc)),
        f"exec {command}",
    ]
    return Export(target=target, text="\n".join(lines) + "\n", suffix=".sh")


def export_slurm(plan: LaunchPlan) -> Export:
    """`planner launch`'s sbatch script (one task per node, SLURM's node id as the node rank) for plan.json."""
    target = "slurm"
    check_exportable(plan, target)
    check_framework(plan, target)
    _executor_ready(plan, target)
    node_layout(plan, target)
    sbatch = launch_scripts(plan, plan_path="plan.json").sbatch
    header = "\n".join(header_lines(plan, target)) + "\n# Submit next to plan.json: sbatch this-script.sbatch\n"
    first, rest = sbatch.split("\n", 1)
    return Export(target=target, text=f"{first}\n{rest}".replace("set -euo pipefail\n", header + "set -euo pipefail\n", 1), suffix=".sbatch")
