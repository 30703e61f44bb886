"""Which layout changes a resume can make: DCP reshards what it stores as global tensors, not what is per rank.

Why (issue 24): a lost node turns dp 4 into dp 2, and every layout change used to be refused. DCP saves each tensor
once with its global shape and offsets (DTensor shards of FSDP2 and TP, plain replicated tensors) and, on load,
gives every rank the pieces its own placement needs (torch.distributed.checkpoint, "load-time resharding": the
planner computes the read plan from the saved metadata and the destination state dict). The executor's keys are the
full model's FQNs (`layers.<i>...`), independent of the pipeline cut, and the optimizer state is flattened by the
same FQNs (checkpoint.py). So dp, tp, pp, vpp, cp, the GPU count and a flush schedule may change, and ZeRO 0/2/3 may
be exchanged (plain/DDP tensors and FSDP2 DTensors hold the same global values).

What is stored per rank cannot reshard, and a change touching it is refused naming the reason:
- ZeRO-1 (ZeroRedundancyOptimizer, planner.executor.zero1): each rank's optimizer partition is its own file;
- experts under EP (`experts@ep<r>of<n>` keys): the expert split is in the key, so ep may not change;
- Domino's hand-sharded TP weights (`@tp<r>of<n>` keys): tp may not change under tp_overlap=domino;
- PipeDream-2BW: two weight versions (`v0:`/`v1:` keys) that a flush schedule does not have, and back.
The model and the precision never change. No torch import here.
"""

from __future__ import annotations

from planner.schedules import BY_NAME

RESHARDABLE = ("gpus", "dp", "tp", "pp", "vpp", "cp", "schedule", "zero_stage")


def refusal(before: dict, now: dict) -> str | None:
    """Why the checkpoint written under layout `before` cannot be resumed under `now` (planner.executor.checkpoint's
    layout_of), or None when DCP reshards it. Keys missing from `before` (older checkpoints) are not compared."""
    changed = {key for key in now if key != "model_spec" and key in before and before[key] != now[key]}
    fixed = sorted(changed - set(RESHARDABLE))
    if fixed:
        return ", ".join(f"{key}={before[key]!r} -> {now[key]!r}" for key in fixed) + " cannot change on resume"
    if not changed:
        return None
    said = ", ".join(f"{key}={before[key]!r} -> {now[key]!r}" for key in sorted(changed))
    zero = (before.get("zero_stage"), now.get("zero_stage"))
    if 1 in zero:
        return f"{said}: ZeRO-1 saves each rank's optimizer partition in its own file, which cannot be resharded"
    if now.get("tp_overlap") == "domino" and "tp" in changed:
        return f"{said}: Domino's hand-sharded TP weights are saved per TP rank (@tp<r>of<n> keys), so tp cannot change"
    stale = [BY_NAME[s].stale_weights for s in (before.get("schedule"), now.get("schedule")) if s in BY_NAME]
    if any(stale) and "schedule" in changed:
        return f"{said}: PipeDream-2BW keeps two weight versions that a flush schedule does not have"
    return None
