"""What a user states they run, priced as stated: the MoE token dispatcher, the MoE overlap and the
context-parallel flavour of a configuration (Parallelism.moe_dispatcher / moe_overlap / cp_comm_type).

Without a pin the cost prices the fastest of what the stack runs (planner.cost.moe_comm.choose,
planner.cost.context_parallel.choose) and the plan records it, so that its export sets the flags that run it. A
user whose job runs another setting (Megatron-Core's code default `--moe-token-dispatcher-type allgather`, NeMo's
recipes' alltoall without `--overlap-moe-expert-parallel-comm`: NeMo 8cfedd7 nemo/collections/llm/gpt/model/
mixtral.py, qwen3.py; no NeMo 2 recipe sets the batch-level overlap) states it, and the estimate prices that one.
A pin the stack does not run, or that its conditions refuse for the layout, is bad input naming the field, the
value and the fix. A loaded plan re-derived (planner.plan_verify) prices what it records, so its numbers come back.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from planner.cost import moe_comm
from planner.cost.arrays import moe_overlap_unmet
from planner.cost.types import CostOptions
from planner.errors import BadInputError
from planner.schemas.model import ModelSpec

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate
    from planner.schemas.plan import Parallelism

# What each of Megatron-Core's conditions on --overlap-moe-expert-parallel-comm asks of the layout
# (moe_comm.unmet_needs; megatron/core/transformer/transformer_config.py __post_init__).
NEED_FIXES = {
    "interleaved_when_pp": "virtual stages when pp > 1 (--schedule interleaved --vpp 2 or more)",
    "no_full_recompute": "no layer fully recomputed (--recompute none or selective)",
    "half_precision": "bf16 or fp8 parameters, not fp32",
    "no_moe_recompute": "no moe module in --recompute-modules",
    "single_mtp_layer": "at most one multi-token prediction layer",
}


def dispatchers_run(options: CostOptions) -> tuple[str, ...]:
    """The token dispatchers the stack runs, its capabilities.expert_parallel.flavours as options_for reads them
    (alltoall always; flex, allgather where listed)."""
    return ("alltoall",) + (("flex",) if options.moe_hierarchical else ()) + (("allgather",) if options.moe_allgather else ())


def pinned(options: CostOptions, par: "Parallelism", *, spec: ModelSpec, stack: str) -> CostOptions:
    """`options` narrowed to the dispatcher, overlap and flavour a configuration `par` states (None: the cost's
    choice); a value `stack` does not run, or one the configuration's degrees have nothing to apply to, raises
    BadInputError."""
    for name in ("moe_dispatcher", "moe_overlap"):
        if getattr(par, name) is not None and (spec.moe is None or par.ep <= 1):
            raise BadInputError(f"{name}={getattr(par, name)!r} needs an MoE model with ep > 1 (got ep={par.ep}): "
                                "leave it out")
    if par.cp_comm_type is not None and par.cp <= 1:
        raise BadInputError(f"cp_comm_type={par.cp_comm_type!r} needs cp > 1 (got cp={par.cp}): leave it out")
    return narrowed(options, moe_dispatcher=par.moe_dispatcher, moe_overlap=par.moe_overlap,
                    cp_comm_type=par.cp_comm_type, spec=spec, stack=stack)


def narrowed(options: CostOptions, *, moe_dispatcher: str | None, moe_overlap: str | None, cp_comm_type: str | None,
             spec: ModelSpec, stack: str) -> CostOptions:
    """`options` with only the stated dispatcher, overlap and flavour among the cost's choices (a search's
    SearchLimits, a configuration's Parallelism): "batch" still runs only where the layout allows it
    (moe_comm.batch_overlap_applies), which an estimate checks apart (pin_reasons)."""
    changes: dict = {}
    if moe_dispatcher is not None or moe_overlap is not None:
        if spec.moe is None:
            raise BadInputError(f"moe_dispatcher/moe_overlap given for a model without experts ({spec.name}): leave them out")
        runs = dispatchers_run(options)
        if moe_dispatcher is not None and moe_dispatcher not in runs:
            raise BadInputError(f"moe_dispatcher={moe_dispatcher!r}: {stack} runs {_listed(runs)}, or leave it out "
                                "for the fastest")
        allowed = (moe_dispatcher,) if moe_dispatcher is not None else runs
        if moe_overlap is not None:
            allowed, changes = _overlap(options, moe_overlap, allowed, spec=spec, stack=stack)
        changes["moe_dispatchers"] = allowed
    if cp_comm_type is not None:
        if cp_comm_type not in options.cp_flavours:
            raise BadInputError(f"cp_comm_type={cp_comm_type!r}: {stack} runs {_listed(options.cp_flavours)}, or leave "
                                "it out for the fastest")
        changes["cp_flavours"] = (cp_comm_type,)
    return dataclasses.replace(options, **changes) if changes else options


def _listed(names: tuple[str, ...]) -> str:
    """'only x: pass that' or 'x, y: pass one of those'."""
    return f"only {names[0]}: pass that" if len(names) == 1 else f"{', '.join(names)}: pass one of those"


def _overlap(options: CostOptions, overlap: str, allowed: tuple[str, ...], *, spec: ModelSpec,
             stack: str) -> tuple[tuple[str, ...], dict]:
    """(dispatchers left, CostOptions changes) for an overlap pin: batch and shared each run with some dispatchers
    only (moe_comm.OVERLAPPED_DISPATCHERS, SHARED_OVERLAP_DISPATCHERS) and never together (transformer_config.py)."""
    if overlap == "none":
        return allowed, {"moe_overlap": False, "moe_shared_overlap": False}
    runs, with_it = ((options.moe_overlap, moe_comm.OVERLAPPED_DISPATCHERS) if overlap == "batch" else
                     (options.moe_shared_overlap, moe_comm.SHARED_OVERLAP_DISPATCHERS))
    if not runs:
        raise BadInputError(f"moe_overlap={overlap!r}: {stack} does not run it (behaviour.overlap): pass "
                            "--moe-overlap none, or leave it out")
    if overlap == "shared" and not spec.moe.shared_ffn_hidden_size:
        raise BadInputError("moe_overlap='shared': the model has no shared experts: pass --moe-overlap none")
    left = tuple(name for name in allowed if name in with_it)
    if not left:
        raise BadInputError(f"moe_overlap={overlap!r} runs with the {' or '.join(with_it)} dispatcher only (got "
                            f"{', '.join(allowed)}; transformer_config.py): pick one of those, or --moe-overlap none")
    return left, ({"moe_shared_overlap": False} if overlap == "batch" else {"moe_overlap": False})


def pin_reasons(model: "CostModel", cand: "Candidate", par: "Parallelism") -> list[str]:
    """Why the stated overlap does not run for this candidate's layout: the stack's conditions on the batch-level
    overlap (behaviour.overlap.moe_all_to_all_needs), the shared-expert overlap beside a recompute of the shared
    experts (Megatron-Core refuses both). A stated dispatcher the group cannot run is CostModel.validity_reasons'
    (dispatch_reasons), for an estimate and a search alike."""
    unmet = moe_overlap_unmet(model, cand) if par.moe_overlap == "batch" else []
    if unmet:  # narrowed has refused "batch" where the stack runs no such overlap
        return [f"moe_overlap='batch': {model.framework.name} runs it only with " + "; ".join(NEED_FIXES[n] for n in unmet)
                + ": change the layout, or pass --moe-overlap none"]
    if par.moe_overlap == "shared" and "shared_experts" in cand.recompute_modules:
        return ["moe_overlap='shared' with shared_experts recomputed: Megatron-Core refuses both (transformer_config.py): "
                "drop shared_experts from --recompute-modules, or pass --moe-overlap none"]
    return []


def dispatch_reasons(options: CostOptions, spec: ModelSpec, cand: "Candidate", shape) -> tuple[str, ...]:
    """Why none of the dispatchers left to price (options.moe_dispatchers, narrowed by a statement) runs for the
    candidate: flex alone where DeepEP has no configuration for its tp x ep group (moe_comm.deepep_runs); () else."""
    if options.moe_dispatchers is None or spec.moe is None or cand.ep <= 1 or not options.moe_deepep:
        return ()
    if set(options.moe_dispatchers) == {"flex"} and not moe_comm.deepep_runs(shape.tp_ep):
        return (moe_comm.flex_refusal(shape.tp_ep),)
    return ()
