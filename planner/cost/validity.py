"""Which candidates are valid configurations: divisibility, batch arithmetic and schedule rules.

Each reason names the numbers and what would fix it. Rules follow Megatron-LM's argument checks
(arguments.py: heads and query groups divisible by tp, layers by pp*vpp for the interleaved schedule,
experts divisible by ep, ep inside dp*cp), and PipeDream-2BW's m >= d (Narayanan et al. 2021, Sec. 3.1). How an
interleaved schedule may split layers over chunks (equal chunks, embedding/loss slots, explicit layouts) and whether
num_microbatches must be a multiple of pp are the framework's rules (planner.frameworks.interleaved_split_reason).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from planner.cost import mixers
from planner.cost.selective import MOE_MODULES
from planner.errors import BadInputError
from planner.frameworks import interleaved_split_reason
from planner.schedules import BY_NAME, DEFAULT, NAMES
from planner.schemas.dims import Axis
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import PlanRequest

if TYPE_CHECKING:
    from planner.cost.types import Candidate

Stack = Callable[[], FrameworkProfile]  # the request's stack profile, handed down (CostModel.framework)


def _divisors(n: int) -> str:
    return "{" + ", ".join(str(d) for d in range(1, n + 1) if n % d == 0) + "}"


def module_reasons(spec, modules: tuple[str, ...]) -> list[str]:
    """Recompute modules the model lacks, as Megatron-Core refuses them (transformer_config.py __post_init__:
    mla_up_proj only with multi-latent attention) or where they would drop nothing (an MoE module in a dense model,
    mlp in a model whose every layer is MoE)."""
    out = []
    if "mla_up_proj" in modules and spec.mla is None:
        out.append(f"recompute_modules mla_up_proj needs multi-latent attention: {spec.name} has none, drop it")
    moe = [m for m in modules if m in MOE_MODULES]
    if moe and spec.moe is None:
        out.append(f"recompute_modules {moe} need a mixture-of-experts model: {spec.name} is dense, drop them")
    elif "shared_experts" in modules and not spec.moe.shared_ffn_hidden_size:
        out.append(f"recompute_modules shared_experts: {spec.name} has no shared experts, drop it")
    if "mlp" in modules and spec.moe is not None and all(spec.is_moe_layer(i) for i in range(spec.num_layers)):
        out.append(f"recompute_modules mlp recomputes dense MLPs: every layer of {spec.name} is MoE, use moe")
    return out


def _model_reasons(request: PlanRequest, c: "Candidate", stack: Stack | None) -> list[str]:
    """`stack`: the request's profile, asked for by the interleaving rules only (None: those rules are skipped,
    as input_reasons drops them)."""
    spec, out = request.model, []
    if spec.num_attention_heads % c.tp:
        out.append(f"tp={c.tp} must divide num_attention_heads={spec.num_attention_heads}: choose tp in {_divisors(spec.num_attention_heads)}")
    elif spec.mla is None and spec.kv_heads % c.tp:
        out.append(f"tp={c.tp} must divide num_kv_heads={spec.kv_heads}: choose tp in {_divisors(spec.kv_heads)}")
    if spec.ffn_hidden_size % c.tp:
        out.append(f"tp={c.tp} must divide ffn_hidden_size={spec.ffn_hidden_size}")
    if spec.layer_types is not None:  # Gated DeltaNet heads / Mamba channels by tp; no cp for their scans
        out.extend(mixers.tp_cp_reasons(spec, tp=c.tp, cp=c.cp))
    if c.ep > 1 and spec.moe is None:
        out.append(f"ep={c.ep} needs a mixture-of-experts model: {spec.name} is dense, use ep=1")
    elif spec.moe is not None and spec.moe.num_experts % c.ep:
        out.append(f"ep={c.ep} must divide num_experts={spec.moe.num_experts}: choose ep in {_divisors(spec.moe.num_experts)}")
    try:
        c.expert_fold  # noqa: B018 - raises BadInputError for an ep outside dp*cp and tp
    except BadInputError as exc:
        out.append(str(exc))
    if request.seq_len % c.cp:
        out.append(f"cp={c.cp} must divide seq_len={request.seq_len}")
    out.extend(module_reasons(spec, c.recompute_modules))
    stages = c.pp * c.vpp
    if stack is None:
        return out
    if spec.num_layers < stages and not _empty_ends_fit(request, stages, stack()):
        out.append(f"pp*vpp={stages} exceeds num_layers={spec.num_layers}: every virtual stage needs a decoder layer")
    elif c.vpp > 1:
        found = interleaved_split_reason(stack(), num_layers=spec.num_layers, pp=c.pp, last_slots=spec.mtp_num_layers,
                                         vpp=c.vpp, num_microbatches=c.num_microbatches)
        if found is not None:
            out.append(found[1])
    return out


def _empty_ends_fit(request: PlanRequest, stages: int, profile: FrameworkProfile) -> bool:
    """num_layers + 2 >= pp*vpp where the stack lets the end stages hold only the embedding and only the loss
    (Llama 3's 405B: 126 layers on 16 x 8 chunks; planner.frameworks_split)."""
    split = profile.capabilities.interleaved_split
    return split.empty_chunks != "none" and request.model.num_layers + 2 >= stages > 1


def _batch_reasons(request: PlanRequest, c: "Candidate") -> list[str]:
    out = []
    world = c.world_size
    if world != request.gpus:
        out.append(f"dp*tp*pp*cp={c.dp}*{c.tp}*{c.pp}*{c.cp}={world} must equal gpus={request.gpus}")
    if c.microbatch_size < 1 or c.num_microbatches < 1:
        out.append(f"microbatch_size={c.microbatch_size} and num_microbatches={c.num_microbatches} must be positive")
        return out
    per_replica = c.microbatch_size * c.num_microbatches
    if c.dp * per_replica != request.global_batch_size:
        out.append(
            f"global_batch_size={request.global_batch_size} must equal dp*microbatch_size*num_microbatches="
            f"{c.dp}*{c.microbatch_size}*{c.num_microbatches}={c.dp * per_replica}: choose a global batch divisible by "
            f"dp*microbatch_size={c.dp * c.microbatch_size}"
        )
    return out


def _schedule_reasons(c: "Candidate") -> list[str]:
    out = []
    sched = BY_NAME.get(c.schedule) if c.schedule in NAMES else None
    if sched is None:
        out.append(f"schedule={c.schedule!r} is unknown: choose one of {', '.join(NAMES)}")
    else:  # the schedule's own (pp, vpp) rules (planner.schedules.Schedule.vpp_reasons)
        out += sched.vpp_reasons(pp=c.pp, vpp=c.vpp)
    if sched is not None and sched.min_microbatches_is_pp and c.pp > 1 and c.num_microbatches < c.pp:
        # Narayanan et al. 2021 (PipeDream-2BW) Sec. 3.1: two weight versions suffice only when each update
        # accumulates m >= d micro-batches (d = pipeline depth); with fewer, in-flight inputs span more versions.
        out.append(f"{sched.title} needs num_microbatches={c.num_microbatches} >= pp={c.pp} (two weight versions hold "
                   f"only when m >= d): raise the global batch, lower microbatch_size, or use {DEFAULT.name}")
    if c.zero_stage not in (0, 1, 2, 3):
        out.append(f"zero_stage={c.zero_stage} must be 0, 1, 2 or 3")
    if c.recompute not in ("none", "selective", "full"):
        out.append(f"recompute={c.recompute!r} must be none, selective or full")
    if c.tp_overlap not in ("none", "domino"):
        out.append(f"tp_overlap={c.tp_overlap!r} must be none or domino")
    elif c.tp_overlap == "domino" and c.tp < 2:
        out.append("tp_overlap=domino needs tp>1: there is no TP communication to overlap")
    if c.sp and c.tp < 2:
        out.append("sp needs tp>1: sequence parallelism splits along the tensor-parallel group")
    return out


def _positive(cand: "Candidate") -> tuple[str, ...]:
    for name in (*Axis, "vpp"):
        if getattr(cand, name) < 1:
            return (f"{name}={getattr(cand, name)} must be at least 1",)
    return ()


def input_reasons(request: PlanRequest, cand: "Candidate") -> tuple[str, ...]:
    """Reasons that make the configuration malformed for this model (bad input: heads, kv heads, experts vs the
    degrees, unknown names, degrees that do not multiply to the GPU count)."""
    positive = _positive(cand)
    if positive:
        return positive
    model = [r for r in _model_reasons(request, cand, None) if not r.startswith(("pp*vpp", "num_layers", "num_microbatches"))]
    batch = [r for r in _batch_reasons(request, cand) if r.startswith("dp*tp*pp*cp")]
    schedule = [r for r in _schedule_reasons(cand) if "divisible" not in r and not r.startswith("PipeDream-2BW needs")]
    return tuple(model + batch + schedule)


def validity_reasons(request: PlanRequest, cand: "Candidate", stack: Stack) -> tuple[str, ...]:
    """All reasons why `cand` is not a valid configuration for `request` run by the stack `stack()` returns (the
    request's profile, asked for only where an interleaving rule reads it); () when it is valid."""
    positive = _positive(cand)
    if positive:
        return positive
    return tuple(_model_reasons(request, cand, stack) + _batch_reasons(request, cand) + _schedule_reasons(cand))
