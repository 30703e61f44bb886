"""The library façade: the CLI and the HTTP service both call these functions and nothing deeper.

Each function validates its input, delegates to one module, and returns a typed object.
Heavy modules (torch, pulp, fastapi) are imported inside the functions that need them. The catalog of what ships
(load_model, load_topology, load_framework, the preset lists, rows and reports) lives in planner.api_catalog and is
offered here under the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from planner.api_catalog import (list_frameworks, list_presets, list_topologies, load_framework,  # noqa: F401
                                 load_model, load_topology, model_report, model_rows, model_types, topology_report,
                                 topology_rows)
from planner.errors import BadInputError

if TYPE_CHECKING:  # the schemas (pydantic) load where a function needs them: `planner models list` stays light
    from planner.schemas.model import ModelSpec
    from planner.schemas.plan import Configuration, LaunchPlan, PlanRequest, Precision, SearchLimits
    from planner.schemas.topology import Topology

DEFAULT_TOKENS_PER_STEP = 4 * 2**20  # ~4M tokens per optimizer step, as GPT-3 / Llama-3 class runs use
DEFAULT_MODEL = "llama3-8b"
DEFAULT_TOPOLOGY = "dgx-h100"
DEFAULT_FRAMEWORK = "planner"  # our executor: a default plan is always runnable by `planner run`

ProgressFn = Callable[[int, int], None]


def default_global_batch_size(seq_len: int) -> int:
    """About 4M tokens per step, at least one sequence."""
    return max(1, DEFAULT_TOKENS_PER_STEP // seq_len)


def build_request(
    *,
    model: str | ModelSpec = DEFAULT_MODEL,
    topology: str | Topology = DEFAULT_TOPOLOGY,
    nodes: int | None = None,
    gpus: int | None = None,
    global_batch_size: int | None = None,
    seq_len: int | None = None,
    precision: Precision = "bf16",
    profile: str | None = None,
    search: SearchLimits | None = None,
    framework: str = DEFAULT_FRAMEWORK,
    calibration: str | Path | None = None,
    moe: dict[str, float] | None = None,
) -> PlanRequest:
    """Resolve names into a self-contained PlanRequest (model and topology inline); `framework` is the stack that
    will run the plan (a shipped profile name or a profile file), checked here so a typo fails before the search.
    `moe`: MoESpec fields set on the model (routing_skew, capacity_factor; with_moe_fields)."""
    from pydantic import ValidationError

    from planner.frameworks import model_refusal
    from planner.io import is_file
    from planner.schemas.model import ModelSpec
    from planner.schemas.plan import PlanRequest
    from planner.schemas.topology import Topology

    spec = with_moe_fields(model if isinstance(model, ModelSpec) else load_model(model), moe or {})
    topo = topology if isinstance(topology, Topology) else load_topology(topology, nodes=nodes, gpus=gpus)
    world = gpus if gpus is not None else topo.num_gpus
    if world > topo.num_gpus:
        raise BadInputError(
            f"gpus={world} exceeds the {topo.num_gpus} GPUs of topology {topo.name!r} "
            f"({topo.num_nodes} nodes x {topo.gpus_per_node}): pass --nodes {-(-world // topo.gpus_per_node)} or fewer --gpus"
        )
    length = seq_len if seq_len is not None else spec.seq_len
    batch = global_batch_size if global_batch_size is not None else default_global_batch_size(length)
    if profile is not None and not is_file(profile):
        raise BadInputError(f"profile={profile!r}: file not found: run `planner profile -o {profile}` or fix the path")
    _check_precision(precision, topo)
    refused = model_refusal(load_framework(framework), spec)
    if refused is not None:
        raise BadInputError(refused)
    overlay = _calibration_for(calibration, topo, framework)
    try:
        return PlanRequest(framework=framework, model=spec, topology=topo, gpus=world, global_batch_size=batch,
                           seq_len=length, precision=precision, profile=profile, search=search, calibration=overlay)
    except ValidationError as exc:
        from planner.io import format_validation_error

        raise BadInputError(format_validation_error(exc, "request")) from None


def with_moe_fields(spec: ModelSpec, fields: dict[str, float]) -> ModelSpec:
    """`spec` with the given MoESpec fields (None values left out): the expert load a user plans for
    (`--routing-skew`: the slowest EP rank receives 1 + skew times the mean; `--capacity-factor`: tokens past it
    dropped), checked as the model spec checks them."""
    from pydantic import ValidationError

    from planner.io import format_validation_error
    from planner.schemas.model import MoESpec

    fields = {name: value for name, value in fields.items() if value is not None}
    if not fields:
        return spec
    if spec.moe is None:
        flags = ", ".join("--" + name.replace("_", "-") for name in fields)
        raise BadInputError(f"{flags} given for {spec.name}, which has no experts: leave them out or pick an MoE model")
    try:
        moe = MoESpec.model_validate({**spec.moe.model_dump(), **fields})
    except ValidationError as exc:
        raise BadInputError(format_validation_error(exc, "model.moe")) from None
    return spec.model_copy(update={"moe": moe})


def _calibration_for(path: str | Path | None, topology: Topology, framework: str):
    """The overlay of --calibration FILE, refused in one line when it was derived for another GPU family or stack."""
    if path is None:
        return None
    from planner.cost.overlay import overlay_mismatch

    overlay = load_calibration(path)
    why = overlay_mismatch(overlay, topology.device, framework)
    if why:
        raise BadInputError(f"{path}: {why}")
    return overlay


def _check_precision(precision: str, topology: Topology) -> None:
    """fp8 needs fp8 tensor cores: a device without a peak_fp8_tflops would be priced as bf16, silently."""
    if precision == "fp8" and topology.device.peak_fp8_tflops is None:
        raise BadInputError(f"precision='fp8': {topology.device.name} has no fp8 tensor cores (no peak_fp8_tflops in topology "
                            f"{topology.name!r}): use --precision bf16, or a device with fp8 (H100, H200, B200)")


def compression(text: str, topology: Topology, *, auto: bool = False):
    """A `--compression` value as a Compression (planner.schemas.compression): `none`, `zeropp`, a comma list such
    as `qwz,hpz,powersgd:4`; `auto` (the search's choice per configuration) where `auto` is allowed. hpz without a
    size spans a node (at most the data-parallel ranks on it)."""
    from planner.schemas.compression import parse_compression

    if text.strip().lower() == "auto":
        if not auto:
            raise BadInputError("--compression=auto: estimate prices one configuration; name the methods "
                                "(e.g. --compression qwz,hpz) or use `planner plan --compression auto`")
        return "auto"
    try:
        return parse_compression(text, node_ranks=topology.gpus_per_node)
    except ValueError as exc:
        raise BadInputError(f"--compression={text!r}: {str(exc).splitlines()[0]}") from None


def estimate(request: PlanRequest, config: Configuration, *, trace_memory: bool = False) -> LaunchPlan:
    """Evaluate one fully given configuration; an infeasible one comes back with feasible=False and reasons.
    `trace_memory`: also trace the executor's step for its memory (planner.memory_trace; memory.traced)."""
    from planner.estimate import estimate as _estimate

    result = _estimate(request, config, framework=load_framework(request.framework))  # the one read of its profile
    if trace_memory:
        from planner.memory_trace import trace_memory as _trace, with_trace

        result = with_trace(result, _trace(result))
    return result


def plan(request: PlanRequest, *, progress: ProgressFn | None = None, trace_memory: bool | None = False) -> LaunchPlan:
    """Search the whole plan space for the fastest configuration that fits. `trace_memory`: verify the chosen plan
    and its alternatives by tracing the executor's step, replacing a plan that does not fit by trace
    (planner.memory_trace); None: only for the `planner` stack (what `planner plan` does by default)."""
    from planner.search.entry import plan as _plan

    framework = load_framework(request.framework)  # the request's profile, read once and handed down
    result = _plan(request, progress=progress, framework=framework)
    if trace_memory is None:
        from planner.memory_trace import EXECUTOR_FRAMEWORK

        trace_memory = request.framework == EXECUTOR_FRAMEWORK
    if trace_memory:
        from planner.memory_trace import verify_searched

        result = verify_searched(result, lambda wider: _plan(wider, framework=framework))
    return result


def _plan_of(plan: LaunchPlan | str | Path) -> LaunchPlan:
    """A LaunchPlan object, or one loaded from a plan JSON file; either way validated in full: the schema and the
    invariants the search guarantees (planner.plan_invariants) and its numbers re-derived from its own request
    (planner.plan_verify), so a hand-edited plan is refused, not used."""
    from planner.plan_verify import verify_plan
    from planner.schemas.plan import LaunchPlan

    if isinstance(plan, LaunchPlan):
        return verify_plan(plan)
    from planner.io import load_file

    return verify_plan(load_file(LaunchPlan, plan), source=str(plan))


def check(target: str | Path, *, tolerance: float = 0.02, allow_change: bool = False, progress: ProgressFn | None = None):
    """Recompute every committed plan under `target` and compare (planner.check.CheckReport)."""
    from planner.check import check_plans

    return check_plans(target, tolerance=tolerance, allow_change=allow_change, progress=progress)


def check_report(report) -> dict:
    """A CheckReport as the plain dict `planner check --json` prints (planner.check.report_dict)."""
    from planner.check import report_dict

    return report_dict(report)


def stage_rank(stage: int, *, pp: int, schedule: str) -> int:
    """The pipeline rank holding virtual stage `stage` under `schedule` (the cost model's placement, looped or V)."""
    from planner.schedules import schedule as schedule_of

    return schedule_of(schedule).stage_rank(stage, pp=pp)


def megatron_split(num_layers: int, pp: int, vpp: int, *, first: int | None, last: int | None) -> tuple[int, ...]:
    """Decoder layers per virtual stage with the first/last pipeline rank's layers given (Megatron-Core's
    --decoder-first/last-pipeline-num-layers rule, planner.frameworks_split.megatron_split); a split the rule refuses
    raises BadInputError with the rule's one-line reason."""
    from planner.frameworks_split import SplitError
    from planner.frameworks_split import megatron_split as _split

    try:
        return _split(num_layers, pp, vpp, first=first, last=last)
    except SplitError as exc:
        raise BadInputError(str(exc)) from None


def export(plan: LaunchPlan | str | Path, target: str):
    """Translate a plan for torchtitan, megatron, deepspeed, torchrun or slurm (planner.export.Export)."""
    from planner.export import export_plan

    return export_plan(_plan_of(plan), target)


def explain(plan: LaunchPlan | str | Path, *, frameworks: list[str] | None = None):
    """A readable account of a plan (planner.explain.Explanation), judged against `frameworks` (None: every shipped one)."""
    from planner.explain import explain as _explain

    return _explain(_plan_of(plan), frameworks=frameworks)


def schema(name: str | None = None) -> dict:
    """JSON Schema of one file format (plan, model, topology, profile, request), or of all of them."""
    from planner.export.schema import json_schema

    return json_schema(name)


def calibrate(paths: list[str], *, topology: str | None = None, configs: list[str] = (), model: str | None = None,
              framework: str | None = None, gpus: int | None = None):
    """A calibration overlay (planner.schemas.calibration.CalibrationOverlay) derived from the user's measured runs:
    Megatron-LM / torchtitan logs or a JSON of runs (planner.calibrate)."""
    from planner.calibrate import calibrate as _calibrate

    return _calibrate(paths, topology=topology, configs=configs, model=model, framework=framework, gpus=gpus)


def load_calibration(path: str | Path):
    """A calibration overlay file written by `planner calibrate`, validated (one-line errors naming the field)."""
    from planner.io import load_file
    from planner.schemas.calibration import CalibrationOverlay

    return load_file(CalibrationOverlay, path)


def version_info() -> dict[str, str]:
    """The package version and where its data comes from (planner.resources.provenance): the package folder,
    wheel or source tree, the git commit, the environment's folder overrides."""
    from planner import __version__
    from planner.resources import provenance

    return {"version": __version__} | provenance()


def run_options(**flags):
    """The options of an executor run (planner.launch_spec.options.RunOptions), checked: bad values raise BadInputError."""
    from planner.launch_spec.options import RunOptions

    return RunOptions(**flags)


def run(plan: LaunchPlan | str | Path, *, options=None, report_path: str | Path | None = None, warmup_steps: int = 1):
    """Train the plan on this machine with torchrun and return the run report (planner.executor.report.RunReport)."""
    from planner.executor.run import run_plan
    from planner.launch_spec.options import RunOptions

    return run_plan(plan, options=options or RunOptions(), report_path=report_path, warmup_steps=warmup_steps)


def launch(plan: LaunchPlan | str | Path, *, hosts: str | None = None, master_port: int = 29500, options=None,
           time_limit: str = "04:00:00"):
    """Per-node torchrun commands and an sbatch script for the plan (planner.launch_spec.commands.LaunchScripts)."""
    from planner.launch_spec.commands import launch_scripts, parse_hosts
    from planner.schemas.plan import LaunchPlan

    plan_path = str(plan) if not isinstance(plan, LaunchPlan) else "plan.json"
    return launch_scripts(_plan_of(plan), plan_path=plan_path, hosts=parse_hosts(hosts), master_port=master_port,
                          options=options, time_limit=time_limit)


def launch_text(scripts) -> str:
    """What `planner launch` prints for LaunchScripts: each node's environment and command, then the sbatch script."""
    from planner.launch_spec.commands import render_text

    return render_text(scripts)


def profile_options(**fields):
    """Options of a layer profile (planner.profiling.options.ProfileOptions), checked."""
    from planner.profiling.options import ProfileOptions

    return ProfileOptions(**fields)


def int_list(text: str, *, name: str) -> tuple[int, ...]:
    """`1,2,4` -> (1, 2, 4); bad text raises BadInputError naming the flag `name` (planner.profiling.options)."""
    from planner.profiling.options import parse_int_list

    return parse_int_list(text, name=name)


def profile(spec: ModelSpec, opts, *, hf: bool = False, **kwargs):
    """Measure every layer type of `spec` (planner.profiling.measure.profile_model, or with `hf` the HuggingFace
    model's own modules, planner.profiling.measure_hf.profile_hf_model, which takes model_ref=); returns a Profile."""
    if hf:
        from planner.profiling.measure_hf import profile_hf_model as _run
    else:
        from planner.profiling.measure import profile_model as _run
    return _run(spec, opts, **kwargs)


def comm_benchmark(**kwargs):
    """Time collectives vs message size with local processes and fit latency + bandwidth
    (planner.profiling.comm_bench.run_comm_benchmark)."""
    from planner.profiling.comm_bench import run_comm_benchmark

    return run_comm_benchmark(**kwargs)


def preload() -> None:
    """Import the search now (the service's workers do this before capping their memory and taking requests)."""
    import planner.search.entry  # noqa: F401
