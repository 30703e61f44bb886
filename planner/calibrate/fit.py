"""Deriving a calibration overlay from a user's measured runs: the derivation of benchmarks/accuracy.py --derive.

For one cluster and one stack: each run's implied GEMM ceiling (planner.cost.derivation.implied_ceiling: the ceiling
at which the cost model reproduces the measured step time of the run's own configuration), under each per-step loop
overhead of STEP_OVERHEAD_GRID_S (accuracy.py's grid); the ceiling is the median of the implied ceilings (runs whose
implied ceiling reaches SATURATED say nothing about GEMMs and are left out), and the overhead the grid value with the
least median |error|. The overhead is derived only from MIN_RUNS_FOR_OVERHEAD runs or more: with fewer, one ceiling
fits every overhead and the shipped overhead is kept. Leave-one-run-out: each run predicted with the constants
derived from the others (the error a new configuration on this cluster can expect).

A per-step constant moves no choice and no ceiling except through the target, so a prediction under overhead o is
the one under 0 plus o, and an implied ceiling under o is the one that reproduces measured - o under 0.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from functools import lru_cache

from planner.cost.calibration import DeviceCalibration, device_calibration, step_overhead_s
from planner.cost.derivation import implied_ceiling
from planner.cost.model import Candidate, CostModel
from planner.cost.notes import candidate_of
from planner.cost.validity import input_reasons
from planner.errors import BadInputError
from planner.frameworks import config_of, load_framework, refusal
from planner.schemas.calibration import CalibrationOverlay, LeaveOneOut, RunFit
from planner.schemas.framework import FrameworkProfile
from planner.schemas.model import ModelSpec
from planner.schemas.plan import PlanRequest
from planner.schemas.runs import MeasuredRun
from planner.schemas.topology import Topology

STEP_OVERHEAD_GRID_S = tuple(round(0.025 * i, 3) for i in range(17))  # 0 to 0.4 s, as benchmarks/accuracy.py
SATURATED = 0.999
MIN_RUNS_FOR_OVERHEAD = 3


@dataclasses.dataclass
class Case:
    """One measured run, priced: its request, candidate and the shipped calibration of its stack."""

    run: MeasuredRun
    request: PlanRequest
    cand: Candidate
    shipped: DeviceCalibration
    framework: FrameworkProfile  # the run's stack profile, read once (every CostModel of the fit shares it)

    @lru_cache(maxsize=None)  # noqa: B019 - cases live as long as one derivation
    def step_s(self, ceiling: float | None) -> float:
        """Predicted step time without the per-step overhead, at a GEMM ceiling (None: the shipped one)."""
        cal = self.shipped if ceiling is None else dataclasses.replace(self.shipped, matmul_ceiling_fraction=ceiling)
        return CostModel(self.request, framework=self.framework, calibration=cal, step_overhead=0.0).evaluate(self.cand).step_time_s

    @lru_cache(maxsize=None)  # noqa: B019 - every leave-one-out fold asks again
    def implied(self, overhead: float) -> float:
        target = self.run.step_time_s - overhead
        if target <= 0:
            return 1.0
        return implied_ceiling(lambda c: 1.0 / self.step_s(round(c, 9)), 1.0 / target)

    __hash__ = object.__hash__


def priced_case(run: MeasuredRun, model: ModelSpec, topology: Topology) -> Case:
    """The run as the planner prices it; a configuration the model or the stack refuses is one line naming the run."""
    try:
        request = PlanRequest(model=model, topology=topology, gpus=run.gpus, global_batch_size=run.global_batch_size,
                              seq_len=run.seq_len, precision=run.precision, framework=run.framework)
        cand = candidate_of(request, run.configuration)
        bad = input_reasons(request, cand)
        profile = load_framework(run.framework)
        refused = refusal(profile, config_of(cand, model=model, precision=run.precision))
    except BadInputError as exc:
        raise BadInputError(f"run {run.name}: {exc}") from None
    if bad or refused:
        raise BadInputError(f"run {run.name}: {'; '.join(bad) if bad else refused[1]}")
    shipped = device_calibration(topology.device, run.framework)
    return Case(run, request, cand, shipped, profile)


def derived_ceiling(cases: list[Case], overhead: float, fallback: float) -> float:
    implied = [c.implied(overhead) for c in cases]
    usable = [value for value in implied if value < SATURATED]
    return statistics.median(usable) if usable else fallback


def errors_at(cases: list[Case], ceiling: float, overhead: float) -> list[float]:
    return [(c.step_s(round(ceiling, 9)) + overhead) / c.run.step_time_s - 1 for c in cases]


def fit(cases: list[Case], shipped_overhead: float) -> tuple[float, float]:
    """(GEMM ceiling, per-step overhead) for these runs."""
    fallback = cases[0].shipped.matmul_ceiling_fraction
    grid = STEP_OVERHEAD_GRID_S if len(cases) >= MIN_RUNS_FOR_OVERHEAD else (shipped_overhead,)
    score: Callable[[float], tuple[float, float]] = lambda o: (  # noqa: E731
        statistics.median(abs(e) for e in errors_at(cases, derived_ceiling(cases, o, fallback), o)), abs(o - shipped_overhead))
    overhead = min(grid, key=score)
    return derived_ceiling(cases, overhead, fallback), overhead


def overlay_of(cases: list[Case], provenance: dict) -> CalibrationOverlay:
    """The overlay: derived constants, every run's fit, the leave-one-run-out error."""
    first = cases[0]
    stacks, families = {c.run.framework for c in cases}, {c.shipped.family for c in cases}
    if len(stacks) > 1 or len(families) > 1:
        raise BadInputError(f"the runs mix stacks {sorted(stacks)} or GPU families {sorted(families)}: an overlay is for "
                            "one cluster and one stack; calibrate each separately")
    shipped_overhead = step_overhead_s(first.run.framework)
    ceiling, overhead = fit(cases, shipped_overhead)
    ceiling = round(ceiling, 4)  # as written: the overlay prices plans with this value
    held_out: list[float | None] = []
    for i in range(len(cases)):
        others = cases[:i] + cases[i + 1:]
        if not others:
            held_out.append(None)
            continue
        c, o = fit(others, shipped_overhead)
        held_out.append(cases[i].step_s(round(c, 9)) + o)
    loo = [abs(p / c.run.step_time_s - 1) for p, c in zip(held_out, cases) if p is not None]
    runs = []
    for case, loo_s in zip(cases, held_out):
        model = CostModel(case.request, framework=case.framework,
                          calibration=dataclasses.replace(case.shipped, matmul_ceiling_fraction=ceiling), step_overhead=overhead)
        runs.append(RunFit(name=case.run.name, measured_step_s=case.run.step_time_s,
                           predicted_shipped_s=CostModel(case.request, framework=case.framework).evaluate(case.cand).step_time_s,
                           predicted_overlay_s=case.step_s(round(ceiling, 9)) + overhead, leave_one_out_s=loo_s,
                           implied_ceiling=min(case.implied(overhead), 1.0), measured_peak_gib=case.run.peak_memory_gib,
                           predicted_peak_gib=model.evaluate(case.cand).peak_bytes / 2**30))
    how = "derived" if len(cases) >= MIN_RUNS_FOR_OVERHEAD else f"shipped (fewer than {MIN_RUNS_FOR_OVERHEAD} runs)"
    return CalibrationOverlay(
        device_family=first.shipped.family, device=first.request.topology.device.name, framework=first.run.framework,
        matmul_ceiling_fraction=ceiling, step_overhead_s=overhead,
        shipped={"matmul_ceiling_fraction": first.shipped.matmul_ceiling_fraction, "step_overhead_s": shipped_overhead},
        leave_one_out=LeaveOneOut(runs=len(loo), median_abs_error=statistics.median(loo) if loo else None,
                                  max_abs_error=max(loo) if loo else None),
        runs=runs, provenance={**provenance, "step_overhead": how,
                               "method": "benchmarks/accuracy.py --derive on the user's runs: median implied GEMM ceiling "
                                         "(planner.cost.derivation), overhead from its grid"})
