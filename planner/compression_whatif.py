"""What communication compression would do to one plan on its cluster: the plan's configuration priced without
compression and with each compression its framework runs there (planner.search.compression_space's variants), so
`explain` can say what compression saves and when it does not pay.

It does not pay where the data-parallel traffic is already hidden behind the backward or moves over NVLink inside
one node: then the bytes it saves were never on the critical path, and its kernels and memory are pure cost.
Sits beside planner.estimate (above the cost model; the search's variant list is reused, not re-derived).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.model import CostModel
from planner.cost.notes import candidate_of
from planner.frameworks import config_of, load_framework, refusal
from planner.schemas.compression import NONE
from planner.schemas.plan import Configuration, LaunchPlan
from planner.search import compression_space
from planner.units import GiB

HIDDEN_FRACTION = 0.01  # exposed dp time below this share of the step: nothing left for compression to save


@dataclass(frozen=True)
class CompressionRow:
    compression: str
    step_time_s: float
    change: float  # (step - uncompressed step) / uncompressed step: negative = faster
    dp_comm_exposed_s: float
    peak_gib: float
    fits: bool
    verdict: str


def compression_rows(plan: LaunchPlan) -> tuple[CompressionRow, ...]:
    """The plan's configuration with no compression first, then each variant its framework runs (ZeRO stage, pp
    and the dp group's layout permitting), and the plan's own if it is none of those."""
    request = plan.request
    profile = load_framework(request.framework)
    config = Configuration(parallelism=plan.parallelism.model_copy(update={"compression": NONE}),
                           microbatch_size=plan.batch.microbatch_size, schedule=plan.schedule,
                           recompute=_base_mode(plan), stage_layers=_stage_layers(plan))
    model = CostModel(request)
    base = candidate_of(request, config)
    found = compression_space.variants(profile, zero_stage=base.zero_stage, pp=base.pp, replicas=base.dp_cp,
                                       dp_link=model.links(base).dp, auto=True, fixed=NONE)
    wanted = list(dict.fromkeys([NONE, *found, plan.parallelism.compression]))
    full = _full_layers(plan)
    reference = model.evaluate(base, stage_layers=config.stage_layers, full_recompute_layers=full)
    rows = []
    for comp in wanted:
        cand = base if comp == NONE else _with(base, comp)
        if refusal(profile, config_of(cand, model=request.model, precision=request.precision)) is not None:
            continue
        ev = reference if comp == NONE else model.evaluate(cand, stage_layers=config.stage_layers, full_recompute_layers=full)
        rows.append(_row(comp.label, ev, reference))
    return tuple(rows)


def _with(cand, comp):
    import dataclasses

    return dataclasses.replace(cand, compression=comp)


def _row(label: str, ev, reference) -> CompressionRow:
    step, ref = ev.step_time_s, reference.step_time_s
    change = (step - ref) / ref if ref > 0 else 0.0
    exposed = ev.breakdown.dp_comm_exposed_s
    if label == "none":
        verdict = ("the data-parallel traffic is hidden behind compute or inside a node: compression has nothing to save"
                   if reference.breakdown.dp_comm_exposed_s < HIDDEN_FRACTION * ref else
                   f"{reference.breakdown.dp_comm_exposed_s:.3g} s of data-parallel communication exposed per step")
    elif not ev.fits:
        verdict = "does not fit: its extra memory (hpZ's secondary copy, PowerSGD's error feedback) is over capacity"
    elif change < 0:
        verdict = f"saves {-change:.1%} of the step (exposed dp communication {exposed:.3g} s)"
    else:
        verdict = "does not pay: its kernels and traffic cost more than the bytes it saves here"
    return CompressionRow(compression=label, step_time_s=step, change=change, dp_comm_exposed_s=exposed,
                          peak_gib=ev.peak_bytes / GiB, fits=ev.fits, verdict=verdict)


def _base_mode(plan: LaunchPlan) -> str:
    modes = sorted({s.recompute.mode for s in plan.stages} or {"none"})
    return modes[0] if len(modes) == 1 else "none"


def _full_layers(plan: LaunchPlan) -> tuple[int, ...] | None:
    counts = tuple(s.recompute.full_layers for s in sorted(plan.stages, key=lambda s: s.stage))
    return counts if any(counts) else None


def _stage_layers(plan: LaunchPlan) -> tuple[int, ...] | None:
    counts = tuple(sum(1 for name in s.layers if name.startswith("layers.")) for s in sorted(plan.stages, key=lambda s: s.stage))
    return counts or None
