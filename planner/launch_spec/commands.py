"""`planner launch`: the commands that start a LaunchPlan's job on a cluster (no torch here).

One torchrun per node with a static rendezvous (`--nnodes --node-rank --master-addr --master-port
--nproc-per-node`): torchrun then gives global rank r to node r // nproc_per_node, local rank
r % nproc_per_node, which must be where the plan's rank map puts it (checked by node_layout, which the
torchrun/slurm exporters in planner.export.scripts share: they import this module, never the reverse).
Also the environment the job needs and a SLURM sbatch script (one task per node, SLURM's node id as the
node rank, the first allocated host as the master).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from planner.errors import BadInputError
from planner.launch_spec.options import RunOptions
from planner.launch_spec.runnable import check_runnable
from planner.schemas.plan import LaunchPlan

RUNTIME_MODULE = "planner.executor.runtime"
DEFAULT_PORT = 29500


@dataclass(frozen=True)
class NodeCommand:
    node_rank: int
    host: str
    environment: tuple[str, ...]
    command: str

    def script(self) -> str:
        lines = ["#!/usr/bin/env bash", f"# node {self.node_rank} ({self.host})", "set -euo pipefail"]
        return "\n".join([*lines, *(f"export {e}" for e in self.environment), self.command]) + "\n"


@dataclass(frozen=True)
class LaunchScripts:
    nnodes: int
    nproc_per_node: int
    master_addr: str
    master_port: int
    nodes: tuple[NodeCommand, ...]
    sbatch: str
    notes: tuple[str, ...] = ()


def _layout_refusal(target: str, reason: str, fix: str) -> BadInputError:
    """The refusal wording of planner.export.common.refuse (this module sits below planner.export)."""
    return BadInputError(f"cannot export to {target}: {reason}; {fix}")


def node_layout(plan: LaunchPlan, target: str) -> tuple[int, int]:
    """(nnodes, nproc_per_node) from the plan's rank map; refuses a map torchrun cannot start.

    Lives here, with the torchrun command lines, because both `planner launch` and the torchrun/slurm exporters
    need it; `target` names who refuses (the exporter's target, or "torchrun" for `planner launch`)."""
    world = plan.request.gpus
    if not plan.ranks:
        per_node = min(world, plan.request.topology.gpus_per_node)
        if world % per_node:
            raise _layout_refusal(target, f"{world} GPUs do not fill nodes of {per_node}", "use a multiple of gpus_per_node")
        return world // per_node, per_node
    if len(plan.ranks) != world:
        raise _layout_refusal(target, f"the rank map has {len(plan.ranks)} entries for {world} GPUs", "regenerate the plan")
    per_node = max(entry.local_rank for entry in plan.ranks) + 1
    for entry in plan.ranks:
        if entry.node != entry.rank // per_node or entry.local_rank != entry.rank % per_node:
            raise _layout_refusal(
                target,
                f"rank {entry.rank} is placed on node {entry.node} local rank {entry.local_rank}, but torchrun puts it on "
                f"node {entry.rank // per_node} local rank {entry.rank % per_node} (--nproc-per-node {per_node})",
                "regenerate the plan",
            )
    return world // per_node, per_node


def environment(plan: LaunchPlan, nproc_per_node: int) -> tuple[str, ...]:
    """Variables every rank needs: one CPU thread pool per process, TP communication ahead of compute
    (Megatron's CUDA_DEVICE_MAX_CONNECTIONS=1 when tp > 1), NCCL errors surfaced instead of hangs."""
    env = [f"OMP_NUM_THREADS=${{OMP_NUM_THREADS:-{max(1, 16 // nproc_per_node)}}}", "PYTHONUNBUFFERED=1",
           "TORCH_NCCL_ASYNC_ERROR_HANDLING=3"]
    if plan.parallelism.tp > 1:
        env.append("CUDA_DEVICE_MAX_CONNECTIONS=1")
    return tuple(env)


def torchrun_line(nnodes: int, nproc: int, node_rank: str, master_addr: str, master_port: str, plan_path: str,
                  options: RunOptions) -> str:
    runtime_args = " ".join(shlex.quote(a) for a in options.to_argv())
    line = (f"torchrun --nnodes {nnodes} --nproc-per-node {nproc} --node-rank {node_rank} --master-addr {master_addr} "
            f"--master-port {master_port} -m {RUNTIME_MODULE} {plan_path}")
    return f"{line} {runtime_args}".rstrip()


def parse_hosts(hosts: str | None) -> list[str] | None:
    """`a,b,c` -> ["a", "b", "c"]; empty names and duplicates are refused."""
    if hosts is None:
        return None
    names = [h.strip() for h in hosts.split(",")]
    if any(not h for h in names) or len(set(names)) != len(names):
        raise BadInputError(f"--hosts {hosts!r}: give distinct host names separated by commas, e.g. --hosts node1,node2")
    return names


def sbatch_script(plan: LaunchPlan, nnodes: int, nproc: int, *, master_port: int, plan_path: str, options: RunOptions,
                  hosts: list[str] | None, time_limit: str) -> str:
    name = "planner-" + "".join(ch if ch.isalnum() or ch in "-_." else "-" for ch in plan.request.model.name)
    inner = torchrun_line(nnodes, nproc, "$SLURM_NODEID", "$MASTER_ADDR", "$MASTER_PORT", plan_path, options)
    par = plan.parallelism
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={name}",
        f"#SBATCH --nodes={nnodes}",
        *([f"#SBATCH --nodelist={','.join(hosts)}"] if hosts else []),
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --gpus-per-node={nproc}",
        "#SBATCH --exclusive",
        f"#SBATCH --time={time_limit}",
        f"# planner launch: {plan.request.model.name} dp={par.dp} tp={par.tp} pp={par.pp} vpp={par.vpp} ep={par.ep} "
        f"zero={par.zero_stage} schedule={plan.schedule}; predicted step {plan.prediction.step_time_s:.4g} s",
        "set -euo pipefail",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f'export MASTER_PORT="${{MASTER_PORT:-{master_port}}}"',
        *(f"export {e}" for e in environment(plan, nproc)),
        f"srun --kill-on-bad-exit=1 bash -c {shlex.quote(inner)}",
    ]
    return "\n".join(lines) + "\n"


def launch_scripts(plan: LaunchPlan, *, plan_path: str = "plan.json", hosts: list[str] | None = None,
                   master_port: int = DEFAULT_PORT, options: RunOptions | None = None,
                   time_limit: str = "04:00:00") -> LaunchScripts:
    """Per-node torchrun commands and an sbatch script for the plan (refused if the executor cannot run it
    or torchrun's rank placement would contradict the plan's rank map)."""
    notes = check_runnable(plan)
    options = options or RunOptions()
    nnodes, nproc = node_layout(plan, "torchrun")
    if hosts is not None and len(hosts) != nnodes:
        raise BadInputError(f"--hosts lists {len(hosts)} host(s) but the plan places its {plan.request.gpus} ranks on "
                            f"{nnodes} node(s) of {nproc}: give exactly {nnodes} hosts")
    if not 0 < master_port < 65536:
        raise BadInputError(f"--master-port {master_port}: choose a port in 1..65535")
    names = hosts or ([f"node{i}" for i in range(nnodes)] if nnodes > 1 else ["localhost"])
    master = names[0] if hosts or nnodes == 1 else "$MASTER_ADDR"
    if master == "localhost":
        master = "127.0.0.1"
    env = environment(plan, nproc)
    nodes = tuple(
        NodeCommand(node_rank=i, host=names[i], environment=env,
                    command=torchrun_line(nnodes, nproc, str(i), master, str(master_port), shlex.quote(plan_path), options))
        for i in range(nnodes)
    )
    sbatch = sbatch_script(plan, nnodes, nproc, master_port=master_port, plan_path=shlex.quote(plan_path), options=options,
                           hosts=hosts, time_limit=time_limit)
    return LaunchScripts(nnodes=nnodes, nproc_per_node=nproc, master_addr=master, master_port=master_port, nodes=nodes,
                         sbatch=sbatch, notes=notes)


def render_text(scripts: LaunchScripts) -> str:
    """What `planner launch` prints: each node's environment and command, then the sbatch script."""
    parts = [f"# {scripts.nnodes} node(s) x {scripts.nproc_per_node} process(es), master {scripts.master_addr}:{scripts.master_port}"]
    parts += [f"# note: {n}" for n in scripts.notes]
    for node in scripts.nodes:
        parts.append(f"\n# --- node {node.node_rank}: run on {node.host} ---")
        parts += [f"export {e}" for e in node.environment]
        parts.append(node.command)
    parts.append("\n# --- SLURM: sbatch job.sbatch ---")
    parts.append(scripts.sbatch.rstrip("\n"))
    return "\n".join(parts) + "\n"
