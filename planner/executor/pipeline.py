"""Pipeline parallelism for the executor: cut stage modules from the plan's layer lists and run a
torch.distributed.pipelining schedule over them.

Stage placement follows the LaunchPlan: virtual stage s lives on pipeline rank s % pp (looped placement,
Narayanan et al. 2021, sec. 2.2), so pipeline rank r holds stages r, r + pp, ..., r + (vpp-1)*pp.
Schedules: gpipe -> ScheduleGPipe (Huang et al. 2019), 1f1b -> Schedule1F1B (PipeDream-flush, Narayanan
et al. 2021), interleaved -> ScheduleInterleaved1F1B (sec. 2.2 of the same), zero-bubble ->
ScheduleInterleavedZeroBubble (Qi et al. 2024, looped placement; also by torch's name interleaved-zero-bubble),
zbv -> ScheduleZBVZeroBubble and dualpipev -> ScheduleDualPipeV (V placement, planner.schedules.Schedule.stage_rank).
PipeDream-2BW runs on its own send/recv loop (planner.executor.twobw).

The loss is the mean next-token cross entropy of each micro-batch; the schedule divides gradients by the
number of micro-batches (`scale_grads`), so a step's gradient is the mean over the rank's local batch,
as in a single process.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import torch
from torch import nn

from planner.errors import BadInputError
from planner.nn.model import Transformer, keep_only
from planner.schedules import EXECUTOR_CLASSES
from planner.schedules import schedule as schedule_of
from planner.schemas.plan import LaunchPlan, Stage


def local_stages(plan: LaunchPlan, pp_rank: int) -> list[Stage]:
    """The plan's virtual stages held by pipeline rank `pp_rank`, in execution order (looped, or V for zbv/dualpipev)."""
    sched = schedule_of(plan.schedule)
    ordered = sorted(plan.stages, key=lambda s: s.stage)
    return [s for s in ordered if sched.stage_rank(s.stage, pp=plan.parallelism.pp) == pp_rank]


def cut_stage(full: Transformer, names: tuple[str, ...]) -> Transformer:
    """A copy of `full` (usually on the meta device) cut down to one stage by planner.nn's `keep_only`:
    FQNs stay those of the full model, so initialisation and checkpoints agree with any other layout."""
    return keep_only(copy.deepcopy(full), names)


def build_schedule(plan: LaunchPlan, modules: list[nn.Module], stages: list[Stage], *, pp_group, device: torch.device,
                   loss_fn: Callable):
    """PipelineStage per local virtual stage on the pipeline sub-group, then the plan's schedule."""
    from torch.distributed import pipelining

    name = plan.schedule
    if name not in EXECUTOR_CLASSES:
        raise BadInputError(f"schedule={name!r} is not runnable by the executor: choose one of {list(EXECUTOR_CLASSES)}")
    par = plan.parallelism
    num_stages = par.pp * par.vpp
    pipe_stages = [
        pipelining.PipelineStage(module, stage.stage, num_stages, device, group=pp_group)
        for module, stage in zip(modules, stages)
    ]
    cls = getattr(pipelining, EXECUTOR_CLASSES[name])
    n = plan.batch.num_microbatches
    if schedule_of(name).multi_stage:
        return cls(pipe_stages, n_microbatches=n, loss_fn=loss_fn)
    if len(pipe_stages) != 1:
        raise BadInputError(f"schedule={name!r} runs one stage per pipeline rank but vpp={par.vpp}: use interleaved")
    return cls(pipe_stages[0], n_microbatches=n, loss_fn=loss_fn)


def pipeline_step(schedule, stages: list[Stage], inputs: torch.Tensor, targets: torch.Tensor, *, last_stage: int) -> list[torch.Tensor]:
    """One optimizer step's forward and backward through the pipeline; returns the micro-batch losses on
    the rank holding the last stage (an empty list elsewhere)."""
    held = {s.stage for s in stages}
    has_first, has_last = 0 in held, last_stage in held
    losses: list[torch.Tensor] = []
    args = (inputs,) if has_first else ()
    kwargs = {"target": targets, "losses": losses} if has_last else {}
    if "return_outputs" in inspect.signature(schedule.step).parameters:
        # the losses are all the step needs: torch (2.8+) otherwise keeps every micro-batch's output (the logits)
        # on the last stage to merge them after the step, a mb x seq x vocab tensor per micro-batch held to the end
        kwargs["return_outputs"] = False
    schedule.step(*args, **kwargs)
    return losses


# ------------------------------------------------------------------ tied embeddings across pipeline stages
def tied_embedding_group(plan: LaunchPlan, mesh):
    """Megatron's embedding group (Shoeybi et al. 2019; Narayanan et al. 2021): with tied embeddings and
    pp > 1, the first pipeline rank holds tok_embeddings and the last one the LM head, two copies of one
    weight. One group per line of the pp axis pairs them; other ranks get None. Collective: every rank calls."""
    import torch.distributed as dist

    par = plan.parallelism
    if not plan.request.model.tied_embeddings or par.pp == 1 or schedule_of(plan.schedule).v_placed:
        return None  # V placement: both copies on pipeline rank 0, summed locally by sync_tied_embeddings
    dims = list(par.axis_order)
    lines = mesh.mesh.movedim(dims.index("pp"), -1).reshape(-1, par.pp)
    group, _ = dist.new_subgroups_by_enumeration([[int(line[0]), int(line[-1])] for line in lines])
    return group


def init_tied_head(module: Transformer, seed: int) -> None:
    """A stage holding the tied LM head but not the embedding: initialise the head as the full model
    initialises the shared weight (under the FQN `tok_embeddings.weight`), so both copies start equal."""
    from planner.nn.model import init_module

    spec = module.spec
    if spec.tied_embeddings and module.output is not None and module.tok_embeddings is None:
        init_module(module.output, seed, num_layers=spec.num_layers, prefix="tok_embeddings.")


def sync_tied_embeddings(parts: list[nn.Module], group) -> None:
    """Sum the two copies' gradients (after the schedule and the DP reductions, before the optimizer step):
    both then take the same update, as the single tied weight does. The copies are sharded alike (vocab
    dim, Shard(0), under TP and FSDP), so the local shards are reduced."""
    import torch.distributed as dist

    if not any(part.spec.tied_embeddings for part in parts):
        return
    holders = [h for part in parts for h in (part.tok_embeddings, part.output) if h is not None and h.weight.grad is not None]
    if len({id(h.weight) for h in holders}) == 2 and group is None:  # V placement (zbv, dualpipev): both copies on this rank, sum them
        first, second = holders
        total = _grad_like_weight(first.weight, first.weight.grad) + _grad_like_weight(second.weight, second.weight.grad)
        first.weight.grad, second.weight.grad = total, total.clone()
        return
    if group is None:
        return
    for holder in holders:
        grad = _grad_like_weight(holder.weight, holder.weight.grad)
        holder.weight.grad = grad
        dist.all_reduce(grad.to_local() if hasattr(grad, "to_local") else grad, group=group)


def _grad_like_weight(weight, grad):
    """The gradient with its weight's DTensor placements. Under TP the vocab-sharded embedding's gradient comes
    back from a pipeline stage's backward as a Replicate DTensor (the full V x h gradient) while the head's is
    Shard(0): reducing the two local tensors then mismatches in size (the gloo abort of issue 14). Replicate ->
    Shard is a local slice, no communication."""
    placements = getattr(weight, "placements", None)
    if placements is None or not hasattr(grad, "placements") or tuple(grad.placements) == tuple(placements):
        return grad
    return grad.redistribute(weight.device_mesh, placements)
