"""Robustness: between two plans the model cannot tell apart, prefer the one the stack is known to run well.

A framework profile states its practice (planner.schemas.framework.Practice: the schedules, ZeRO stages and
recompute modes its recipes and published runs use, sequence parallelism with TP). The model's ranking error
between two configurations of one request is the ranking band of the device family and stack
(planner.cost.calibration: the median of how far the leave-one-source-out error moves within a source, derived by
`benchmarks/accuracy.py --derive`). When the fastest plan leaves the practice, the same search runs again over the
practice only, pruned at the fastest plan's step time x (1 + band); if it finds a plan there, that plan is chosen
and the fastest is kept as the first alternative, its deviations named (the plan's notes and `planner explain`
say so). A dimension the user fixed is never a deviation, and `SearchLimits.prefer_practice = false`
(`planner plan --fastest`) turns the preference off.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.search.outcome import Scored, describe, distinct_key
from planner.search.options import Options


@dataclass(frozen=True)
class Preference:
    """What the practice rule decided: `chosen` (None: the fastest stays) and why."""

    fastest: Scored
    deviations: tuple[str, ...]
    band: float
    calibration: str  # "hopper x megatron-core"
    framework: str
    chosen: Scored | None = None
    practice_best: Scored | None = None  # the best plan inside the practice, when it lies outside the band
    passed_over: tuple[tuple[Scored, tuple[str, ...]], ...] = ()  # ranked plans faster than `chosen`, deviations
    timed_out: bool = False  # the search over the practice did not finish within the time limit

    def note(self) -> str:
        """One deterministic line for the plan's notes (planner explain prints it)."""
        head = f"practice ({self.framework}): "
        if not self.deviations:
            return head + "the fastest plan is inside the stack's practice"
        where = f"the ranking band of {self.calibration}, +/-{self.band:.1%}"
        devs = "; ".join(self.deviations)
        if self.chosen is not None:
            gain = self.chosen.ev.step_time_s / self.fastest.ev.step_time_s - 1
            return (head + f"chose this plan over the fastest ({describe(self.fastest.cand)}), predicted only "
                    f"{gain:.1%} faster, within {where}, and leaves the stack's practice: {devs}; "
                    "--fastest (prefer_practice=false) takes the fastest")
        if self.practice_best is not None:
            gap = self.practice_best.ev.step_time_s / self.fastest.ev.step_time_s - 1
            return (head + f"the fastest plan leaves the stack's practice ({devs}); the best plan inside it "
                    f"({describe(self.practice_best.cand)}) is {gap:.1%} slower, beyond {where}: the fastest is kept")
        if self.timed_out:
            return head + (f"the fastest plan leaves the stack's practice ({devs}); the search over the practice "
                           "reached the time limit, so the fastest is kept (raise --time-limit to compare)")
        return head + f"the fastest plan leaves the stack's practice ({devs}); no plan inside it is within {where}"

    def why_not(self, other: Scored) -> str | None:
        """The `why_not` of a plan faster than the chosen one (None for any other plan)."""
        if self.chosen is None:
            return None
        for item, devs in self.passed_over:
            if item is other:
                gain = self.chosen.ev.step_time_s / other.ev.step_time_s - 1
                inside = "within" if other.ev.step_time_s * (1 + self.band) >= self.chosen.ev.step_time_s else "beyond"
                return (f"predicted {gain:.1%} faster, {inside} the +/-{self.band:.1%} ranking band; outside "
                        f"{self.framework}'s practice: {'; '.join(devs) or 'no'}")
        return None


def practice_options(opts: Options) -> Options | None:
    """`opts` narrowed to the stack's practice (each field kept as asked where the practice leaves none of it);
    None when the practice narrows nothing."""
    practice = opts.profile.practice

    def narrowed(asked: tuple, preferred: tuple) -> tuple:
        kept = tuple(v for v in asked if v in preferred)
        return kept if preferred and kept else asked

    new = dataclasses.replace(
        opts,
        schedules=narrowed(opts.schedules, practice.schedules),
        zero_stages=narrowed(opts.zero_stages, practice.zero_stages),
        recompute_modes=narrowed(opts.recompute_modes, practice.recompute),
        sp_with_tp=practice.sequence_parallel_with_tp and opts.sp is None,
        min_layers_per_chunk=practice.min_layers_per_virtual_stage if opts.vpp is None else 1,
    )
    return None if new == opts else new


def deviations(cand, opts: Options, num_layers: int) -> tuple[str, ...]:
    """Where the candidate leaves the practice, among the dimensions the search chose (not the user)."""
    narrow = practice_options(opts)
    if narrow is None:
        return ()
    practice, out = opts.profile.practice, []
    if cand.pp > 1 and cand.schedule not in narrow.schedules:
        out.append(f"schedule {cand.schedule} (practice: {', '.join(practice.schedules)})")
    if cand.zero_stage not in narrow.zero_stages:
        out.append(f"zero_stage {cand.zero_stage} (practice: {', '.join(map(str, practice.zero_stages))})")
    if cand.recompute not in narrow.recompute_modes:
        out.append(f"recompute {cand.recompute} (practice: {', '.join(practice.recompute)})")
    if narrow.sp_with_tp and cand.tp > 1 and not cand.sp:
        out.append(f"tp={cand.tp} without sequence parallelism (practice: sp with tp > 1)")
    per_chunk = num_layers / (cand.pp * cand.vpp)
    if cand.vpp > 1 and per_chunk < narrow.min_layers_per_chunk:
        out.append(f"vpp={cand.vpp}: {per_chunk:.3g} layers per virtual stage (practice: at least "
                   f"{practice.min_layers_per_virtual_stage})")
    return tuple(out)


def calibration_name(cal) -> str:
    return f"{cal.family}" + (f" x {cal.stack}" if cal.stack else "")


def choose(ranked: list[Scored], practice_ranked: list[Scored], *, band: float, opts: Options, num_layers: int,
           calibration: str, timed_out: bool = False) -> tuple[list[Scored], Preference]:
    """The ranked list with the practice rule applied (same length), and the decision; `practice_ranked` are the
    plans of the search over the practice (planner.search.entry.prefer_practice), `timed_out` when it did not end."""
    fastest = ranked[0]
    devs = deviations(fastest.cand, opts, num_layers)
    base = Preference(fastest=fastest, deviations=devs, band=band, calibration=calibration, framework=opts.profile.name,
                      timed_out=timed_out)
    inside = [s for s in practice_ranked if not deviations(s.cand, opts, num_layers)]
    if not devs or not inside:
        return ranked, base
    best_inside = inside[0]
    if best_inside.ev.step_time_s > fastest.ev.step_time_s * (1 + band):
        return ranked, dataclasses.replace(base, practice_best=best_inside)
    rest = [s for s in ranked if distinct_key(s.cand) != distinct_key(best_inside.cand)]
    faster = tuple((s, deviations(s.cand, opts, num_layers)) for s in rest if s.key < best_inside.key)
    return [best_inside, *rest][: len(ranked)], dataclasses.replace(base, chosen=best_inside, passed_over=faster)
