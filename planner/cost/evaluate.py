"""Evaluate one candidate with one stage split: pipeline step time, breakdown, memory per pipeline rank, MFU.

Step time (per optimizer step) = m * t_b + bubble(t_b) + pp_comm + dp_comm_exposed + optimizer + step overhead (the
training loop's per-step work outside the micro-batches, CostModel.step_overhead_s), where t_b is the
per-micro-batch forward + backward (+ recompute) time of the bottleneck pipeline rank (the sum over its virtual
stages) and the bubble follows the schedule (planner.schedules). Where a node has fewer compute slots than
ranks (CPU processes sharing cores), the step is at least the node's compute work / slots plus the exposed
communication (planner.cost.contention); the wait for a core is counted in compute_s. The breakdown splits m * t_b into compute,
recompute and exposed TP/EP/CP communication, so its fields add up to the step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from itertools import accumulate
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import autocast, comm, compression, contention, grad_accumulation, pipelining_memory, zero3_legacy
from planner.cost.arrays import ROWS, layer_working_bytes
from planner.cost.compute import peak_tflops
from planner.cost.executor import MASTER_STEP_EXTRA_BYTES_TOUCHED
from planner.cost.executor import OPTIMIZER_BYTES_TOUCHED as EXECUTOR_OPTIMIZER_BYTES
from planner.cost.memory import OPTIMIZER_BYTES_TOUCHED
from planner.cost.p2p import pp_comm_s
from planner.cost.step_memory import foreach_temp_bytes, master_step, step_extra_bytes
from planner.errors import BadInputError
from planner.frameworks_split import balanced_split
from planner.schedules import schedule as schedule_of
from planner.schemas.plan import Breakdown, StageMemory, StageTime
from planner.units import GiB

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate, Detail

MEMORY_ROWS = ("params_bytes", "grads_bytes", "optimizer_bytes", "activations_bytes", "other_bytes", "peak_bytes")
TIME_ROWS = tuple(ROWS.index(k) for k in ("fwd", "bwd", "rec", "tp"))
REC, ACT, REC_FLOPS = ROWS.index("rec"), ROWS.index("act"), ROWS.index("rec_flops")
FULL_DT, FULL_DACT, FULL_DFLOPS = ROWS.index("full_dt"), ROWS.index("full_dact"), ROWS.index("full_dflops")


@dataclass(frozen=True)
class Evaluation:
    """The cost of one candidate with one stage split (see planner.cost.model for the contract).

    `breakdown`, `stage_memory` and `stage_times` are pydantic objects built on first access from the raw
    numbers, so that the search's hot path builds none.
    """

    step_time_s: float
    peak_bytes: int
    capacity_bytes: int
    fits: bool
    reasons: tuple[str, ...]
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    stage_layers: tuple[int, ...] = ()  # decoder layers per virtual stage actually used (extension)
    full_recompute_layers: tuple[int, ...] = ()  # fully recomputed decoder layers per virtual stage (extension)
    raw_breakdown: dict = field(default_factory=dict, repr=False)
    raw_stage_memory: np.ndarray | None = field(default=None, repr=False)  # MEMORY_ROWS x pp
    raw_stage_times: np.ndarray | None = field(default=None, repr=False)  # (fwd, bwd, rec, tp) x pp*vpp

    @cached_property
    def breakdown(self) -> Breakdown:
        return Breakdown(**self.raw_breakdown)

    @cached_property
    def stage_memory(self) -> tuple[StageMemory, ...]:
        """One per pipeline rank."""
        if self.raw_stage_memory is None:
            return ()
        return tuple(StageMemory(stage=r, **{k: int(v) for k, v in zip(MEMORY_ROWS, column)})
                     for r, column in enumerate(self.raw_stage_memory.T.tolist()))

    @cached_property
    def stage_times(self) -> tuple[StageTime, ...]:
        """One per virtual stage (backward_s includes the recompute)."""
        if self.raw_stage_times is None:
            return ()
        return tuple(StageTime(forward_s=f, backward_s=b + r, recompute_s=r, tp_comm_s=t)
                     for f, b, r, t in self.raw_stage_times.T.tolist())


def _check_split(model: "CostModel", cand: "Candidate", stage_layers, full_layers) -> tuple[tuple[int, ...], tuple[int, ...]]:
    stages, n = cand.pp * cand.vpp, model.spec.num_layers
    split = (balanced_split(n, stages, last_slots=model.spec.mtp_num_layers) if stage_layers is None
             else tuple(int(x) for x in stage_layers))
    if len(split) != stages or sum(split) != n or min(split) < 0:  # a stage may hold no decoder layer (the stack's
        raise BadInputError(                                            # rule: planner.frameworks_split.split_refusal)
            f"stage_layers={list(split)} must have pp*vpp={stages} entries, none negative, summing to num_layers={n}"
        )
    full = (0,) * stages if full_layers is None else tuple(int(x) for x in full_layers)
    if len(full) != stages or any(k < 0 or k > s for k, s in zip(full, split)):
        raise BadInputError(f"full_recompute_layers={list(full)} must have {stages} entries between 0 and the stage's layers {list(split)}")
    return split, full


def _stage_sums(prefix: np.ndarray, split: tuple[int, ...], full: tuple[int, ...], num_modules: int) -> np.ndarray:
    """Per virtual stage sums of every row, with the first `full[v]` decoder layers of stage v fully recomputed."""
    starts = [0, *accumulate(split[:-1])]  # first decoder layer of each stage
    bounds = np.array([0, *(x + 1 for x in starts[1:]), num_modules])
    sums = prefix[:, bounds[1:]] - prefix[:, bounds[:-1]]
    if any(full):
        first = np.array(starts) + 1
        extra = prefix[:, first + np.array(full)] - prefix[:, first]
        for row, target in ((FULL_DT, REC), (FULL_DACT, ACT), (FULL_DFLOPS, REC_FLOPS)):
            sums[target] += extra[row]
    return sums


def dp_gather_s(model: "CostModel", cand: "Candidate", dense: float, expert: float, links=None) -> float:
    """The all-gather of the updated weights in dp_comm_s under ZeRO-1/2 (0 otherwise): the part a stack that
    overlaps it (options.dp_gather_overlap) hides behind the next step's first forward."""
    if cand.zero_stage not in (1, 2):
        return 0.0
    links = model.links(cand) if links is None else links
    return sum(comm.all_gather_s(params * model.recipe.gather_bytes, group=link)
               for params, link in ((dense, links.dp), (expert, links.expert_dp)) if params > 0 and link.size > 1)


def dp_comm_s(model: "CostModel", cand: "Candidate", dense: float, expert: float, links=None) -> float:
    """Data-parallel gradient reduction (and ZeRO weight gathers) of one pipeline rank holding `dense` and
    `expert` parameters, before overlap.

    ZeRO-0: all-reduce of the gradients. ZeRO-1: reduce-scatter of the gradients and all-gather of the updated
    weights (Megatron's distributed optimizer; same bytes as an all-reduce). ZeRO-2: a reduce-scatter per
    micro-batch (sharded gradients cannot accumulate locally) and one all-gather. ZeRO-3: per micro-batch
    all-gathers of the weights in forward and backward and a reduce-scatter of the gradients; where the stack
    re-gathers for the recompute forward (options.zero3_regather_for_recompute: DeepSpeed's checkpointed forward
    re-runs the module's fetch hook), three all-gathers under full recompute. Where the stack's ZeRO-3 collectives
    are flat rings over the dp ranks (options.zero3_hierarchical False), each rank moves (n-1)/n of the buffer
    through its own NIC share (comm.flat_ring_s), so the time does not shrink as dp grows.
    HSDP (links.dp_replicate; ZeRO-2/3 only): the above runs within the shard group (links.dp, dp*cp/dp_replicate
    ranks), and each reduce-scatter is followed by an all-reduce of its 1/shard output across the dp_replicate
    replicas (Zhao et al. 2023, PyTorch FSDP sec. 3.2.2; torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py
    foreach_reduce: reduce_scatter on the shard group then all_reduce on the replicate group, per backward).
    """
    links = model.links(cand) if links is None else links  # another layout's links (planner.cost.bounds.dp_exposed_s)
    r, m, z, comp = model.recipe, cand.num_microbatches, cand.zero_stage, cand.compression
    total = 0.0
    for params, link in ((dense, links.dp), (expert, links.expert_dp)):
        if params <= 0 or link.size <= 1:
            continue
        reduce_bytes = r.grad_reduce_bytes if model.options.grad_reduce_fp32 else min(r.grad_reduce_bytes, 2)
        reduce_bytes = compression.reduce_bytes_per_param(comp, reduce_bytes)
        grads = params * reduce_bytes * (model.powersgd_ratio(comp.powersgd_rank) if comp.has("powersgd") else 1.0)
        weights = params * compression.gather_bytes_per_param(comp, r.gather_bytes)
        if z == 0:
            total += comm.ring_all_reduce_s(grads, group=link)
        elif z == 1:
            total += comm.reduce_scatter_s(grads, group=link) + comm.all_gather_s(weights, group=link)
        elif z == 2:
            total += m * comm.reduce_scatter_s(grads, group=link) + comm.all_gather_s(weights, group=link)
        else:
            units = -(-model.spec.num_layers // cand.pp) if model.options.zero3_layer_collectives else 1
            total += m * compression.zero3_microbatch_s(model.options, cand, params, grads, weights, link, units)
        if z >= 2 and links.dp_replicate is not None and links.dp_replicate.size > 1:
            total += m * comm.ring_all_reduce_s(grads / link.size, group=links.dp_replicate)
        reductions = m if z >= 2 else 1
        gathers = m * compression.zero3_gathers(model.options, cand) if z == 3 else 0
        total += compression.compute_s(comp, model.spec, params, gathers=gathers, reductions=reductions,
                                       reduce_bytes=reduce_bytes, hbm_rate_Bps=model.hbm_rate_Bps)
    return total


@dataclass(frozen=True)
class _Fixed:
    """What does not depend on the stage split: memoised per candidate."""

    inflight: np.ndarray  # per pipeline rank
    wgrad_held: np.ndarray  # per pipeline rank: micro-batches of weight-gradient inputs held (pipelining_memory)
    loss_credit: np.ndarray  # per pipeline rank: pipelining_memory.loss_phase_credit
    other: np.ndarray  # per pipeline rank, stage_other_bytes
    pp_comm_s: float
    dp_dense: tuple[float, float]  # (slope per parameter, intercept) of the dense reduction time
    dp_expert: tuple[float, float]
    gather_dense: tuple[float, float]  # the same of its ZeRO-1/2 weight all-gather part (dp_gather_s)
    gather_expert: tuple[float, float]
    optimizer_per_param_s: tuple[float, float]  # (dense, expert) seconds per parameter held
    peak_tflops: float


def linear_fit(fn, reference: float = 1e9) -> tuple[float, float]:
    """Alpha-beta costs are affine in bytes: recover (slope, intercept) from two evaluations."""
    one, two = fn(reference), fn(2 * reference)
    slope = (two - one) / reference
    return slope, one - slope * reference


def dp_fits(model: "CostModel", cand: "Candidate", links=None) -> tuple[tuple[float, float], ...]:
    """(slope, intercept) in parameters of the dense and expert data-parallel time (dp_comm_s) and of its ZeRO-1/2
    weight-gather part (dp_gather_s), in that order: what dp_exposed reads, for evaluate and the search's bounds."""
    return tuple(linear_fit(lambda x, f=f, dense=dense: f(model, cand, x if dense else 0.0, 0.0 if dense else x, links))
                 for f in (dp_comm_s, dp_gather_s) for dense in (True, False))


def _fixed(model: "CostModel", cand: "Candidate") -> _Fixed:
    cache = model.fixed_cache
    found = cache.get(cand)
    if found is not None:
        return found
    edp = cand.expert_shard
    rate = model.device.hbm_bandwidth_GBps * 1e9 * model.cal.hbm_efficiency
    per_param = OPTIMIZER_BYTES_TOUCHED[model.request.precision] / rate
    if model.executor_recipe is not None:  # AdamW over fp32 parameters as the executor builds it (foreach or fused)
        per_param = EXECUTOR_OPTIMIZER_BYTES[model.options.adamw_impl] / rate
        if master_step(model):
            per_param += MASTER_STEP_EXTRA_BYTES_TOUCHED / rate
    sharded = cand.zero_stage >= 1
    dp_dense, dp_expert, gather_dense, gather_expert = dp_fits(model, cand)
    found = _Fixed(
        inflight=model.inflight_per_rank(cand),
        wgrad_held=np.array([pipelining_memory.zb_weight_grad_held(cand.pp, r, cand.num_microbatches, cand.vpp)
                             if pipelining_memory.torch_split_backward(model, cand) else 0.0 for r in range(cand.pp)]),
        loss_credit=pipelining_memory.loss_phase_credit(model, cand),
        other=model.other_per_rank(cand),
        pp_comm_s=pp_comm_s(model, cand),
        dp_dense=dp_dense, dp_expert=dp_expert, gather_dense=gather_dense, gather_expert=gather_expert,
        optimizer_per_param_s=(per_param / (cand.zero_shard if sharded else 1), per_param / (edp if sharded else 1)),
        peak_tflops=peak_tflops(model.device, model.request.precision),
    )
    cache[cand] = found
    return found


def dp_exposed(model: "CostModel", cand: "Candidate", fixed: _Fixed, row: dict) -> float:
    """Exposed data-parallel time, the slowest pipeline rank. Overlap (options.dp_overlap): hidden behind the
    backward of the last micro-batch (ZeRO-0/1), every backward (ZeRO-2), every forward and backward (ZeRO-3);
    the last bucket (options.bucket_params) is always exposed. Where the stack overlaps the ZeRO-1/2 weight
    all-gather with the next step's forward (options.dp_gather_overlap: Megatron-Core --overlap-param-gather
    dispatches bucket i+1's all-gather while bucket i's layers compute, megatron/core/distributed/
    distributed_data_parallel.py), that part hides behind the first micro-batch's forward instead, its first
    bucket exposed. Without overlap all of it is exposed, and so it is where ranks share a node's cores
    (planner.cost.contention): a CPU backend's collectives (gloo) copy and reduce on those same cores, so
    nothing is left to run them beside the backward."""
    return float(dp_exposed_rows(model, cand, fixed, row).max())


def dp_exposed_rows(model: "CostModel", cand: "Candidate", fixed, row: dict) -> np.ndarray:
    """dp_exposed per pipeline rank (its maximum is dp_exposed). The (slope, intercept) fits of `fixed` may be
    columns of several links' fits: the rows are then one per link (the bounds' footprints, planner.cost.bounds)."""
    dense, expert = row["dense"], row["expert"]
    total = _affine(fixed.dp_dense, dense) + _affine(fixed.dp_expert, expert)
    if not model.options.dp_overlap or contention.contended(cand.world_size, model.topology):
        return total
    m, z = cand.num_microbatches, cand.zero_stage
    window = row["bwd_compute"] * (1 if z <= 1 else m) if z <= 2 else m * row["compute"]
    bucket = np.minimum(1.0, model.options.bucket_params / np.maximum(dense + expert, 1.0))
    if z not in (1, 2) or not model.options.dp_gather_overlap:
        return np.maximum(total - window, total * bucket)
    gather = _affine(fixed.gather_dense, dense) + _affine(fixed.gather_expert, expert)
    reduce = total - gather
    forward = row["compute"] - row["bwd_compute"]
    return np.maximum(reduce - window, reduce * bucket) + np.maximum(gather - forward, gather * bucket)


def _zero3_sync_gathers_s(model: "CostModel", cand: "Candidate", detail, row: dict) -> float:
    """The slowest rank's synchronous per-tensor ZeRO-3 gathers (options.zero3_sync_per_tensor; zero3_legacy)."""
    opts = model.options
    if cand.zero_stage != 3 or not opts.zero3_sync_per_tensor:
        return 0.0
    links = model.links(cand)
    gathers = 3 if (opts.zero3_regather_for_recompute and cand.recompute == "full") else 2
    layer = float(detail.dense_params[1]) if len(detail.dense_params) > 2 else float(detail.dense_params.max())
    per_tensor = zero3_legacy.params_per_tensor(model.spec, layer)
    return max(zero3_legacy.exposed_s(params=float(p), per_tensor=per_tensor, dp=links.dp.size, gathers=gathers,
                                      num_microbatches=cand.num_microbatches, copy_s=model.cal.eager_kernel_s,
                                      gather_s=comm.all_gather_s(float(p) * model.recipe.gather_bytes, group=links.dp),
                                      collective_latency_s=comm.half_ring_latency_s(links.dp))
               for p in row["dense"])


def _affine(fit: tuple[float, float], params: np.ndarray) -> np.ndarray:
    """An affine (slope, intercept) time of `params` per rank, 0 where a rank holds none."""
    return np.where(params > 0, fit[0] * params + fit[1], 0.0)


def evaluate_candidate(model: "CostModel", cand: "Candidate", *, stage_layers: Sequence[int] | None,
                       full_recompute_layers: Sequence[int] | None) -> Evaluation:
    """See planner.cost.model.CostModel.evaluate."""
    reasons = model.validity_reasons(cand)
    if reasons:
        return _invalid(model, reasons)
    split, full = _check_split(model, cand, stage_layers, full_recompute_layers)
    detail = model.detail(cand)
    fixed = _fixed(model, cand)
    sums = _stage_sums(detail.prefix, split, full, len(detail.costs.names))
    pp, m = cand.pp, cand.num_microbatches
    ranks = schedule_of(cand.schedule).rank_sums(sums, pp=pp, vpp=cand.vpp)
    row = dict(zip(ROWS, ranks))
    row["wgrad"] = pipelining_memory.stage_weight_grad_bytes(model, cand, split) if fixed.wgrad_held.any() else 0.0
    row["acc"] = grad_accumulation.per_microbatch_s(model, cand, row)  # per micro-batch, per rank
    rank_time = row["fwd"] + row["bwd"] + row["rec"] + row["acc"]
    b = int(np.argmax(rank_time))
    t_b = float(rank_time[b])
    bubble = schedule_of(cand.schedule).bubble_s(pp=pp, vpp=cand.vpp, rank_time_s=t_b)
    dp = dp_exposed(model, cand, fixed, row) + _zero3_sync_gathers_s(model, cand, detail, row)
    opt = row["dense"] * fixed.optimizer_per_param_s[0] + row["expert"] * fixed.optimizer_per_param_s[1]
    optimizer = float(opt.max())
    tp_b, ep_b, cp_b, rec_b, acc_b = (float(row[k][b]) for k in ("tp", "ep", "cp", "rec", "acc"))
    breakdown = {
        "compute_s": m * (t_b - rec_b - tp_b - ep_b - cp_b - acc_b), "recompute_s": m * rec_b, "bubble_s": bubble,
        "grad_accum_s": m * acc_b,
        "tp_comm_exposed_s": m * tp_b, "pp_comm_s": fixed.pp_comm_s, "dp_comm_exposed_s": dp,
        "ep_comm_s": m * ep_b, "cp_comm_s": m * cp_b, "optimizer_s": optimizer, "step_overhead_s": model.step_overhead_s,
    }
    step = m * t_b + bubble + fixed.pp_comm_s + dp + optimizer + model.step_overhead_s
    if contention.contended(cand.world_size, model.topology):  # ranks sharing a node's cores (planner.cost.contention)
        work = m * (rank_time - row["tp"] - row["ep"] - row["cp"]) + opt
        comm_s = m * (tp_b + ep_b + cp_b) + fixed.pp_comm_s + dp
        shared = contention.shared_step_s(step, work_s=work.tolist(), comm_s=comm_s, world_size=cand.world_size,
                                          topology=model.topology)
        breakdown["compute_s"] += shared - step
        step = shared
    return _finish(model, cand, detail, fixed, row, sums, split, full, step, breakdown)


def _partial_full_working_bytes(model: "CostModel", cand: "Candidate", full: tuple[int, ...]) -> float:
    """A candidate whose base mode is not full recompute but whose split recomputes some layers fully holds the
    recomputed layer's activations too (arrays.layer_working_bytes); stage_other_bytes counts it for "full"."""
    if cand.recompute == "full" or not any(full):
        return 0.0
    return layer_working_bytes(model, cand, recompute="full") - layer_working_bytes(model, cand, recompute=cand.recompute)


def _memory(model: "CostModel", fixed: _Fixed, row: dict, cand: "Candidate",
            full: tuple[int, ...] = ()) -> tuple[np.ndarray, tuple[str, ...]]:
    """Per pipeline rank (MEMORY_ROWS x pp): allocated = static + inflight * activations + other (amp-bf16 with one
    micro-batch, one replica, no ZeRO: planner.cost.autocast.allocated_peak); peak = allocated * (1 + fragmentation
    fraction) + fixed allowance (calibration.yaml). Reasons name the worst rank over capacity."""
    cal = model.mem_cal
    acts = fixed.inflight * row["act"]
    if fixed.wgrad_held.any():  # torch's split backward: weight-gradient inputs, the loss phase or the B pass's peak
        acts = acts + fixed.wgrad_held * row["wgrad"] - np.minimum(fixed.loss_credit, row["wgrad"] / cand.vpp)
    static = row["weights"] + row["grads"] + row["optimizer"]
    other = fixed.other + _partial_full_working_bytes(model, cand, full) + compression.memory_bytes(model.recipe, cand, row, model.links(cand).dp)
    weights, grads, optimizer, allocated = row["weights"], row["grads"], row["optimizer"], static + acts + other
    saved = acts
    step_peak = static + step_extra_bytes(model, cand, row)
    if (step_peak > allocated).any():  # the optimizer step, activations freed, outgrows the backward
        acts = np.where(step_peak > allocated, 0.0, acts)
        allocated = np.maximum(allocated, step_peak)
    executor_recipe = model.executor_recipe_for(cand)
    runs_autocast = model.request.precision == autocast.RECIPE if executor_recipe is None else executor_recipe.autocast
    if runs_autocast and autocast.grads_absent_at_activation_peak(
            dp=cand.dp, cp=cand.cp, zero_stage=cand.zero_stage, num_microbatches=cand.num_microbatches):
        foreach = executor_recipe is not None and model.options.adamw_impl == "foreach"
        weights, grads, optimizer, acts, allocated = autocast.peak_rows(
            weights, grads, optimizer, saved, other, step_extra=foreach_temp_bytes(cand, row) if foreach else 0.0)
        static = weights + grads + optimizer
    peak = allocated * (1 + cal.fragmentation_fraction) + cal.fragmentation_fixed_bytes
    table = np.vstack([weights, grads, optimizer, acts, peak - static - acts, peak])
    usable = model.device_usable_bytes()
    worst = int(np.argmax(peak))
    if peak[worst] <= usable:
        return table, ()
    over = int((peak > usable).sum())
    return table, (_over_reason(worst, table[:, worst], float(fixed.inflight[worst]), usable, over - 1),)


def _over_reason(rank: int, column: np.ndarray, inflight: float, usable: int, others: int) -> str:
    params, grads, optimizer, acts, other, peak = column.tolist()
    parts = {"params": params, "grads": grads, "optimizer states": optimizer,
             f"activations ({inflight:g} micro-batches in flight)": acts, "other (logits, allocator allowance)": other}
    largest = max(parts, key=parts.get)
    more = f" (and {others} more pipeline ranks)" if others else ""
    return (f"pipeline rank {rank} needs {peak / GiB:.1f} GiB of {usable / GiB:.1f} GiB usable: over by "
            f"{(peak - usable) / GiB:.1f} GiB; largest part {largest} {parts[largest] / GiB:.1f} GiB{more}")


def _finish(model, cand, detail, fixed, row, sums, split, full, step, breakdown) -> Evaluation:
    memory_table, reasons = _memory(model, fixed, row, cand, full)
    request, sequences, gpus = model.request, model.request.global_batch_size, cand.world_size
    model_tflops = 3 * detail.model_fwd_total * sequences / step / gpus / 1e12
    hw_tflops = (3 * detail.hw_fwd_total + float(sums[REC_FLOPS].sum())) * sequences / step / gpus / 1e12
    return Evaluation(
        step_time_s=step, peak_bytes=int(memory_table[-1].max()), capacity_bytes=model.device_usable_bytes(),
        fits=not reasons, reasons=reasons, tokens_per_s=sequences * request.seq_len / step,
        model_tflops_per_gpu=model_tflops, hardware_tflops_per_gpu=hw_tflops, mfu=model_tflops / fixed.peak_tflops,
        hfu=hw_tflops / fixed.peak_tflops, stage_layers=split, full_recompute_layers=full, raw_breakdown=breakdown,
        raw_stage_memory=memory_table, raw_stage_times=sums[list(TIME_ROWS)],
    )


def _invalid(model: "CostModel", reasons: tuple[str, ...]) -> Evaluation:
    return Evaluation(
        step_time_s=float("inf"), peak_bytes=0, capacity_bytes=model.device_usable_bytes(), fits=False,
        reasons=reasons, tokens_per_s=0.0, model_tflops_per_gpu=0.0, hardware_tflops_per_gpu=0.0, mfu=0.0, hfu=0.0,
    )
