"""Evaluation + request -> LaunchPlan: stages as module FQN lists, rank map, process groups, prediction, memory.

Stages name the executor model's modules (planner.nn): "tok_embeddings" opens virtual stage 0, "layers.<i>" the
decoder layers, and "norm", "output" close the last virtual stage. Virtual stage v runs on pipeline rank v % pp
(zbv, dualpipev: in a V, planner.schedules.Schedule.stage_rank);
each stage's `memory` is the memory of the pipeline rank that runs it. Ranks come from
planner.topology.placement.rank_map, process groups from the links the cost model used.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from planner.cost.arrays import priced_choices
from planner.cost.evaluate import Evaluation
from planner.cost.model import Candidate, CostModel
from planner.schedules import schedule as schedule_of
from planner.schemas.dims import Axis
from planner.schemas.plan import (
    Alternative, Batch, LaunchPlan, MemoryReport, Parallelism, PlanRequest, Prediction, ProcessGroup, Recompute,
    SolverStats, Stage,
)
from planner.topology.groups import GroupLink
from planner.topology.placement import rank_map


def parallelism_of(cand: Candidate) -> Parallelism:
    return Parallelism(**cand.as_dict(), sp=cand.sp, vpp=cand.vpp, zero_stage=cand.zero_stage, tp_overlap=cand.tp_overlap,
                       axis_order=tuple(cand.axis_order), compression=cand.compression)


def batch_of(request: PlanRequest, cand: Candidate) -> Batch:
    return Batch(global_batch_size=request.global_batch_size, microbatch_size=cand.microbatch_size,
                 num_microbatches=cand.num_microbatches, seq_len=request.seq_len)


def stage_modules(num_layers: int, stage_layers: Sequence[int]) -> list[tuple[str, ...]]:
    """Module FQNs per virtual stage: embedding first, decoder layers in order, final norm and head last."""
    out, start = [], 0
    for index, count in enumerate(stage_layers):
        names = [f"layers.{i}" for i in range(start, start + count)]
        if index == 0:
            names.insert(0, "tok_embeddings")
        if index == len(stage_layers) - 1:
            names += ["norm", "output"]
        out.append(tuple(names))
        start += count
    if start != num_layers:
        raise ValueError(f"stage_layers={list(stage_layers)} sum to {start}, not num_layers={num_layers}")
    return out


def _group(axis: str, link: GroupLink) -> ProcessGroup:
    bandwidth = link.bandwidth_GBps
    return ProcessGroup(axis=axis, size=link.size, spans_nodes=link.spans_nodes,
                        bandwidth_GBps=0.0 if bandwidth == float("inf") else bandwidth, latency_s=link.latency_s if link.size > 1 else 0.0)


def process_groups(model: CostModel, cand: Candidate) -> tuple[ProcessGroup, ...]:
    """One entry per axis with size > 1 (tp, cp, ep, dp, pp), with the link the cost model charged."""
    links = model.links(cand)
    chosen = {Axis.TP: links.tp, Axis.CP: links.cp, Axis.EP: links.ep, Axis.PP: links.pp}
    groups = []
    for axis in (Axis.TP, Axis.CP, Axis.EP, Axis.DP, Axis.PP):
        if cand.degree(axis) <= 1:
            continue
        link = chosen.get(axis)
        if link is None:  # dp: the dp axis itself (the cost model reduces over dp x cp)
            from planner.topology.placement import axis_link

            link = axis_link(model.topology, cand.sizes(), tuple(cand.axis_order), axis.value)
        groups.append(_group(axis.value, link))
    return tuple(groups)


def prediction_of(evaluation: Evaluation, error_band: float | None = None) -> Prediction:
    """The plan's prediction; `error_band` is the calibration's (planner.cost.calibration), None where the device
    family has no published runs."""
    return Prediction(
        step_time_s=evaluation.step_time_s, tokens_per_s=evaluation.tokens_per_s,
        model_tflops_per_gpu=evaluation.model_tflops_per_gpu, hardware_tflops_per_gpu=evaluation.hardware_tflops_per_gpu,
        mfu=evaluation.mfu, hfu=evaluation.hfu, breakdown=evaluation.breakdown, error_band=error_band,
    )


def build_launch_plan(
    model: CostModel,
    cand: Candidate,
    evaluation: Evaluation,
    *,
    kind: str = "estimate",
    notes: Sequence[str] = (),
    alternatives: Sequence[Alternative] = (),
    pruned: Mapping[str, int] | None = None,
    solver: SolverStats | None = None,
) -> LaunchPlan:
    """The LaunchPlan of one evaluated candidate (feasible or not: `feasible` and `infeasible_reasons` say)."""
    request = model.request
    modules = stage_modules(request.model.num_layers, evaluation.stage_layers)
    memories = evaluation.stage_memory
    stages = tuple(
        Stage(stage=v, layers=names, recompute=Recompute(mode=cand.recompute, full_layers=evaluation.full_recompute_layers[v],
                                                     modules=cand.recompute_modules),
              memory=memories[schedule_of(cand.schedule).stage_rank(v, pp=cand.pp)], time=evaluation.stage_times[v])
        for v, names in enumerate(modules)
    )
    sizes = cand.layout_sizes()
    dispatcher, overlap, flavour = priced_choices(model, cand)
    return LaunchPlan(
        kind=kind, request=request, batch=batch_of(request, cand),
        parallelism=parallelism_of(cand).model_copy(update={"moe_dispatcher": dispatcher, "moe_overlap": overlap,
                                                           "cp_comm_type": flavour}),
        schedule=cand.schedule, stages=stages, ranks=tuple(rank_map(request.topology, sizes, tuple(cand.axis_order))),
        process_groups=process_groups(model, cand), prediction=prediction_of(evaluation, model.cal.error_band),
        memory=MemoryReport(peak_bytes=evaluation.peak_bytes, capacity_bytes=evaluation.capacity_bytes,
                            fits=evaluation.fits, per_stage=memories),
        feasible=evaluation.fits, infeasible_reasons=evaluation.reasons, alternatives=tuple(alternatives),
        pruned=dict(pruned or {}), solver=solver or SolverStats(), notes=tuple(notes),
    )
