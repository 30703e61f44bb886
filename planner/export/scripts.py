"""LaunchPlan -> launch scripts for our own executor: per-node torchrun (static rendezvous) and SLURM sbatch.

torchrun's rules: every node starts the same --nproc-per-node, and the world size is nnodes * nproc-per-node;
with a static rendezvous (--node-rank, --master-addr, --master-port) rank r lives on node r // nproc_per_node
at local rank r % nproc_per_node. The plan's rank map must agree, or the scripts would start the wrong
processes on the wrong GPUs: that is refused.
"""

from __future__ import annotations

import shlex

from planner.export.common import Export, check_exportable, header_lines, refuse
from planner.schemas.plan import LaunchPlan

RUNTIME_MODULE = "planner.executor.runtime"
DEFAULT_PORT = 29500


def node_layout(plan: LaunchPlan, target: str) -> tuple[int, int]:
    """(nnodes, nproc_per_node) from the plan's rank map; refuses a map torchrun cannot start."""
    world = plan.request.gpus
    if not plan.ranks:
        per_node = min(world, plan.request.topology.gpus_per_node)
        if world % per_node:
            raise refuse(target, f"{world} GPUs do not fill nodes of {per_node}", "use a multiple of gpus_per_node")
        return world // per_node, per_node
    if len(plan.ranks) != world:
        raise refuse(target, f"the rank map has {len(plan.ranks)} entries for {world} GPUs", "regenerate the plan")
    per_node = max(entry.local_rank for entry in plan.ranks) + 1
    for entry in plan.ranks:
        if entry.node != entry.rank // per_node or entry.local_rank != entry.rank % per_node:
            raise refuse(
                target,
                f"rank {entry.rank} is placed on node {entry.node} local rank {entry.local_rank}, but torchrun puts it on "
                f"node {entry.rank // per_node} local rank {entry.rank % per_node} (--nproc-per-node {per_node})",
                "regenerate the plan",
            )
    return world // per_node, per_node


def _environment(plan: LaunchPlan) -> list[str]:
    env = ["export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}"]
    if plan.parallelism.tp > 1 and plan.parallelism.zero_stage < 3:
        env.append("export CUDA_DEVICE_MAX_CONNECTIONS=1  # keeps TP communication ahead of compute kernels")
    return env


def torchrun_command(nnodes: int, nproc: int, *, node_rank: str, master_addr: str, master_port: str, plan_path: str) -> str:
    """One node's torchrun line (static rendezvous) running the executor on the plan."""
    return (
        f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} --node-rank {node_rank} "
        f"--master-addr {master_addr} --master-port {master_port} -m {RUNTIME_MODULE} {plan_path}"
    )


def export_torchrun(plan: LaunchPlan) -> Export:
    """A script run once per node with NODE_RANK and MASTER_ADDR set; it execs torchrun for that node."""
    target = "torchrun"
    check_exportable(plan, target)
    nnodes, nproc = node_layout(plan, target)
    command = torchrun_command(
        nnodes, nproc, node_rank='"$NODE_RANK"', master_addr='"$MASTER_ADDR"', master_port='"$MASTER_PORT"', plan_path='"$PLAN"'
    )
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
        *_environment(plan),
        f"exec {command}",
    ]
    return Export(target=target, text="\n".join(lines) + "\n", suffix=".sh")


def export_slurm(plan: LaunchPlan, *, time_limit: str = "04:00:00") -> Export:
    """An sbatch script: one task per node, each running torchrun with SLURM's node id as the node rank."""
    target = "slurm"
    check_exportable(plan, target)
    nnodes, nproc = node_layout(plan, target)
    name = "planner-" + "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in plan.request.model.name)
    inner = torchrun_command(
        nnodes, nproc, node_rank="$SLURM_NODEID", master_addr="$MASTER_ADDR", master_port="$MASTER_PORT", plan_path="$PLAN"
    )
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nnodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        *header_lines(plan, target),
        "# Submit: sbatch --export=ALL,PLAN=$PWD/plan.json this-script.sbatch",
        "set -euo pipefail",
        'export PLAN="${PLAN:-plan.json}"',
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f'export MASTER_PORT="${{MASTER_PORT:-{DEFAULT_PORT}}}"',
        *_environment(plan),
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(inner)}",
    ]
    return Export(target=target, text="\n".join(lines) + "\n", suffix=".sbatch")
