"""Accuracy of the cost model against every published run of validation/published_runs.json.

One general conversion (benchmarks/published_runs.py, no per-run table): the run's model, cluster and software
stack; the published settings fixed and the unsaid ones chosen by the planner's own rule (the fastest that fits
among the values the stack runs); the measured step time from the run's step time, tokens/s or TFLOP/s. Prints
the step-time error per run, per source and overall, with:
- the shipped calibration (planner/cost/calibration.yaml, whose per-(device family, stack) GEMM ceilings are
  the medians of the implied ceilings this script derives: `--derive` prints them);
- leave-one-source-out (LOSO): each source predicted with ceilings derived from the other sources only (a
  (family, stack) cell with no other source falls back to the family's median over all its other runs, a family
  with no other source to calibration.yaml's value);
- the naive estimate 6 * P * tokens / (GPUs * 0.5 * peak) on the same runs; llm-analysis at 0.5 FLOP efficiency
  with each run's chosen configuration where it is installed (benchmarks/llm_analysis_baseline.py says how).
Also the runs predicted not to fit at their published settings (false OOM), and (benchmarks/accuracy_views.py):
- each source weighted once (each run 1/n of its source's n runs; the weighted median) beside the plain median;
- the run set without its largest source (the MosaicML table), everything re-derived without it;
- ranking within every source with >= 3 configurations of one model on one device (Spearman, top-1 gap);
- the ablation table: each stack-specific mechanism (a profile fact, frameworks/*.yaml) switched off for every
  run of the stacks that set it, and the reading rules of published_runs switched off, full LOSO each.

Usage: python benchmarks/accuracy.py [--runs FILE] [--only SUBSTRING] [--quiet] [--no-ablations]
       python benchmarks/accuracy.py --derive   (rewrites calibration.yaml's stack_ceilings, then reports)
The committed benchmarks/results/accuracy.txt is `python benchmarks/accuracy.py` with llm-analysis installed.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import accuracy_views as V  # noqa: E402
import llm_analysis_baseline  # noqa: E402
import published_runs as P  # noqa: E402

from planner.cost.calibration import CALIBRATION_FILE, device_calibration  # noqa: E402
from planner.cost.compute import peak_tflops  # noqa: E402
from planner.cost.derivation import implied_ceiling  # noqa: E402
from planner.cost.evaluate import Evaluation  # noqa: E402
from planner.cost.model import Candidate, CostModel  # noqa: E402
from planner.cost.stack import options_for  # noqa: E402
from planner.frameworks import load_framework  # noqa: E402
from planner.models import counting  # noqa: E402
from planner.schemas.framework import FrameworkProfile  # noqa: E402
from planner.schemas.plan import PlanRequest  # noqa: E402

RUNS_FILE = Path(__file__).resolve().parents[1] / "validation" / "published_runs.json"
SATURATED = 0.999
# Published configurations that did NOT fit (stated in a run's source, not a run of the file): (the run whose
# source says it, the GPU count and micro-batch size it failed at with the run's other settings, the quote). The
# check: predicted not to fit there (flagged), needing more than the run itself.
PUBLISHED_OOMS = (
    ("megatron2021_t2_zero3_529B_640gpu", 560, 4, "Narayanan et al. 2021 Table 2: 'The 530-billion-parameter GPT model "
     "did not fit on 560 GPUs when using a microbatch size of 4 with ZeRO-3'"),
    ("torchtitan_a100_llama2_70B_selective_op_lbs1", 64, 2, "torchtitan docs/performance.md (613bfd0): '70B | 2 | "
     "selective op | OOM', '70B | 2 | selective layer | OOM' on 64 A100 80GB"),
)
TARGET_LOSO_MEDIAN, TARGET_LOSO_MAX, TARGET_COVERAGE, TARGET_VS_NAIVE = 0.10, 0.35, 0.90, 0.6
STEP_OVERHEAD_GRID_S = tuple(round(0.025 * i, 3) for i in range(17))  # 0 to 0.4 s (calibration.yaml `loop`)


@dataclasses.dataclass
class Case:
    """One run converted: its request, the candidates its unsaid settings allow, and what it measured."""

    run: dict
    stack: str
    family: str
    source: str
    request: PlanRequest
    candidates: list[Candidate]
    overrides: dict = dataclasses.field(default_factory=dict)  # CostOptions fields replaced (an ablation)
    profile: FrameworkProfile | None = None  # the request's stack profile, read once per run


def build_case(run: dict, overrides: dict | None = None, off: tuple[str, ...] = ()) -> Case | None:
    """The run converted; `overrides` ({stack: {CostOptions field: value}}) switches a stack's profile facts off
    for every run of that stack (accuracy_views.ABLATIONS)."""
    stack = P.stack_of(run)
    spec, topo = P.model_spec(run), P.topology(run)
    request = PlanRequest(model=spec, topology=topo, gpus=run["parallel"]["num_gpus"], global_batch_size=P.global_batch(run),
                          seq_len=spec.seq_len, precision=P.precision_of(run),
                          framework=P.profile_of(run, stack))
    s = P.settings(run, stack, off)
    keys = list(s.choices)
    candidates = []
    for values in itertools.product(*(s.choices[k] for k in keys)):
        f = dict(s.fixed, **dict(zip(keys, values)))
        if f["schedule"] != "interleaved":
            f["vpp"] = 1
        elif f["vpp"] in (None, 1) or ("vpp" in s.choices and spec.num_layers % (f["pp"] * f["vpp"])):
            continue  # an unsaid vpp: equal chunks only; a published one: the stack's split rule (validity_reasons)
        per_step = f["dp"] * f["microbatch_size"]
        if request.global_batch_size % per_step:
            continue
        cand = Candidate(num_microbatches=request.global_batch_size // per_step, **f)
        if cand not in candidates:
            candidates.append(cand)
    return Case(run, stack, P.device_family(run), P.source_of(run), request, candidates,
                dict((overrides or {}).get(stack, {})), load_framework(request.framework))


def options(case: Case, request: PlanRequest | None = None):
    """The stack's CostOptions (its profile, planner.cost.stack) with the case's overrides applied."""
    request = request or case.request
    framework = case.profile if request.framework == case.request.framework else request.framework
    return dataclasses.replace(options_for(framework, request.precision), **case.overrides)


def cost_model(case: Case, ceiling: float | None, overhead: float | None = None) -> CostModel:
    """The run's CostModel with the shipped calibration, or a GEMM ceiling and per-step loop overhead given."""
    cal = device_calibration(case.request.topology.device, framework=case.stack)
    if ceiling is not None:
        cal = dataclasses.replace(cal, matmul_ceiling_fraction=ceiling)
    return CostModel(case.request, framework=case.profile, calibration=cal, step_overhead=overhead, options=options(case))


def choose(case: Case, ceiling: float | None = None, overhead: float | None = None):
    """(candidate, evaluation) of the unsaid-settings rule: the fastest that fits; if none fits, the fastest (a
    per-step constant does not change the choice)."""
    model = cost_model(case, ceiling, overhead)
    best = None
    for cand in case.candidates:
        if model.validity_reasons(cand):
            continue
        ev = model.evaluate(cand)
        key = (not ev.fits, ev.step_time_s)
        if best is None or key < best[0]:
            best = (key, cand, ev)
    return (best[1], best[2]) if best else (None, None)


def measured(case: Case, cand: Candidate, ev) -> tuple[float, str] | None:
    model_flops = ev.model_tflops_per_gpu * 1e12 * ev.step_time_s * cand.world_size
    hw_flops = ev.hardware_tflops_per_gpu * 1e12 * ev.step_time_s * cand.world_size
    return P.measured_step_s(case.run, model_flops, hw_flops, peak_tflops(case.request.topology.device, "bf16"))


def naive_step_s(case: Case) -> float:
    """6 * P * tokens / (GPUs * 0.5 * bf16 peak), P the active parameters: the estimate every planner should beat."""
    params = counting.active_params(case.request.model)
    tokens = case.request.global_batch_size * case.request.seq_len
    return 6 * params * tokens / (case.request.gpus * 0.5 * peak_tflops(case.request.topology.device, "bf16") * 1e12)


def evaluate_case(case: Case, ceiling: float | None = None, overhead: float | None = None) -> dict | None:
    cand, ev = choose(case, ceiling, overhead)
    if cand is None:
        return None
    meas = measured(case, cand, ev)
    if meas is None:
        return None
    step, basis = meas
    return dict(run=case.run["id"], source=case.source, stack=case.stack, family=case.family, cand=cand,
                predicted_s=ev.step_time_s, measured_s=step, basis=basis, error=ev.step_time_s / step - 1, fits=ev.fits,
                peak_gib=ev.peak_bytes / 2**30, why="; ".join(ev.reasons)[:160])


def implied(case: Case, row: dict, overhead: float | None = None) -> float:
    """The GEMM ceiling at which the model (with the per-step loop overhead given, else the shipped one)
    reproduces the run's measured step time (its chosen settings)."""
    cand = row["cand"]

    def tflops(c: float) -> float:
        return 1.0 / cost_model(case, c, overhead).evaluate(cand).step_time_s

    return implied_ceiling(tflops, 1.0 / row["measured_s"])


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


def read_runs(path: Path) -> list[dict]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    return raw["runs"] if isinstance(raw, dict) else raw


def load(path: Path, only: str | None = None, overrides: dict | None = None, without_source: str | None = None,
         off: tuple[str, ...] = ()) -> tuple[list[Case], list[tuple[str, str]]]:
    cases, skipped = [], []
    for run in read_runs(path):
        if only and only not in run["id"] or without_source and P.source_of(run) == without_source:
            continue
        why = P.skip_reason(run)
        if why:
            skipped.append((run["id"], why))
            continue
        try:
            cases.append(build_case(run, overrides, off))
        except Exception as error:  # noqa: BLE001 - a run the conversion cannot express is reported, not fatal
            skipped.append((run["id"], f"no valid candidate (conversion failed: {type(error).__name__}: {error})"[:200]))
    return cases, skipped


class Overheads:
    """The per-step loop overhead (calibration.yaml `loop`) derived jointly with the GEMM ceilings: for each value
    of STEP_OVERHEAD_GRID_S, every run's implied ceiling under it, the ceilings derived from them (derive), and the
    runs' errors at their cell's ceiling; the value with the least median |error| wins. `without` leaves one
    source out of all of it (its leave-one-source-out value). A per-step constant does not move the unsaid-settings
    choice, so a prediction under overhead o is the one under 0 plus o."""

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
        return min(STEP_OVERHEAD_GRID_S, key=lambda o: (statistics.median(abs(e) for e in self.errors(o, without).values()), o))


def run_all(path: Path = RUNS_FILE, only: str | None = None, *, overrides: dict | None = None,
            without_source: str | None = None, baselines: bool = True, off: tuple[str, ...] = ()) -> dict:
    """Every run evaluated with the shipped calibration and leave-one-source-out; `overrides` switch profile facts
    off (an ablation), `without_source` leaves a source out of everything, `baselines` adds llm-analysis."""
    cases, skipped = load(path, only, overrides, without_source, off)
    rows, by_id = [], {}
    for case in cases:
        try:
            row = evaluate_case(case)
        except Exception as error:  # noqa: BLE001 - e.g. a configuration the cost model refuses as bad input
            skipped.append((case.run["id"], f"no valid candidate (cost model: {type(error).__name__}: {error})"[:200]))
            continue
        if row is None:
            skipped.append((case.run["id"], "no valid candidate"))
            continue
        row["naive_error"] = naive_step_s(case) / row["measured_s"] - 1
        if baselines and llm_analysis_baseline.available():
            other = llm_analysis_baseline.step_s(case.request, row["cand"])
            row["llm_analysis_error"] = other / row["measured_s"] - 1 if other else float("nan")
        req = case.request
        shape = json.dumps(req.model.model_dump(mode="json", exclude={"name"}), sort_keys=True)
        row["setting"] = (case.source, shape, req.gpus, req.topology.device.name, req.seq_len)
        row["tokens"] = req.global_batch_size * req.seq_len
        row["arch"] = json.dumps(req.model.model_dump(mode="json", exclude={"name", "seq_len"}), sort_keys=True)
        row.update(moe=req.model.moe is not None, device=req.topology.device.name, gpus=req.gpus)
        rows.append(row)
        by_id[row["run"]] = case
    overheads = Overheads(rows, by_id)
    loso_overheads = {}
    for source in sorted({r["source"] for r in rows}):
        o = loso_overheads[source] = overheads.best(without=source)
        derived = derive(rows, overheads.ceilings(o), without_source=source)
        for r in rows:
            if r["source"] != source:
                continue
            c = lookup(derived, r["family"], r["stack"])  # None (no other source on the family): calibration.yaml's
            r["loso_error"] = overheads.predicted(r["run"], c, o) / r["measured_s"] - 1
            r["loso_ceiling"] = c
    overhead = overheads.best()
    ceilings = overheads.ceilings(overhead)
    return dict(rows=rows, skipped=skipped, ceilings=ceilings, derived=derive(rows, ceilings), step_overhead_s=overhead,
                loso_step_overhead_s=loso_overheads, published=len(cases) + 0, path=path)


def summary(values: list[float]) -> str:
    a = [abs(v) for v in values if v == v]
    if not a:
        return "-"
    return f"n={len(a):3d} median {statistics.median(a):6.1%} max {max(a):6.1%}"


def render(result: dict, *, quiet: bool = False) -> str:
    rows = result["rows"]
    lines = []
    if not quiet:
        lines.append(f"{'run':44} {'stack':13} {'basis':16} {'meas s':>8} {'pred s':>8} {'err':>7} {'loso':>7} {'naive':>7} fits  settings")
        for r in rows:
            c = r["cand"]
            desc = f"dp{c.dp} tp{c.tp} pp{c.pp} vpp{c.vpp} z{c.zero_stage} mbs{c.microbatch_size} {c.recompute}{' sp' if c.sp else ''}"
            lines.append(f"{r['run'][:44]:44} {r['stack']:13} {r['basis'][:16]:16} {r['measured_s']:8.2f} {r['predicted_s']:8.2f} "
                         f"{r['error']:+7.1%} {r['loso_error']:+7.1%} {r['naive_error']:+7.1%} {'yes' if r['fits'] else 'NO':4}  {desc}")
    lines.append("")
    lines.append(f"{'source':48} {'shipped':>34} {'leave-one-source-out':>34} {'naive (same runs)':>34}")
    for source in sorted({r["source"] for r in rows}):
        sub = [r for r in rows if r["source"] == source]
        lines.append(f"{source:48} {summary([r['error'] for r in sub]):>34} {summary([r['loso_error'] for r in sub]):>34} "
                     f"{summary([r['naive_error'] for r in sub]):>34}")
    lines.append(f"{'OVERALL':48} {summary([r['error'] for r in rows]):>34} {summary([r['loso_error'] for r in rows]):>34} "
                 f"{summary([r['naive_error'] for r in rows]):>34}")
    lines.append(f"{'OVERALL, each source weighted once':48} {'':>34} {V.fmt_headline(V.headline(rows))}")
    if result.get("without_largest"):
        name, other = result["without_largest"]
        lines.append(f"{'without the largest source (' + name[:18] + ')':48} {'':>34} {V.fmt_headline(V.headline(other['rows']))}")
    lines.append("(weighted: each run weighs 1/n of its source's n runs, the weighted median; the median of the sources' "
                 f"medians is {V.per_source_weighted(rows)[1]:.1%})")
    lines.append(llm_analysis_line(rows))
    evaluable = len(rows) + sum(1 for _, why in result["skipped"] if why.startswith("no valid candidate"))
    with_tp = len(rows) + sum(1 for _, why in result["skipped"]
                              if why not in ("no throughput published", "no topology preset for this GPU"))
    lines.append(f"evaluated {len(rows)} of {with_tp} runs with a published throughput ({len(rows) / max(with_tp, 1):.0%}); "
                 f"{evaluable - len(rows)} without a valid candidate")
    oom = [r for r in rows if not r["fits"]]
    lines.append(f"false OOM (ran, predicted not to fit at its settings): {len(oom)}" + "".join(f"\n  {r['run']}: {r['why']}" for r in oom))
    lines += [published_oom_line(*item, path=result.get("path", RUNS_FILE)) for item in PUBLISHED_OOMS
              if any(r["run"] == item[0] for r in rows)]
    lines.append("ceilings (median implied, per device family x stack): " + ", ".join(
        f"{f}/{s}={v:.3f}" for (f, s), v in sorted(result["derived"].items())))
    lines.append(f"per-step loop overhead (derived, calibration.yaml loop): {result['step_overhead_s']:.3f} s; each source "
                 "held out: " + ", ".join(f"{s[:24]} {o:.3f}" for s, o in sorted(result["loso_step_overhead_s"].items())))
    lines.append("error bands (90th percentile |LOSO error|): " + ", ".join(
        f"{f}/{s}={v:.1%}" for (f, s), v in sorted(error_bands(rows).items())))
    (right, total), (naive_right, _) = ranking_pairs(rows), ranking_pairs(rows, "naive_error")
    lines.append(f"ranking: {right} of {total} pairs of configurations of one model on one cluster ordered as measured "
                 f"(leave-one-source-out; naive estimate {naive_right} of {total})")
    lines.append("ranking bands (median error moving within a source, planner.search.practice): " + ", ".join(
        f"{f}/{s}={v:.1%}" for (f, s), v in sorted(ranking_bands(rows).items())))
    lines += V.render_ranking(rows)
    if result.get("ablations") is not None:
        lines += V.render_ablations(V.headline(rows), result["ablations"])
    lines += [f"skipped {name}: {why}" for name, why in result["skipped"]]
    return "\n".join(lines)


def llm_analysis_line(rows: list[dict]) -> str:
    """llm-analysis at 0.5 FLOP efficiency beside the planner (leave-one-source-out) and the naive estimate, on the
    runs llm-analysis can express (benchmarks/llm_analysis_baseline.py), or how to install it."""
    if not llm_analysis_baseline.available():
        return ("llm-analysis: not installed (pip install --no-deps llm-analysis==0.2.2 'fire>=0.5,<0.6' termcolor six for its column; "
                "benchmarks/llm_analysis_baseline.py)")
    same = [r for r in rows if r.get("llm_analysis_error", float("nan")) == r.get("llm_analysis_error")]
    return (f"llm-analysis (0.5 efficiency) on the {len(same)} runs it expresses: {summary([r['llm_analysis_error'] for r in same])}; "
            f"planner leave-one-source-out on them: {summary([r['loso_error'] for r in same])}; "
            f"naive: {summary([r['naive_error'] for r in same])}")


def published_oom(run_id: str, gpus: int, microbatch_size: int,
                  path: Path = RUNS_FILE) -> tuple[Evaluation, Evaluation, int]:
    """(evaluation at `gpus` and `microbatch_size`, evaluation of the run itself, the run's GPU count): the run's
    chosen settings moved to `gpus` GPUs and that micro-batch size, the number of micro-batches kept, as the source
    describes its out-of-memory configuration."""
    run = next(r for r in read_runs(path) if r["id"] == run_id)
    case = build_case(run)
    cand, ev = choose(case)
    per_gpu = case.request.global_batch_size // case.request.gpus * microbatch_size // cand.microbatch_size
    topology = case.request.topology.model_copy(update={"num_nodes": -(-gpus // case.request.topology.gpus_per_node)})
    request = case.request.model_copy(update={"gpus": gpus, "global_batch_size": per_gpu * gpus, "topology": topology})
    scale = gpus / case.request.gpus
    failed = CostModel(request, calibration=cost_model(case, None).cal, options=options(case, request)).evaluate(
        dataclasses.replace(cand, dp=int(cand.dp * scale), microbatch_size=microbatch_size))
    return failed, ev, case.request.gpus


def published_oom_line(run_id: str, gpus: int, microbatch_size: int, quote: str, path: Path = RUNS_FILE) -> str:
    """Whether the model flags a published out-of-memory configuration (published_oom)."""
    failed, ev, run_gpus = published_oom(run_id, gpus, microbatch_size, path)
    verdict = "flagged" if not failed.fits else "NOT flagged"
    return (f"published OOM {run_id} at {gpus} GPUs, micro-batch {microbatch_size}: "
            f"predicted {failed.peak_bytes / 2**30:.1f} of "
            f"{failed.capacity_bytes / 2**30:.1f} GiB ({verdict}; the run itself at {run_gpus} GPUs: "
            f"{ev.peak_bytes / 2**30:.1f} GiB); {quote}")


def ranking_pairs(rows: list[dict], key: str = "loso_error", tie: float = 0.02) -> tuple[int, int]:
    """(ordered as measured, pairs): pairs of runs of one source, model, GPU count, device and sequence length
    whose measured time per token differs by more than `tie`, ordered by the prediction (`key`: its error) as they
    were measured. What a planner must get right to choose among configurations (the BLOOM layout sweep of the
    issue is not among the visible runs; these are the visible sweeps: recompute modes, ZeRO-3 vs 3D, micro-batch
    and sequence length variants)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        if r[key] == r[key]:
            groups[r["setting"]].append(r)
    right = total = 0
    for runs in groups.values():
        for a, b in itertools.combinations(runs, 2):
            meas_a, meas_b = a["measured_s"] / a["tokens"], b["measured_s"] / b["tokens"]
            if abs(meas_a / meas_b - 1) <= tie:
                continue
            pred_a, pred_b = meas_a * (1 + a[key]), meas_b * (1 + b[key])
            total += 1
            right += (pred_a < pred_b) == (meas_a < meas_b)
    return right, total


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


def derive_fixed_point(path: Path, rounds: int = 4) -> dict:
    """Derive the stack ceilings, write them, and re-derive under them until they no longer change."""
    from planner.cost import calibration

    result = None
    for _ in range(rounds):
        calibration.reload()
        result = run_all(path)
        before = CALIBRATION_FILE.read_text(encoding="utf-8")
        if write_ceilings(result["derived"], bands=error_bands(result["rows"]), ranking=ranking_bands(result["rows"]),
                          overhead=result["step_overhead_s"]) == before:
            break
    calibration.reload()
    return run_all(path)


def with_extras(result: dict, path: Path) -> dict:
    """The run set without its largest source (everything re-derived without it), and the ablation table."""
    sizes = defaultdict(int)
    for r in result["rows"]:
        sizes[r["source"]] += 1
    largest = max(sizes, key=lambda s: (sizes[s], s))
    result["without_largest"] = (largest, run_all(path, without_source=largest, baselines=False))
    table = []
    for label, field, value in V.ABLATIONS:
        if field in P.READING_RULES:  # a conversion rule switched off
            table.append((label, {"reading rule": {}}, V.headline(run_all(path, off=(field,), baselines=False)["rows"])))
            continue
        overrides = V.ablation_overrides(field, value)
        other = run_all(path, overrides=overrides, baselines=False) if overrides else result
        table.append((label, overrides, V.headline(other["rows"])))
    result["ablations"] = table
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=RUNS_FILE)
    parser.add_argument("--only")
    parser.add_argument("--quiet", action="store_true")
    parser.add_argument("--derive", action="store_true", help="rewrite calibration.yaml's stack_ceilings from the runs")
    parser.add_argument("--no-ablations", action="store_true", help="skip the ablation table and the without-largest run")
    args = parser.parse_args(argv)
    result = derive_fixed_point(args.runs) if args.derive else run_all(args.runs, args.only)
    if not args.no_ablations:
        result = with_extras(result, args.runs)
    print(render(result, quiet=args.quiet))
    return 0


if __name__ == "__main__":
    sys.exit(main())
