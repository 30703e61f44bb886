"""The constants benchmarks/accuracy.py derives from the evaluated runs and writes to planner/cost/calibration.yaml
(`--derive`): the GEMM ceiling per (device family, stack) as the median implied ceiling, the per-step loop
overhead jointly with them (Overheads), the error bands (90th percentile |LOSO error|) and the ranking bands.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path

from accuracy_cases import Case, evaluate_case, implied

from planner.cost.calibration import CALIBRATION_FILE

SATURATED = 0.999
STEP_OVERHEAD_GRID_S = tuple(round(0.025 * i, 3) for i in range(17))  # 0 to 0.4 s (calibration.yaml `loop`)


def derive(rows: list[dict], ceilings: dict[str, float], *, without_source: str | None = None) -> dict[tuple[str, str], float]:
    """Median implied ceiling per (device family, stack), and per (family, '*') over all stacks of the family.
    A run whose implied ceiling reaches the search bound (SATURATED: the model is slower than the run even with
    GEMMs at peak, so its step is not GEMM-limited in the model) says nothing about the GEMM rate and is left out."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["source"] == without_source or ceilings[r["run"]] >= SATURATED:
            continue
        groups[(r["family"], r["stack"])].append(ceilings[r["run"]])
        groups[(r["family"], "*")].append(ceilings[r["run"]])
    return {k: statistics.median(v) for k, v in groups.items()}


def lookup(derived: dict, family: str, stack: str) -> float | None:
    return derived.get((family, stack), derived.get((family, "*")))


class Overheads:
    """The per-step loop overhead (calibration.yaml `loop`) derived jointly with the GEMM ceilings: for each value
    of STEP_OVERHEAD_GRID_S, every run's implied ceiling under it, the ceilings derived from them (derive), and the
    runs' errors at their cell's ceiling; the value with the least mean |log(predicted / measured)| wins. The mean,
    not the median the report prints: the median |error| is flat over a range of overheads (it moves only when
    the median run changes: 0.2-0.275 s within 2% of each other), so its least point was decided by one run and
    moved by a grid step or two whenever one source was held out; the mean of the log errors is smooth in the
    overhead. `without` leaves one source out of all of it (its leave-one-source-out value). A per-step constant
    does not move the unsaid-settings choice, so a prediction under overhead o is the one under 0 plus o."""

    def __init__(self, rows: list[dict], by_id: dict[str, Case]):
        self.rows, self.by_id = rows, by_id
        self._ceilings: dict[float, dict[str, float]] = {}
        self._base: dict[tuple[str, float | None], float] = {}

    def ceilings(self, overhead: float) -> dict[str, float]:
        if overhead not in self._ceilings:
            self._ceilings[overhead] = {r["run"]: implied(self.by_id[r["run"]], r, overhead) for r in self.rows}
        return self._ceilings[overhead]

    def predicted(self, run: str, ceiling: float | None, overhead: float) -> float:
        key = (run, ceiling)
        if key not in self._base:
            self._base[key] = evaluate_case(self.by_id[run], ceiling, 0.0)["predicted_s"]
        return self._base[key] + overhead

    def errors(self, overhead: float, without: str | None = None) -> dict[str, float]:
        derived = derive(self.rows, self.ceilings(overhead), without_source=without)
        return {r["run"]: self.predicted(r["run"], lookup(derived, r["family"], r["stack"]), overhead) / r["measured_s"] - 1
                for r in self.rows if r["source"] != without}

    def best(self, without: str | None = None) -> float:
        return min(STEP_OVERHEAD_GRID_S, key=lambda o: (statistics.fmean(abs(math.log1p(e)) for e in self.errors(o, without).values()), o))


def error_bands(rows: list[dict], quantile: float = 0.9) -> dict[tuple[str, str], float]:
    """Per (family, stack) and (family, '*'): the `quantile` of |leave-one-source-out error| of its runs (the band a
    prediction carries: planner.cost.notes.model_notes)."""
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in rows:
        if r["loso_error"] == r["loso_error"]:
            groups[(r["family"], r["stack"])].append(abs(r["loso_error"]))
            groups[(r["family"], "*")].append(abs(r["loso_error"]))
    return {k: sorted(v)[min(len(v) - 1, int(quantile * len(v)))] for k, v in groups.items()}


def ranking_bands(rows: list[dict]) -> dict[tuple[str, str], float]:
    """Per (family, stack) and (family, '*'): the median over its runs of |(1 + e) / m - 1|, e a run's
    leave-one-source-out error and m the median (1 + e) of the run's source (sources with >= 2 runs). The error a
    source's runs share (its cluster, its software version) cancels when two plans of one request are compared;
    what is left is how far the model's error moves between configurations: the ranking band of
    planner.search.practice (two plans closer than this are not told apart)."""
    by_source: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        if r["loso_error"] == r["loso_error"]:
            by_source[r["source"]].append(r)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for runs in by_source.values():
        if len(runs) < 2:
            continue
        middle = statistics.median(1 + r["loso_error"] for r in runs)
        for r in runs:
            moved = abs((1 + r["loso_error"]) / middle - 1)
            groups[(r["family"], r["stack"])].append(moved)
            groups[(r["family"], "*")].append(moved)
    return {k: statistics.median(v) for k, v in groups.items()}


def _replace_map(line: str, key: str, family: str | None, values: dict[tuple[str, str], float] | None) -> str:
    """`key: {stack: value, ...}` of one family, from `values` (unchanged when there are none)."""
    if not values or family is None or not line.strip().startswith(f"{key}:"):
        return line
    cells = {s: v for (f, s), v in sorted(values.items()) if f == family and s != "*"}
    return line[: line.index(f"{key}:")] + f"{key}: {{" + ", ".join(f"{s}: {v:.3f}" for s, v in cells.items()) + "}"


def _replace_derived(line: str, key: str, family: str | None, values: dict[tuple[str, str], float] | None) -> str:
    """`key: x  # derived` with the family's value over all stacks (unchanged when there is none)."""
    if not values or (family, "*") not in values or not (line.strip().startswith(f"{key}:") and line.endswith("# derived")):
        return line
    return line[: line.index(f"{key}:")] + f"{key}: {values[(family, '*')]:.3f}  # derived"


def write_ceilings(derived: dict[tuple[str, str], float], path: Path = CALIBRATION_FILE,
                   bands: dict[tuple[str, str], float] | None = None,
                   ranking: dict[tuple[str, str], float] | None = None, overhead: float | None = None) -> str:
    """Rewrite each family's `stack_ceilings:` line of calibration.yaml with the derived medians (rounded to 3
    places), and a `matmul_ceiling_fraction: x  # derived` line with the family's median over all stacks; returns
    the new text. The chosen unsaid settings depend on the ceilings, so `--derive` repeats this
    until the values stop changing."""
    text, family = path.read_text(encoding="utf-8"), None
    out = []
    for line in text.splitlines():
        if line.strip().startswith("- family:"):
            family = line.split(":", 1)[1].strip()
        line = _replace_derived(line, "matmul_ceiling_fraction", family, derived)
        line = _replace_map(line, "stack_ceilings", family, derived)
        line = _replace_map(line, "stack_error_bands", family, bands)
        line = _replace_derived(line, "error_band", family, bands)
        line = _replace_map(line, "stack_ranking_bands", family, ranking)
        line = _replace_derived(line, "ranking_band", family, ranking)
        if overhead is not None and line.strip().startswith("step_overhead_s:") and line.endswith("# derived"):
            line = line[: line.index("step_overhead_s:")] + f"step_overhead_s: {overhead:.3f}  # derived"
        out.append(line)
    new = "\n".join(out) + "\n"
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(new, encoding="utf-8")
    partial.replace(path)  # atomic: a reader sees the old file or the new one
    return new
