"""What the search hands back, how candidates rank, why the runners-up lost, and what to say when nothing fits.

Ranking (documented tie-breaks, so the same request gives the same plan): lower predicted step time, then lower
peak memory, then smaller tp, pp, cp, ep, dp, vpp, zero_stage, then larger microbatch_size, then the schedule,
recompute and tp_overlap in their listed order, sp off before on, then the axis order.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

from planner.schedules import ALL as ALL_SCHEDULES
from planner.units import GiB

SCHEDULE_RANK = {s.name: s.tie_rank for s in ALL_SCHEDULES}  # planner.schedules.Schedule.tie_rank
RECOMPUTE_RANK = {"none": 0, "selective": 1, "full": 2}
OVERLAP_RANK = {"none": 0, "domino": 1}
BREAKDOWN_WORDS = {
    "compute_s": "more compute",
    "recompute_s": "more recompute",
    "bubble_s": "larger pipeline bubble",
    "tp_comm_exposed_s": "more exposed TP communication",
    "pp_comm_s": "more PP communication",
    "dp_comm_exposed_s": "more exposed DP communication",
    "ep_comm_s": "more EP all-to-all",
    "cp_comm_s": "more CP communication",
    "optimizer_s": "slower optimizer step",
    "step_overhead_s": "larger per-step loop overhead",
    "grad_accum_s": "more gradient accumulation outside the GEMMs",
}


def distinct_key(cand: Any) -> tuple:
    """Alternatives differ in this: variants of one configuration that only move sp, tp_overlap or the axis order
    are not shown as alternatives of each other (the best of them stands for all)."""
    return (cand.dp, cand.tp, cand.pp, cand.cp, cand.ep, cand.vpp, cand.zero_stage, cand.microbatch_size,
            cand.schedule, cand.recompute, getattr(cand, "recompute_modules", ()))


def rank_key(cand: Any, ev: Any) -> tuple:
    """The ranking key of the module docstring."""
    return (
        ev.step_time_s, ev.peak_bytes, cand.tp, cand.pp, cand.cp, cand.ep, cand.dp, cand.vpp, cand.zero_stage,
        -cand.microbatch_size, SCHEDULE_RANK.get(cand.schedule, 9), RECOMPUTE_RANK.get(cand.recompute, 9),
        OVERLAP_RANK.get(cand.tp_overlap, 9), cand.sp, cand.axis_order,
    )


@dataclass(frozen=True)
class Scored:
    """One evaluated configuration with the stage split and partial recompute it was evaluated with."""

    key: tuple
    cand: Any
    ev: Any
    stage_layers: tuple[int, ...] | None = None
    full_recompute_layers: tuple[int, ...] | None = None

    def __lt__(self, other: Scored) -> bool:
        return self.key < other.key


@dataclass
class Ranking:
    """The best `size` feasible configurations, best first; `threshold_s` is what a newcomer must beat."""

    size: int
    items: list[Scored] = field(default_factory=list)
    ceiling_s: float = math.inf  # nothing slower is wanted (planner.search.practice's second search)
    # what every step time pays beyond the search's lower bounds (CostModel.step_overhead_s): the bounds leave it out
    offset_s: float = 0.0

    def offer(self, item: Scored) -> None:
        """Keep the best of each distinct configuration (distinct_key) and the best `size` of those."""
        key = distinct_key(item.cand)
        for index, held in enumerate(self.items):
            if distinct_key(held.cand) == key:
                if held.key <= item.key:
                    return
                del self.items[index]
                break
        bisect.insort(self.items, item)
        del self.items[self.size :]

    @property
    def threshold_s(self) -> float:
        """The bound an entry must not exceed: the worst kept step time (or the ceiling), less offset_s."""
        held = self.items[-1].ev.step_time_s if len(self.items) >= self.size else math.inf
        return min(held, self.ceiling_s) - self.offset_s


def describe(cand: Any) -> str:
    """`tp=8 pp=16 dp=128 ...` as the CLI flags spell it."""
    parts = [f"dp={cand.dp}", f"tp={cand.tp}", f"pp={cand.pp}"]
    parts += [f"{name}={getattr(cand, name)}" for name in ("cp", "ep", "vpp") if getattr(cand, name) > 1]
    parts += [f"zero={cand.zero_stage}", f"mbs={cand.microbatch_size}", f"schedule={cand.schedule}", f"recompute={cand.recompute}"]
    if cand.sp:
        parts.append("sp")
    if cand.tp_overlap != "none":
        parts.append(f"tp_overlap={cand.tp_overlap}")
    compression = getattr(cand, "compression", None)  # search candidates carry one; plain records may not
    if compression is not None and compression.methods:
        parts.append(f"compression={compression.label}")
    return " ".join(parts)


def why_not(best: Scored, other: Scored) -> str:
    """`2.1% slower: larger pipeline bubble (+0.31 s)`, naming the breakdown part that grew most."""
    a, b = best.ev, other.ev
    if b.step_time_s <= a.step_time_s:
        return f"same predicted step time; loses the tie-break on {_first_difference(best, other)}"
    pct = 100.0 * (b.step_time_s - a.step_time_s) / a.step_time_s
    deltas = {name: getattr(b.breakdown, name) - getattr(a.breakdown, name) for name in BREAKDOWN_WORDS}
    name = max(sorted(deltas), key=lambda n: deltas[n])
    return f"{pct:.1f}% slower: {BREAKDOWN_WORDS[name]} (+{deltas[name]:.3g} s)"


TIE_FIELDS = ("step time", "peak memory", "tp", "pp", "cp", "ep", "dp", "vpp", "zero_stage", "microbatch_size",
              "schedule", "recompute", "tp_overlap", "sp", "axis_order")


def _first_difference(best: Scored, other: Scored) -> str:
    """The first ranking-key field in which `other` loses to `best`."""
    for name, mine, theirs in zip(TIE_FIELDS, best.key, other.key):
        if mine != theirs:
            if name == "peak memory":
                return f"peak memory (+{(theirs - mine) / GiB:.2f} GiB)"
            if name == "microbatch_size":
                return f"microbatch_size ({-theirs} < {-mine})"
            return f"{name} ({getattr(other.cand, name, theirs)} vs {getattr(best.cand, name, mine)})"
    return "nothing (identical)"


def infeasible_message(*, gpus: int, gpus_per_node: int, capacity_bytes: float, closest: Scored | None,
                       floor: tuple[float, Any] | None, zero_stages: tuple[int, ...], recompute_modes: tuple[str, ...],
                       seq_len: int, pruned: dict[str, int]) -> tuple[str, int | None, str | None]:
    """(message, shortfall_bytes, closest description) of the InfeasibleError when no configuration fits."""
    if closest is not None:  # peak and capacity as evaluate reports them (with the allocator allowance)
        capacity_bytes = closest.ev.capacity_bytes
        peak, what = closest.ev.peak_bytes, describe(closest.cand)
        part = f"; {closest.ev.reasons[0]}" if closest.ev.reasons else ""
    elif floor is not None:
        peak, what = floor[0], f"at least, for {floor[1]}"
        part = " (a lower bound: no configuration was close enough to evaluate)"
    else:
        counts = ", ".join(f"{k}: {v}" for k, v in sorted(pruned.items()))
        if not counts:  # nothing was enumerated: the fixed degrees leave no factorisation
            return (f"no factorisation of {gpus} GPUs as dp x tp x pp x cp meets the fixed degrees: dp*tp*pp*cp must equal "
                    f"the GPU count, tp fit a node ({gpus_per_node} GPUs), pp not exceed the layers, and ep divide dp*cp "
                    f"(or dp*cp times a divisor of tp where the stack folds experts): change --tp/--pp/--cp/--ep or --gpus"), None, None
        return f"no configuration of {gpus} GPUs is valid ({counts}): change the GPU count, batch or model", None, None
    cap = capacity_bytes / GiB
    over = max(0.0, peak - capacity_bytes)
    fixes = [f"more GPUs (about {_more_gpus(gpus, gpus_per_node, peak, capacity_bytes)})"]
    if 3 not in zero_stages or (closest is not None and closest.cand.zero_stage < 3):
        fixes.append("zero=3")
    if "full" not in recompute_modes or (closest is not None and closest.cand.recompute != "full"):
        fixes.append("recompute=full")
    fixes.append(f"a shorter sequence (seq_len={seq_len // 2})")
    message = (
        f"no plan fits in {cap:.1f} GiB: the closest needs {peak / GiB:.1f} GiB per GPU ({what}), "
        f"{over / GiB:.1f} GiB over{part}; try {', '.join(fixes)}"
    )
    return message, int(math.ceil(over)), what


def _more_gpus(gpus: int, gpus_per_node: int, peak: float, capacity: float) -> int:
    """Scale the GPU count by the memory ratio, rounded up to whole nodes (static memory shrinks ~1/GPUs)."""
    want = gpus * max(2.0, peak / capacity)
    return int(math.ceil(want / gpus_per_node) * gpus_per_node)
