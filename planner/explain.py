"""A readable account of a LaunchPlan: why these degrees, where the time and memory go, what the
runner-up was and why it lost, and what the search pruned. Pure: plan in, Explanation out; rendering
lives in planner.report (rich) and planner.plot (matplotlib).

Every statement is computed from numbers in the plan itself (process groups, breakdown, per-stage memory,
alternatives, pruned counts), so an explanation never disagrees with the plan it explains.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from planner.compression_whatif import compression_rows
from planner.export.common import decoder_layers
from planner.schemas.plan import Alternative, Breakdown, LaunchPlan, Parallelism
from planner.units import GiB

ZERO_SHARDS = {0: "nothing sharded", 1: "optimizer states sharded", 2: "optimizer states and gradients sharded",
               3: "optimizer states, gradients and parameters sharded"}
TIME_PARTS = tuple(Breakdown.model_fields)  # the breakdown's parts, in the schema's order


@dataclass(frozen=True)
class TimePart:
    part: str
    seconds: float
    fraction: float


@dataclass(frozen=True)
class StageMemoryRow:
    stage: int
    params_gib: float
    grads_gib: float
    optimizer_gib: float
    activations_gib: float
    other_gib: float
    peak_gib: float
    capacity_fraction: float


@dataclass(frozen=True)
class AlternativeRow:
    degrees: str
    schedule: str
    recompute: str
    microbatch_size: int
    step_time_s: float
    slower_by: float
    peak_gib: float
    why_not: str
    differs: str = ""


@dataclass(frozen=True)
class Explanation:
    headline: str
    summary: dict[str, str]
    reasons: tuple[str, ...]
    time: tuple[TimePart, ...]
    memory: tuple[StageMemoryRow, ...]
    capacity_gib: float
    runner_up: AlternativeRow | None
    alternatives: tuple[AlternativeRow, ...]
    pruned: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    frameworks: dict[str, str] = field(default_factory=dict)  # stack -> "runs it" or that stack's reason
    compression: tuple = ()  # planner.compression_whatif.CompressionRow: the plan without and with each compression

    def to_dict(self) -> dict:
        return asdict(self)


def degrees_text(par: Parallelism) -> str:
    """`dp=2 tp=8 pp=4 (vpp=2) cp=1 ep=1 sp zero=1`: the short form used in tables."""
    text = f"dp={par.dp} tp={par.tp} pp={par.pp}"
    text += f" vpp={par.vpp}" if par.vpp > 1 else ""
    text += f" cp={par.cp}" if par.cp > 1 else ""
    text += f" ep={par.ep}" if par.ep > 1 else ""
    text += " sp" if par.sp else ""
    text += f" zero={par.zero_stage}" + (f" dp_replicate={par.dp_replicate}" if par.dp_replicate > 1 else "")
    return text + (f" {par.tp_overlap}" if par.tp_overlap != "none" else "")


def _group(plan: LaunchPlan, axis: str) -> str:
    for group in plan.process_groups:
        if group.axis == axis:
            where = "across nodes" if group.spans_nodes else "inside one node"
            return f"{where}, {group.bandwidth_GBps:.0f} GB/s"
    return "link not recorded"


def _share(plan: LaunchPlan, seconds: float) -> str:
    step = plan.prediction.step_time_s
    return f"{seconds:.3g} s ({seconds / step:.1%} of the step)" if step > 0 else f"{seconds:.3g} s"


def _reasons(plan: LaunchPlan) -> list[str]:
    """One sentence per parallelism axis, from the plan's own numbers."""
    par, br = plan.parallelism, plan.prediction.breakdown
    counts = [len(decoder_layers(s.layers)) for s in sorted(plan.stages, key=lambda s: s.stage)]
    out = []
    if par.tp > 1:
        sp = "; sequence parallel splits norm/dropout activations too" if par.sp else ""
        out.append(f"tp={par.tp}: each layer's matmuls split over {par.tp} GPUs ({_group(plan, 'tp')}); exposed TP communication {_share(plan, br.tp_comm_exposed_s)}{sp}")
    else:
        out.append("tp=1: every layer runs whole on one GPU, no per-layer all-reduce")
    if par.pp > 1:
        out.append(f"pp={par.pp}" + (f" x vpp={par.vpp}" if par.vpp > 1 else "") + f" ({plan.schedule}): decoder layers per stage {counts}; "
                   f"bubble {_share(plan, br.bubble_s)} with {plan.batch.num_microbatches} micro-batches; p2p {_share(plan, br.pp_comm_s)}")
    else:
        out.append("pp=1: no pipeline, so no bubble; the whole model's layers sit on every GPU")
    out.append(f"dp={par.dp}, ZeRO-{par.zero_stage} ({ZERO_SHARDS[par.zero_stage]}; {_group(plan, 'dp')}): exposed gradient sync {_share(plan, br.dp_comm_exposed_s)}")
    if par.cp > 1:
        flavour = f" ({par.cp_comm_type})" if par.cp_comm_type else ""
        out.append(f"cp={par.cp}: the sequence of {plan.batch.seq_len} tokens split over {par.cp} GPUs; K/V exchange{flavour} "
                   f"{_share(plan, br.cp_comm_s)}")
    if par.ep > 1:
        how = f" (dispatcher {par.moe_dispatcher}, overlap {par.moe_overlap})" if par.moe_dispatcher else ""
        out.append(f"ep={par.ep}: experts spread over {par.ep} GPUs; exposed dispatch and combine{how} {_share(plan, br.ep_comm_s)}")
    if plan.memory.per_stage:
        worst = max(plan.memory.per_stage, key=lambda s: s.peak_bytes)
        parts = {"weights": worst.params_bytes, "gradients": worst.grads_bytes, "optimizer": worst.optimizer_bytes,
                 "activations": worst.activations_bytes, "other": worst.other_bytes}
        big = max(parts, key=parts.get)
        out.append(f"memory: peak {worst.peak_bytes / GiB:.1f} GiB of {plan.memory.capacity_bytes / GiB:.1f} GiB on pipeline rank "
                   f"{worst.stage} ({worst.peak_bytes / max(plan.memory.capacity_bytes, 1):.0%}); the largest part is {big} ({parts[big] / GiB:.1f} GiB)")
    out.extend(f"memory by trace: {text}" for text in _traced_summary(plan).values())
    return out


def _practice(plan: LaunchPlan) -> tuple[str, ...]:
    """The practice rule's verdict (planner.search.practice) when it chose this plan over a faster one."""
    return tuple(note for note in plan.notes if note.startswith("practice (") and "chose this plan" in note)


def _differences(plan: LaunchPlan, alt: Alternative) -> str:
    """`tp 8->4, pp 2->4, mbs 1->2`: what the alternative changes relative to the chosen plan."""
    chosen, other = plan.parallelism.model_dump(), alt.parallelism.model_dump()
    pairs = [(name, chosen[name], other[name]) for name in ("dp", "tp", "pp", "vpp", "cp", "ep", "sp", "zero_stage", "tp_overlap")]
    modes = {stage.recompute.mode for stage in plan.stages}
    pairs += [("mbs", plan.batch.microbatch_size, alt.batch.microbatch_size), ("schedule", plan.schedule, alt.schedule),
              ("recompute", "/".join(sorted(modes)), alt.recompute)]
    changed = [f"{name} {a}->{b}" for name, a, b in pairs if a != b]
    return ", ".join(changed) if changed else "same configuration, other stage split or recompute layers"


def _alternative_row(plan: LaunchPlan, alt: Alternative) -> AlternativeRow:
    step = plan.prediction.step_time_s
    return AlternativeRow(
        degrees=degrees_text(alt.parallelism), schedule=alt.schedule, recompute=alt.recompute,
        microbatch_size=alt.batch.microbatch_size, step_time_s=alt.step_time_s,
        slower_by=alt.step_time_s / step - 1.0 if step > 0 else 0.0, peak_gib=alt.peak_bytes / GiB, why_not=alt.why_not,
        differs=_differences(plan, alt),
    )


def _traced_summary(plan: LaunchPlan) -> dict[str, str]:
    """The traced peak (planner.memory_trace) where the plan was traced, with its note."""
    traced = plan.memory.traced
    if traced is None:
        return {}
    peak = f"{traced.peak_bytes / GiB:.2f} GiB: " if traced.peak_bytes is not None else ""
    return {"traced peak": peak + traced.note}


def _memory_rows(plan: LaunchPlan) -> tuple[StageMemoryRow, ...]:
    cap = max(plan.memory.capacity_bytes, 1)
    return tuple(
        StageMemoryRow(stage=s.stage, params_gib=s.params_bytes / GiB, grads_gib=s.grads_bytes / GiB,
                       optimizer_gib=s.optimizer_bytes / GiB, activations_gib=s.activations_bytes / GiB,
                       other_gib=s.other_bytes / GiB, peak_gib=s.peak_bytes / GiB, capacity_fraction=s.peak_bytes / cap)
        for s in plan.memory.per_stage
    )


def framework_verdicts(plan: LaunchPlan, names: list[str] | None = None) -> dict[str, str]:
    """Which stacks run this plan: 'runs it', or the first rule of that stack's profile it breaks (planner.frameworks).
    The plan's own framework is always judged; `names` None judges every shipped profile."""
    from planner.frameworks import list_frameworks, load_framework, plan_refusal

    out = {}
    for name in dict.fromkeys([plan.request.framework, *(list_frameworks() if names is None else names)]):
        profile = load_framework(name)
        out[profile.name] = plan_refusal(profile, plan) or "runs it"
    return out


def explain(plan: LaunchPlan, *, frameworks: list[str] | None = None) -> Explanation:
    """The account of one plan; `frameworks` names the stacks to judge it against (None: every shipped one)."""
    pred, req = plan.prediction, plan.request
    step = pred.step_time_s
    br = pred.breakdown.model_dump()
    time = tuple(TimePart(part=name.removesuffix("_s"), seconds=br[name], fraction=br[name] / step if step > 0 else 0.0)
                 for name in TIME_PARTS if br.get(name, 0.0) > 0)
    alternatives = tuple(_alternative_row(plan, alt) for alt in plan.alternatives)
    status = "fits" if plan.memory.fits and plan.feasible else "DOES NOT FIT"
    headline = (f"{req.model.name} on {req.gpus} x {req.topology.device.name}: {degrees_text(plan.parallelism)}, "
                f"{plan.schedule}, {step:.3g} s/step, MFU {pred.mfu:.1%} ({status})")
    summary = {
        "kind": plan.kind, "model": req.model.name, "topology": f"{req.topology.name} ({req.topology.num_nodes} x {req.topology.gpus_per_node})",
        "gpus": str(req.gpus), "degrees": degrees_text(plan.parallelism), "schedule": plan.schedule,
        "batch": f"global {plan.batch.global_batch_size} = micro {plan.batch.microbatch_size} x {plan.batch.num_microbatches} micro-batches x dp {plan.parallelism.dp}",
        "seq_len": str(plan.batch.seq_len), "precision": req.precision, "framework": req.framework,
        "step time": f"{step:.4g} s" + (f" +/-{pred.error_band:.0%} (9 in 10 published runs, leave-one-source-out)"
                                         if pred.error_band else ""),
        "tokens/s": f"{pred.tokens_per_s:,.0f}", "MFU / HFU": f"{pred.mfu:.1%} / {pred.hfu:.1%}",
        "peak memory": f"{plan.memory.peak_bytes / GiB:.2f} GiB of {plan.memory.capacity_bytes / GiB:.2f} GiB",
        **_traced_summary(plan),
    }
    notes = list(plan.notes) + [f"infeasible: {reason}" for reason in plan.infeasible_reasons]
    if not plan.alternatives:
        notes.append("no alternatives recorded in this plan (an `estimate`, or `plan --top-k 0`)")
    return Explanation(
        headline=headline, summary=summary, reasons=(*_practice(plan), *_reasons(plan)), time=time, memory=_memory_rows(plan),
        capacity_gib=plan.memory.capacity_bytes / GiB, runner_up=alternatives[0] if alternatives else None,
        alternatives=alternatives, pruned=dict(sorted(plan.pruned.items(), key=lambda kv: -kv[1])), notes=tuple(notes),
        frameworks=framework_verdicts(plan, frameworks), compression=compression_rows(plan),
    )
