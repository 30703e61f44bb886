"""The smallest training loop the executor and the tests share: N steps, return the per-step losses.

Pure with respect to its inputs: no process-group creation, no I/O, no clocks. The runtime wraps it with
timing, memory and checkpointing; the parallel tests call it directly and compare losses.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from planner.executor.parallelize import sync_gradients


def synthetic_batches(*, vocab_size: int, batch_size: int, seq_len: int, steps: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Deterministic next-token batches: (inputs, targets) of shape (batch, seq_len), targets shifted by one."""
    gen = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab_size, (steps, batch_size, seq_len + 1), generator=gen)
    return [(t[:, :-1].contiguous(), t[:, 1:].contiguous()) for t in tokens]


def shard_batch(batch: tuple[torch.Tensor, torch.Tensor], *, rank: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This dp rank's contiguous slice of a global batch (the batch must split evenly)."""
    inputs, targets = batch
    if inputs.shape[0] % size:
        raise ValueError(f"batch of {inputs.shape[0]} sequences does not split over dp={size}")
    n = inputs.shape[0] // size
    return inputs[rank * n:(rank + 1) * n], targets[rank * n:(rank + 1) * n]


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token loss; works on plain logits and on vocab-sharded DTensor logits under loss_parallel."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(0, 1))


def train_steps(model: nn.Module, optimizer, batches: Iterable[tuple[torch.Tensor, torch.Tensor]], *,
                num_microbatches: int = 1, loss_fn: Callable = cross_entropy, loss_group: dist.ProcessGroup | None = None,
                autocast_dtype: torch.dtype | None = None, loss_context: Callable | None = None,
                on_step: Callable[[int, float], None] | None = None) -> list[float]:
    """For each (inputs, targets) batch: split into `num_microbatches` along the batch dim (gradient
    accumulation), forward + backward each with loss/num_microbatches, `sync_gradients`, optimizer step.
    Returns one loss per step: the mean over micro-batches, averaged over `loss_group` (the dp ranks) when
    given, so every layout reports the loss of the same global batch. `loss_context` (e.g. TP's
    loss_parallel) wraps loss and backward; `autocast_dtype` enables torch.autocast (the amp-bf16 recipe)."""
    losses = []
    device_type = next(model.parameters()).device.type
    for step, (inputs, targets) in enumerate(batches):
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros((), dtype=torch.float32, device=inputs.device)
        for mb_inputs, mb_targets in zip(inputs.chunk(num_microbatches), targets.chunk(num_microbatches)):
            with torch.autocast(device_type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model(mb_inputs)
            with loss_context() if loss_context is not None else nullcontext():
                loss = loss_fn(logits, mb_targets) / num_microbatches
                loss.backward()
            total += full_tensor(loss.detach())
        sync_gradients(model)
        optimizer.step()
        if loss_group is not None:
            dist.all_reduce(total, group=loss_group)
            total /= dist.get_world_size(loss_group)
        losses.append(float(total))
        if on_step is not None:
            on_step(step, losses[-1])
    return losses


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole value of a DTensor (a loss under TP's loss_parallel is one), a plain tensor as it is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t

