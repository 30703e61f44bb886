"""One published run converted and evaluated (benchmarks/accuracy.py): the run's request and the candidates its
unsaid settings allow (benchmarks/published_runs.py), the unsaid-settings rule (the fastest that fits), the measured
step time, the naive 6PT estimate, the GEMM ceiling implied by the measurement, and a published out-of-memory
configuration re-evaluated.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import published_runs as P
from published_grad_accumulation import grad_accumulation_of

from planner.cost.calibration import device_calibration
from planner.cost.compute import peak_tflops
from planner.cost.derivation import implied_ceiling
from planner.cost.evaluate import Evaluation
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import options_for
from planner.frameworks import load_framework
from planner.frameworks_split import balanced_split, compact
from planner.models import counting
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import PlanRequest
from planner.search.refine_uneven import tried_splits

RUNS_FILE = Path(__file__).resolve().parents[1] / "validation" / "published_runs.json"


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
    full_every: int | None = None  # every n-th decoder layer fully recomputed (published_runs.layer_checkpoint_every)
    plan_split: bool = True  # an unsaid pipeline split is the planner's (reading rule split_unstated_is_planned)
    profile: FrameworkProfile | None = None  # the request's stack profile, read once per run


def read_runs(path: Path) -> list[dict]:
    raw = json.loads(path.read_text(encoding="utf-8"))
    return raw["runs"] if isinstance(raw, dict) else raw


def evaluate(model: CostModel, case: Case, cand: Candidate, stage_layers: tuple[int, ...] | None = None):
    """model.evaluate(cand) with the split given (None: balanced), every case.full_every-th layer of each virtual
    stage fully recomputed."""
    if not case.full_every:
        return model.evaluate(cand, stage_layers=stage_layers)
    stages = cand.pp * cand.vpp
    per_stage = case.request.model.num_layers // stages
    return model.evaluate(cand, full_recompute_layers=(per_stage // case.full_every,) * stages)


def build_case(run: dict, overrides: dict | None = None, off: tuple[str, ...] = ()) -> Case | None:
    """The run converted; `overrides` ({stack: {CostOptions field: value}}) switches a stack's profile facts off
    for every run of that stack (accuracy_views.ABLATIONS)."""
    stack = P.stack_of(run)
    spec, topo = P.model_spec(run, off), P.topology(run)
    request = PlanRequest(model=spec, topology=topo, gpus=run["parallel"]["num_gpus"], global_batch_size=P.global_batch(run),
                          seq_len=spec.seq_len, precision=P.precision_of(run),
                          framework=P.profile_of(run, stack))
    s = P.settings(run, stack, off)
    keys = list(s.choices)
    candidates = []
    for values in itertools.product(*(s.choices[k] for k in keys)):
        f = dict(s.fixed, **dict(zip(keys, values)))
        if f["recompute"] != "selective":  # a recipe's modules name what its selective reruns
            f.pop("recompute_modules", None)
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
    flavours = P.cp_flavour_of(run, stack, off)
    fixed = {"cp_flavours": flavours} if flavours else {}
    recipe = P.recipe_bytes_of(run, request.precision, off)
    if recipe is not None:
        fixed["recipe_bytes"] = recipe
    fixed.update(P.moe_overrides_of(run, stack, request.precision, off))
    fixed.update(grad_accumulation_of(run, stack, off))
    eager = P.eager_ops_of(run, off)
    if eager is not None:
        fixed["eager_ops"] = eager
    return Case(run, stack, P.device_family(run), P.source_of(run), request, candidates,
                {**fixed, **(overrides or {}).get(stack, {})}, s.full_every, "split_unstated_is_planned" not in off,
                load_framework(request.framework))


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
        ev = evaluate(model, case, cand)
        key = (not ev.fits, ev.step_time_s)
        if best is None or key < best[0]:
            best = (key, cand, ev)
    if best is None:
        return None, None
    return best[1], planned_split(model, case, best[1], best[2])


def planned_split(model: CostModel, case: Case, cand: Candidate, ev):
    """The reading rule for a pipeline split no source states (`split_unstated_is_planned`). Where the decoder
    layers and MTP layers divide evenly over the pp x vpp stages, the even split every stack builds by default
    (Megatron get_num_layers_to_build, num_layers // pp; torchtitan's equal stages; Megatron-DeepSpeed's GPTModelPipe
    partition_method "type:transformer"), which the cost prices when given none. Otherwise a run had to choose an
    uneven split and did not say which: the split the planner's search gives the chosen settings
    (planner.search.refine_uneven.tried_splits, the splits the search tries: the stage-partition DP for vpp = 1, the
    stack's uneven first/last and embedding/loss forms for vpp > 1), kept where it fits and is predicted faster
    (the search ranks by rank_key, which also weighs memory and the stack's practice; here only the step is read). Layer-wise checkpointing
    (case.full_every) keeps the balanced split."""
    stages = cand.pp * cand.vpp
    spec = case.request.model
    if cand.pp == 1 or case.full_every or not case.plan_split or not (spec.num_layers + spec.mtp_num_layers) % stages:
        return ev
    best = ev
    for split in tried_splits(model, cand, case.profile):
        other = model.evaluate(cand, stage_layers=tuple(split))
        if other.fits and (not best.fits or other.step_time_s < best.step_time_s):
            best = other
    return best


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
                split=ev.stage_layers, planned=planned_note(case, ev.stage_layers), full_every=case.full_every,
                predicted_s=ev.step_time_s, measured_s=step, basis=basis, error=ev.step_time_s / step - 1, fits=ev.fits,
                peak_gib=ev.peak_bytes / 2**30, why="; ".join(ev.reasons)[:160])


def planned_note(case: Case, split: tuple[int, ...]) -> str:
    """The split in --stage-layers spelling where it is not the balanced one the cost prices by default, else ""."""
    balanced = balanced_split(case.request.model.num_layers, len(split), last_slots=case.request.model.mtp_num_layers)
    return "" if tuple(split) == balanced else compact(split)


def implied(case: Case, row: dict, overhead: float | None = None) -> float:
    """The GEMM ceiling at which the model (with the per-step loop overhead given, else the shipped one)
    reproduces the run's measured step time (its chosen settings)."""
    cand, split = row["cand"], row["split"]

    def tflops(c: float) -> float:
        return 1.0 / evaluate(cost_model(case, c, overhead), case, cand, split).step_time_s

    return implied_ceiling(tflops, 1.0 / row["measured_s"])


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
    failed = evaluate(CostModel(request, calibration=cost_model(case, None).cal, options=options(case, request)), case,
                      dataclasses.replace(cand, dp=int(cand.dp * scale), microbatch_size=microbatch_size))
    return failed, ev, case.request.gpus
