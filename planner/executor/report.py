"""What an executor run writes: one result per rank (by the runtime) and one run report (by `planner run`).

Strict pydantic like every boundary file (extra fields rejected, frozen). No torch here: `planner run`
collects rank results and writes the report without importing torch.

Conventions:
- `losses[i]` is the loss of optimizer step i+1 (1-based steps), averaged over every token of the global
  batch (micro-batches and data-parallel replicas), so it equals a single-process run's loss.
- Step time is the slowest rank's wall time of the step; the report's `step_time_s` is the median over
  the steps after `warmup_steps` (the first steps pay for allocator growth and pipeline shape inference).
- Relative errors are (predicted - measured) / measured: positive = the planner was pessimistic.
"""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import Field

from planner.executor.host import HostLoad
from planner.schedules import schedule as schedule_of
from planner.schemas.base import Schema
from planner.schemas.plan import Batch, LaunchPlan, Parallelism, Schedule

RUN_REPORT_SCHEMA_VERSION = "1"
MemoryKind = Literal["cuda_max_allocated", "rss_peak"]


class TpOverlapTiming(Schema):
    """Domino (tp_overlap="domino"): one dense block's forward+backward, plain TP vs Domino's 2 pieces."""

    none_s: float = Field(ge=0)
    domino_s: float = Field(ge=0)
    gain: float = Field(description="none_s / domino_s - 1: positive = Domino is faster")


class RankResult(Schema):
    """Written atomically by each rank at the end of a successful run (`rank-<r>.json`)."""

    rank: int = Field(ge=0)
    coords: dict[str, int]
    device: str
    backend: str
    first_step: int = Field(ge=1, description="first step this process ran (> 1 after --resume)")
    losses: tuple[float, ...] = Field(description="per step; empty on ranks that do not hold the loss (not the last stage)")
    step_times_s: tuple[float, ...]
    peak_memory_bytes: int = Field(ge=0)
    memory_kind: MemoryKind
    weights_bytes: int = Field(default=0, ge=0, description="bytes of the distinct parameter storages this rank holds, every weight version counted (2BW: two)")
    threads: int = Field(default=0, ge=0, description="torch CPU threads of this process (torch.get_num_threads())")
    dropped_tokens: int = Field(default=0, ge=0, description="MoE assignments over expert capacity, summed over steps")
    routed_tokens: int = Field(default=0, ge=0, description="MoE (token, expert) assignments, summed over steps")
    routing_slowest_tokens: float = Field(default=0.0, ge=0, description=(
        "over this rank's EP group and MoE layers: the slowest EP rank's received tokens summed over dispatches "
        "(planner.executor.parallelize.routing_load); 0 without EP"))
    routing_mean_tokens: float = Field(default=0.0, ge=0, description="the same sum for the EP ranks' mean")
    checkpoints: tuple[str, ...] = Field(default=(), description="checkpoint folders committed during the run")
    tp_overlap: TpOverlapTiming | None = None
    dp_comm_bytes: tuple[float, ...] = Field(default=(), description=(
        "bytes this rank handed to the compressed gradient all-reduce per step (planner.executor.compression); "
        "empty without a compression hook"))


class RankFailure(Schema):
    """Written atomically by a rank that raised (`rank-<r>.error.json`) before it exits non-zero."""

    rank: int = Field(ge=0)
    error_type: str
    message: str
    traceback: str = ""
    time_s: float = Field(default=0.0, description="wall clock (epoch seconds) when it raised: the earliest failure is the cause")


class RankMemory(Schema):
    rank: int = Field(ge=0)
    peak_bytes: int = Field(ge=0)
    kind: MemoryKind
    weights_bytes: int = Field(default=0, ge=0, description="parameter storage held (all weight versions), counted from the tensors")


class Predicted(Schema):
    """The plan's predictions, copied so a report can be read alone."""

    step_time_s: float = Field(ge=0)
    tokens_per_s: float = Field(ge=0)
    peak_bytes: int = Field(ge=0)
    mfu: float = Field(ge=0)
    routing_skew: float | None = Field(default=None, ge=0, description="the plan's model.moe.routing_skew (MoE plans)")


class Errors(Schema):
    """(predicted - measured) / measured; None where the measurement is not comparable."""

    step_time_rel: float | None = None
    tokens_per_s_rel: float | None = None
    peak_bytes_rel: float | None = Field(default=None, description="None on CPU: RSS includes the interpreter and torch itself")


class RunReport(Schema):
    schema_version: Literal["1"] = RUN_REPORT_SCHEMA_VERSION
    model: str
    world_size: int = Field(gt=0)
    parallelism: Parallelism
    batch: Batch
    schedule: Schedule
    device: str
    backend: str
    data: str = Field(description="'synthetic' or the token file")
    steps: int = Field(gt=0, description="last step number (inclusive)")
    first_step: int = Field(ge=1)
    warmup_steps: int = Field(ge=0)
    losses: tuple[float, ...]
    step_times_s: tuple[float, ...] = Field(description="slowest rank per step")
    step_time_s: float = Field(ge=0, description="median of step_times_s after warm-up")
    tokens_per_step: int = Field(gt=0)
    tokens_per_s: float = Field(ge=0)
    mfu: float | None = Field(default=None, description="measured MFU, same FLOP convention as the prediction; None on CPU")
    memory: tuple[RankMemory, ...]
    dropped_tokens: int = Field(default=0, ge=0)
    routed_tokens: int = Field(default=0, ge=0)
    routing_skew: float | None = Field(default=None, ge=0, description=(
        "measured: the slowest EP rank's received tokens over the mean, minus 1, summed over every dispatch: the "
        "value of model.moe.routing_skew this run saw (dropless; with a capacity the excess was dropped); None "
        "without EP"))
    checkpoints: tuple[str, ...] = ()
    tp_overlap: TpOverlapTiming | None = Field(default=None, description="measured Domino gain (tp_overlap=domino only)")
    threads_per_rank: int | None = Field(default=None, description="torch CPU threads per process (the same for every world size)")
    dp_comm_bytes_per_step: float | None = Field(default=None, description=(
        "bytes rank 0 handed to the compressed gradient all-reduce in the last step (PowerSGD compresses from its "
        "second step on); None without a compression hook"))
    host: HostLoad | None = Field(default=None, description="the host CPU's load around the run (planner.executor.host)")
    predicted: Predicted
    errors: Errors
    notes: tuple[str, ...] = ()


def rel_error(predicted: float, measured: float) -> float | None:
    return None if measured <= 0 else (predicted - measured) / measured


def measured_skew(routers: list[RankResult]) -> float | None:
    """Slowest over mean EP load, minus 1, over every EP group (each member reports its group's sums, so the
    ratio counts each group in proportion to its tokens); None when no rank dispatched over EP."""
    mean = sum(r.routing_mean_tokens for r in routers)
    return max(0.0, sum(r.routing_slowest_tokens for r in routers) / mean - 1) if mean > 0 else None


def loss_rank(plan: LaunchPlan) -> int:
    """The rank whose losses the report shows: last pipeline stage, first of every other axis."""
    par = plan.parallelism
    last = schedule_of(plan.schedule).loss_rank(pp=par.pp, vpp=par.vpp)  # 0 for the V schedules
    for entry in sorted(plan.ranks, key=lambda e: e.rank):
        if entry.coords.get("pp", 0) == last and all(v == 0 for k, v in entry.coords.items() if k != "pp"):
            return entry.rank
    return 0


def build_report(
    plan: LaunchPlan, results: list[RankResult], *, data: str, warmup_steps: int, notes: tuple[str, ...] = ()
) -> RunReport:
    """Merge per-rank results with the plan's predictions. Every rank must have run the same steps."""
    by_rank = {r.rank: r for r in results}
    holder = by_rank[loss_rank(plan)]
    num_steps = len(holder.step_times_s)
    step_times = tuple(max(r.step_times_s[i] for r in results) for i in range(num_steps))
    timed = step_times[min(warmup_steps, num_steps - 1):]
    step_time_s = statistics.median(timed)
    batch = plan.batch
    tokens_per_step = batch.global_batch_size * batch.seq_len
    tokens_per_s = tokens_per_step / step_time_s if step_time_s > 0 else 0.0
    pred = plan.prediction
    on_cuda = holder.device.startswith("cuda")
    peak = max(r.peak_memory_bytes for r in results)
    mfu = pred.mfu * pred.step_time_s / step_time_s if on_cuda and step_time_s > 0 else None
    routers = [r for r in results if r.coords.get("tp", 0) == 0]  # tp replicas route the same tokens: count once
    return RunReport(
        model=plan.request.model.name, world_size=len(results), parallelism=plan.parallelism, batch=batch,
        schedule=plan.schedule, device=holder.device, backend=holder.backend, data=data,
        steps=holder.first_step + num_steps - 1, first_step=holder.first_step, warmup_steps=warmup_steps,
        losses=holder.losses, step_times_s=step_times, step_time_s=step_time_s, tokens_per_step=tokens_per_step,
        tokens_per_s=tokens_per_s, mfu=mfu,
        memory=tuple(RankMemory(rank=r.rank, peak_bytes=r.peak_memory_bytes, kind=r.memory_kind, weights_bytes=r.weights_bytes)
                     for r in sorted(results, key=lambda r: r.rank)),
        dropped_tokens=sum(r.dropped_tokens for r in routers), routed_tokens=sum(r.routed_tokens for r in routers),
        routing_skew=measured_skew(routers), checkpoints=holder.checkpoints, tp_overlap=holder.tp_overlap, threads_per_rank=max(r.threads for r in results) or None,
        dp_comm_bytes_per_step=by_rank[0].dp_comm_bytes[-1] if by_rank.get(0) and by_rank[0].dp_comm_bytes else None,
        predicted=Predicted(step_time_s=pred.step_time_s, tokens_per_s=pred.tokens_per_s, peak_bytes=plan.memory.peak_bytes, mfu=pred.mfu,
                            routing_skew=moe.routing_skew if (moe := plan.request.model.moe) is not None else None),
        errors=Errors(
            step_time_rel=rel_error(pred.step_time_s, step_time_s),
            tokens_per_s_rel=rel_error(pred.tokens_per_s, tokens_per_s),
            peak_bytes_rel=rel_error(plan.memory.peak_bytes, peak) if on_cuda else None,
        ),
        notes=notes,
    )
