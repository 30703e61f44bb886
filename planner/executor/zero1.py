"""ZeRO-1 for tensor-parallel (DTensor) parameters: optimizer states sharded over the dp group.

torch's ZeroRedundancyOptimizer takes plain tensors only, so TP x ZeRO-1 was refused. This is the same
scheme (Rajbhandari et al. 2020, sec. 5.1, P_os), written over the local shards: the dp ranks (which hold
the same TP shards) split the parameters greedily by size (largest first, each to the least-loaded rank,
ties to the lowest rank: deterministic); each rank keeps the optimizer state of its own parameters only and
steps them, then every parameter's local shard is broadcast from its owner over the dp group. Gradients are
all-reduced (mean) beforehand by the DP gradient sync, as with ZeroRedundancyOptimizer.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def partition(params: list[nn.Parameter], world: int) -> list[int]:
    """Owner dp rank of each parameter: greedy by local size, largest first, ties to the lowest rank."""
    load = [0] * world
    owners = [0] * len(params)
    for index in sorted(range(len(params)), key=lambda i: (-_local(params[i]).numel(), i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[index] = rank
        load[rank] += _local(params[index]).numel()
    return owners


class ShardedStateOptimizer:
    """`optimizer_class` over this dp rank's share of `params`; `step` updates it and broadcasts every shard."""

    def __init__(self, params: list[nn.Parameter], optimizer_class, *, process_group: dist.ProcessGroup, **kwargs):
        self.params = list(params)
        self.group = process_group
        self.rank, world = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.owners = partition(self.params, world)
        self.global_owners = [dist.get_global_rank(process_group, r) for r in self.owners]
        mine = [p for p, owner in zip(self.params, self.owners) if owner == self.rank]
        # an empty share still needs an optimizer object (checkpoints save one state per rank), on the parameters'
        # device (a fused CUDA AdamW takes no CPU tensor)
        device = _local(self.params[0]).device if self.params else torch.device("cpu")
        self.optim = optimizer_class(mine or [nn.Parameter(torch.zeros(0, device=device))], **kwargs)

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    def zero_grad(self, set_to_none: bool = True) -> None:
        clear_grads(self.params, set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        self.optim.step()
        for p, src in zip(self.params, self.global_owners):
            dist.broadcast(_local(p), src=src, group=self.group)

    def state_dict(self) -> dict:
        return self.optim.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state)


def clear_grads(params, set_to_none: bool = True) -> None:
    """torch.optim.Optimizer.zero_grad's rule for a wrapper that holds its own parameter list."""
    for p in params:
        if set_to_none:
            p.grad = None
        elif p.grad is not None:
            p.grad.zero_()
