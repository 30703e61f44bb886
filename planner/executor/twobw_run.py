"""The runtime's side of PipeDream-2BW (planner.executor.twobw): build the stage's two versions into a
TwoBWStage and train the run's steps through it, with the same per-step loss and timing as other schedules."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist

from planner.executor.twobw import TwoBWStage, run_2bw, share_optimizer_state


def make_2bw_stage(job) -> TwoBWStage:
    """job.parts / train_parts / optimizers hold the stage's two versions (built alike, so equal at start)."""
    from planner.executor.parallelize import sync_gradients
    from planner.executor.pipeline import sync_tied_embeddings
    from planner.executor.train import cross_entropy

    par = job.plan.parallelism

    def finish_grads(train_module, module) -> None:
        sync_gradients(train_module)  # DP mean over the stage's dp group (explicit all-reduce)
        sync_tied_embeddings([module], job.tied_group)

    return TwoBWStage(
        versions=list(job.parts), train_versions=list(job.train_parts), optimizers=list(job.optimizers),
        stage=job.local_stages[0].stage, num_stages=par.pp, pp_group=job.mesh["pp"].get_group(), device=job.device,
        num_microbatches=job.plan.batch.num_microbatches, loss_fn=cross_entropy, finish_grads=finish_grads,
        autocast_dtype=job.autocast_dtype,
    )


def reshare(job) -> None:
    """After loading a checkpoint into version 0's optimizer: version 1's optimizer shares that state again."""
    share_optimizer_state(job.optimizers[0], job.optimizers[1])


def train_2bw(job, batches, first: int, save: Callable[[int], None]) -> tuple[list[float], list[float]]:
    """(losses on last-stage ranks, step seconds) of steps first..options.steps; the loss of step t is the mean
    over the global batch, computed on weights W(t-1). The pipeline runs unflushed between checkpoints: it is
    drained only at a checkpoint step (then `save(step)`, both versions and the shared optimizer state) and at
    the end."""
    par, opts = job.plan.parallelism, job.options
    losses: list[float] = []
    times: list[float] = []

    def batch_of(t: int):
        inputs, targets = batches.local_batch(t + 1, dp_rank=job.coords["dp"], dp=par.dp)
        return inputs.to(job.device), targets.to(job.device)

    def on_step(t: int, loss: torch.Tensor | None, seconds: float) -> None:
        if loss is not None:
            loss = loss.float()
            if par.dp > 1:
                dist.all_reduce(loss, group=job.dp_group)
                loss /= par.dp
            losses.append(float(loss))
        times.append(seconds)

    every = opts.checkpoint_every or opts.steps
    start = first
    while start <= opts.steps:
        end = min(opts.steps, ((start - 1) // every + 1) * every)
        run_2bw(job.schedule, start - 1, end, batch_of, on_step)  # 1-based steps start..end
        if opts.checkpoint_every and end % opts.checkpoint_every == 0:
            save(end)
        start = end + 1
    if job.device.type == "cuda":
        torch.cuda.synchronize(job.device)
    return losses, times
