"""The process group and the DeviceMesh of one rank of a LaunchPlan's job: the world size torchrun started checked
against the plan, NCCL on CUDA or gloo on CPU, this rank's coordinates from the plan's rank map, a mesh whose named
dims are the plan's `axis_order`, and the EP / expert-replica groups (planner.executor.runtime builds the job on
them)."""

from __future__ import annotations

import os
from datetime import timedelta

import torch
import torch.distributed as dist

from planner.errors import BadInputError
from planner.launch_spec.options import RunOptions
from planner.schemas.plan import LaunchPlan


def check_world_size(plan: LaunchPlan, rank: int) -> int:
    """The number of processes torchrun started must be the plan's world size."""
    started = int(os.environ.get("WORLD_SIZE", "1"))
    par = plan.parallelism
    if started != par.world_size:
        raise BadInputError(
            f"the plan needs {par.world_size} processes (dp={par.dp} x tp={par.tp} x pp={par.pp} x cp={par.cp}) but "
            f"torchrun started {started} (WORLD_SIZE={started}, this is rank {rank}): start nnodes x nproc-per-node = "
            f"{par.world_size} processes, as `planner run` and `planner launch` do"
        )
    return started


def init_distributed(options: RunOptions) -> tuple[torch.device, str]:
    """NCCL on CUDA (one GPU per local rank), gloo on CPU; the process-group timeout bounds every hang."""
    want_cuda = options.device == "cuda" or (options.device == "auto" and torch.cuda.is_available())
    if want_cuda and not torch.cuda.is_available():
        raise BadInputError("--device cuda but torch.cuda.is_available() is False: use --device cpu")
    timeout = timedelta(seconds=options.timeout_s)
    if want_cuda:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timeout, device_id=device)
        return device, "nccl"
    dist.init_process_group("gloo", timeout=timeout)
    return torch.device("cpu"), "gloo"


def rank_coords(plan: LaunchPlan, rank: int) -> dict[str, int]:
    """This rank's coordinates from the plan's rank map (row-major over axis_order when the map is empty)."""
    for entry in plan.ranks:
        if entry.rank == rank:
            return {axis: entry.coords.get(axis, 0) for axis in plan.parallelism.axis_order}
    par = plan.parallelism
    sizes = par.dims.layout_sizes()
    coords, rest = {}, rank
    for axis in reversed(par.axis_order):
        coords[axis], rest = rest % sizes[axis], rest // sizes[axis]
    return {axis: coords[axis] for axis in par.axis_order}


def build_mesh(plan: LaunchPlan, device_type: str):
    """DeviceMesh with dims named and ordered as `axis_order`; mesh[coords] = the plan's rank at coords."""
    from torch.distributed.device_mesh import DeviceMesh

    par = plan.parallelism
    sizes = par.dims.layout_sizes()
    layout = torch.empty([sizes[a] for a in par.axis_order], dtype=torch.int64)
    for rank in range(par.world_size):
        coords = rank_coords(plan, rank)
        layout[tuple(coords[a] for a in par.axis_order)] = rank
    return DeviceMesh(device_type, layout, mesh_dim_names=tuple(par.axis_order))


def ep_groups(plan: LaunchPlan, mesh) -> tuple[object, object]:
    """(ep group, expert-replica group): the dp axis splits into (dp/ep, ep); an ep group is ep consecutive
    dp coordinates (experts sharded over it), the replica group the dp ranks holding the same experts."""
    par = plan.parallelism
    dims = list(par.axis_order)
    layout = mesh.mesh.movedim(dims.index("dp"), -1).reshape(-1, par.dp // par.ep, par.ep)
    ep_lists = [row.tolist() for row in layout.reshape(-1, par.ep)]
    replica_lists = [col.tolist() for block in layout for col in block.t()]
    ep_group, _ = dist.new_subgroups_by_enumeration(ep_lists)
    replica_group, _ = dist.new_subgroups_by_enumeration(replica_lists)
    return ep_group, replica_group
