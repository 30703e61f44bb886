"""What the executor can run, checked before any process starts (no torch here).

`check_runnable(plan)` raises BadInputError naming the field, the value and the fix for anything the
runtime would refuse, so `planner run` fails in a second instead of after torchrun start-up, and returns
notes on what the runtime adjusts (said in the run report). The configuration rules are
the `planner` framework profile (planner/data/frameworks/planner.yaml), the rules the search applies with --framework planner.
"""

from __future__ import annotations

from planner.errors import BadInputError
from planner.frameworks import load_framework, plan_configs, precision_refusal, refusal
from planner.models.support import reference_refusal
from planner.schedules import DEFAULT, V_PLACED
from planner.schedules import schedule as schedule_of
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import LaunchPlan

EXECUTOR_FRAMEWORK = "planner"
EMBEDDING_PARTS = ("tok_embeddings",)
HEAD_PARTS = ("norm", "output")


def stage_layer_indices(names: tuple[str, ...], num_layers: int, stage: int) -> list[int]:
    """Decoder layer indices a stage names (`layers.<i>`); unknown module names are refused."""
    indices = []
    for name in names:
        if name.startswith("layers."):
            suffix = name[len("layers."):]
            if not suffix.isdigit() or int(suffix) >= num_layers:
                raise BadInputError(f"stages[{stage}].layers: {name!r} is not a decoder layer of a {num_layers}-layer model: regenerate the plan")
            indices.append(int(suffix))
        elif name not in EMBEDDING_PARTS + HEAD_PARTS:
            raise BadInputError(
                f"stages[{stage}].layers: {name!r} is not a module of the executor model "
                f"(expected tok_embeddings, layers.<i>, norm, output): regenerate the plan"
            )
    return indices


def _check_stages(plan: LaunchPlan) -> None:
    par, spec = plan.parallelism, plan.request.model
    stages = sorted(plan.stages, key=lambda s: s.stage)
    if [s.stage for s in stages] != list(range(par.pp * par.vpp)):
        raise BadInputError(
            f"stages: indices {[s.stage for s in stages]} must be 0..{par.pp * par.vpp - 1} (pp*vpp = {par.pp}*{par.vpp}): regenerate the plan"
        )
    order = [i for s in stages for i in stage_layer_indices(s.layers, spec.num_layers, s.stage)]
    if order != list(range(spec.num_layers)):
        raise BadInputError(
            f"stages: decoder layers {order} must be layers 0..{spec.num_layers - 1}, each once and in order: regenerate the plan"
        )
    if "tok_embeddings" not in stages[0].layers or "output" not in stages[-1].layers:
        raise BadInputError("stages: tok_embeddings must be in stage 0 and norm/output in the last stage: regenerate the plan")
    for s in stages:
        if s.recompute.full_layers > len(stage_layer_indices(s.layers, spec.num_layers, s.stage)):
            raise BadInputError(f"stages[{s.stage}].recompute.full_layers={s.recompute.full_layers} exceeds the stage's decoder layers")


def _check_ranks(plan: LaunchPlan) -> None:
    par = plan.parallelism
    if not plan.ranks:
        return
    world = par.world_size
    if sorted(e.rank for e in plan.ranks) != list(range(world)):
        raise BadInputError(f"ranks: the rank map must list ranks 0..{world - 1} once each (dp*tp*pp*cp = {world}): regenerate the plan")
    sizes = par.dims.layout_sizes()
    seen = set()
    for entry in plan.ranks:
        coords = tuple(entry.coords.get(axis, -1) for axis in par.axis_order)
        if any(not 0 <= c < sizes[a] for a, c in zip(par.axis_order, coords)):
            raise BadInputError(f"ranks: rank {entry.rank} has coords {entry.coords} outside {sizes}: regenerate the plan")
        seen.add(coords)
    if len(seen) != world:
        raise BadInputError("ranks: two ranks share the same coordinates: regenerate the plan")


def _check_parallelism(plan: LaunchPlan, profile: FrameworkProfile) -> None:
    """The `planner` framework profile's rules (the search applies the same ones with --framework planner)."""
    par, spec = plan.parallelism, plan.request.model
    if par.ep > 1 and spec.moe is None:
        raise BadInputError(f"ep={par.ep} but model {spec.name!r} has no MoE layers: use ep=1")
    for config in plan_configs(plan):
        refused = refusal(profile, config)
        if refused is not None:
            raise BadInputError(refused[1] + (" (planner run executes the `planner` framework: re-plan with --framework planner)"
                                              if plan.request.framework != EXECUTOR_FRAMEWORK else ""))


def _check_schedule(plan: LaunchPlan) -> None:
    par, sched, m = plan.parallelism, schedule_of(plan.schedule), plan.batch.num_microbatches
    if par.pp == 1 and par.vpp > 1:
        raise BadInputError(f"vpp={par.vpp} with pp=1: virtual stages need pipeline parallelism; set vpp=1")
    if par.pp > 1 and par.vpp > 1 and sched.stages_per_rank == "one":
        raise BadInputError(f"vpp={par.vpp} needs schedule interleaved or zero-bubble, not {plan.schedule!r}")
    least = sched.min_microbatches(pp=par.pp, vpp=par.vpp) if par.pp > 1 else 1  # the schedule's own rule
    if m < least and sched.min_microbatches_is_pp:
        raise BadInputError(
            f"schedule={sched.name} needs num_microbatches={m} >= pp={par.pp} (two weight versions "
            f"suffice only when m >= d, Narayanan et al. 2021 sec. 3.1): raise num_microbatches or use {DEFAULT.name}"
        )
    if par.pp > 1 and sched.v_placed and par.vpp != 2:
        raise BadInputError(f"schedule={plan.schedule} places two stages per pipeline rank in a V: set vpp=2 (got vpp={par.vpp})")
    if m < least:
        other = next(s.name for s in V_PLACED if not s.min_microbatches_is_stages)
        raise BadInputError(f"schedule={sched.name} needs num_microbatches={m} >= pp*vpp={least}: "
                            f"raise num_microbatches or use {other}")
    if par.pp > 1 and sched.stages_per_rank == "several" and par.vpp == 1:
        raise BadInputError(f"schedule={sched.name} needs vpp > 1: set vpp=2 or schedule={DEFAULT.name}")


def check_runnable(plan: LaunchPlan) -> tuple[str, ...]:
    """Raise BadInputError for what the executor cannot run; return notes on what it adjusts."""
    par, batch = plan.parallelism, plan.batch
    profile = load_framework(EXECUTOR_FRAMEWORK)  # the executor's own profile, read once per check
    refused = precision_refusal(profile, plan.request.precision)
    if refused is not None:
        raise BadInputError(refused)
    if batch.global_batch_size != batch.microbatch_size * batch.num_microbatches * par.dp:
        raise BadInputError(
            f"global_batch_size={batch.global_batch_size} != microbatch_size={batch.microbatch_size} x "
            f"num_microbatches={batch.num_microbatches} x dp={par.dp}: regenerate the plan"
        )
    model_refused = reference_refusal(plan.request.model)
    if model_refused is not None:
        raise BadInputError(model_refused)
    _check_parallelism(plan, profile)
    _check_schedule(plan)
    _check_stages(plan)
    _check_ranks(plan)
    notes = []
    sched = schedule_of(plan.schedule)
    if par.pp > 1 and sched.splits_backward and par.zero_stage == 3:
        notes.append(f"{plan.schedule} with FSDP2: parameters are not resharded after forward (ZeRO-3 runs as ZeRO-2), else torch trains on wrong gradients")
    if par.pp > 1 and sched.stale_weights:
        notes.append(f"{sched.name}: one pipeline over all steps, never flushed; a step's time is the time between a rank's weight "
                     "updates (step 1 includes the pipeline fill), its loss is on weights one step old")
    if par.dp_replicate > 1:
        notes.append(f"HSDP: dp={par.dp} runs as {par.dp_replicate} replicas x {par.dims.dp_shard} FSDP shards; "
                     "priced so: state sharded within a replica, the gradient shard all-reduced across replicas")
    if par.pp == 1 and plan.schedule != DEFAULT.name:
        notes.append(f"pp=1: schedule {plan.schedule!r} has no effect (gradient accumulation over {batch.num_microbatches} micro-batches)")
    return tuple(notes)
