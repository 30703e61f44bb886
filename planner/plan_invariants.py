"""The invariants every LaunchPlan the search or `estimate` writes satisfies, checked on every plan loaded.

Why: the schema checks each field on its own, so a hand-edited or truncated plan (dp*tp*pp*cp != gpus,
`stages: []`, a changed `request.gpus`, layers missing or repeated) used to be explained, exported or even
run as if it were consistent. `explain`, `export`, `run` and `launch` (planner.api) call `check_plan` first;
a violation is a BadInputError (exit 2, HTTP 422) naming the first broken rule and the fix: write the plan
again with `planner plan` or `planner estimate` rather than editing it.
"""

from __future__ import annotations

import re

from planner.errors import BadInputError
from planner.schemas.plan import LaunchPlan

LAYER = re.compile(r"layers\.(\d+)$")
FIX = "write the plan again with `planner plan` or `planner estimate` instead of editing it"


def plan_problems(plan: LaunchPlan) -> list[str]:
    """Every broken invariant of `plan`, in a fixed order (empty when the plan is consistent)."""
    req, par, batch = plan.request, plan.parallelism, plan.batch
    problems = []
    if par.world_size != req.gpus:
        problems.append(f"dp*tp*pp*cp={par.dp}*{par.tp}*{par.pp}*{par.cp}={par.world_size} != request.gpus={req.gpus}")
    if req.gpus > req.topology.num_gpus:
        problems.append(f"request.gpus={req.gpus} exceeds the topology's {req.topology.num_gpus} GPUs")
    try:
        par.dims.expert_fold  # noqa: B018 - ep divides dp*cp, or folds over tp (MoE parallel folding)
    except BadInputError as exc:
        problems.append(str(exc))
    if batch.global_batch_size != req.global_batch_size or batch.seq_len != req.seq_len:
        problems.append(f"batch ({batch.global_batch_size} x {batch.seq_len}) differs from the request "
                        f"({req.global_batch_size} x {req.seq_len})")
    if batch.microbatch_size * batch.num_microbatches * par.dp != batch.global_batch_size:
        problems.append(f"microbatch_size*num_microbatches*dp={batch.microbatch_size}*{batch.num_microbatches}*{par.dp} "
                        f"!= global_batch_size={batch.global_batch_size}")
    problems += _stage_problems(plan)
    if len(plan.ranks) != req.gpus or any(entry.rank != index for index, entry in enumerate(plan.ranks)):
        problems.append(f"ranks must list ranks 0..{req.gpus - 1} in order, got {len(plan.ranks)} entries")
    return problems


def _stage_problems(plan: LaunchPlan) -> list[str]:
    """Stages 0..pp*vpp-1 in order; the decoder layers 0..num_layers-1 each exactly once, in order."""
    par, num_layers = plan.parallelism, plan.request.model.num_layers
    if len(plan.stages) != par.pp * par.vpp or [s.stage for s in plan.stages] != list(range(len(plan.stages))):
        return [f"stages must be 0..{par.pp * par.vpp - 1} (pp*vpp={par.pp}*{par.vpp}), got {len(plan.stages)} stages"]
    counts = [sum(1 for name in stage.layers if LAYER.match(name)) for stage in plan.stages]
    if 0 in counts:  # end stages may hold only the embedding or the head where the stack runs that
        from planner.frameworks import load_framework
        from planner.frameworks_split import split_refusal

        rule = split_refusal(load_framework(plan.request.framework), num_layers=num_layers, pp=par.pp, vpp=par.vpp,
                             counts=counts)
        if rule is not None:
            return [f"stages[{counts.index(0)}] holds no decoder layer: {rule}"]
    layers = [int(m.group(1)) for stage in plan.stages for name in stage.layers if (m := LAYER.match(name))]
    if layers != list(range(num_layers)):
        return [f"the stages hold {len(layers)} decoder layers, not layers.0 .. layers.{num_layers - 1} once each in order"]
    return []


def check_plan(plan: LaunchPlan, *, source: str = "plan") -> LaunchPlan:
    """`plan` itself, or a BadInputError naming its first broken invariant and the fix."""
    problems = plan_problems(plan)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise BadInputError(f"{source} is inconsistent: {problems[0]}{more}: {FIX}")
    return plan
