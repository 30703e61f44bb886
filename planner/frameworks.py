"""Framework profiles: loading the stack files under planner/data/frameworks/ and judging a configuration against one.

A reference is a shipped name (`planner framework list`) or a path to a profile YAML/JSON file. `refusal` is the
one judge of "can this stack run this configuration": the search prunes with it (counted under the rule's key),
`estimate` and the exporters refuse with its message, and the executor's pre-launch check uses it with the
`planner` profile. The rules themselves are data (planner.schemas.framework); this module only evaluates them.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from pathlib import Path

from planner.errors import BadInputError
from planner.frameworks_split import balanced_split, split_refusal
from planner.io import load_file, shipped_names
from planner.resources import ENV_OVERRIDES, data_dir
from planner.schedules import BY_NAME, DEFAULT, DUALPIPEV, ONE_F_ONE_B
from planner.schemas.compression import NONE
from planner.schemas.dims import ParallelDims
from planner.schemas.framework import FrameworkProfile
from planner.models.features import describe, has_feature
from planner.schemas.model import ModelSpec
from planner.schemas.plan import LaunchPlan

FRAMEWORKS_ENV = ENV_OVERRIDES["frameworks"]
PROFILE_SUFFIX = ".yaml"


def frameworks_dir() -> Path:
    """The folder of shipped profiles: $PLANNER_FRAMEWORKS if set, else planner/data/frameworks in the package."""
    return data_dir("frameworks")


def list_frameworks() -> list[str]:
    return shipped_names(frameworks_dir(), PROFILE_SUFFIX)


def load_framework(ref: str) -> FrameworkProfile:
    """A shipped profile by name, or a profile file; unknown names get the list and a close match.

    Read from its file at each call, kept nowhere: a request's profile is resolved once where the request enters
    (planner.api; the search, the cost model, estimate and the exporters' entries) and the object is handed down."""
    preset = frameworks_dir() / f"{ref}{PROFILE_SUFFIX}"
    if preset.is_file():
        return load_file(FrameworkProfile, preset)
    path = Path(ref).expanduser()
    if ref.endswith((".yaml", ".yml", ".json")) and path.is_file():
        return load_file(FrameworkProfile, path)
    names = list_frameworks()
    close = difflib.get_close_matches(ref.lower(), names, n=2, cutoff=0.5)
    if Path(ref).stem in names:  # an old path, frameworks/NAME.yaml: the profiles are package data now
        close = [Path(ref).stem]
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise BadInputError(f"framework={ref!r} is unknown: {hint}choose one of {', '.join(names)} or a profile file path")


@dataclass(frozen=True, kw_only=True)
class Config(ParallelDims):
    """The plain fields a stack's rules read (no plan objects: the search passes numbers): the parallel degrees
    (a ParallelDims) and the per-plan choices the rules look at."""

    vpp: int = 1
    sp: bool = False
    zero_stage: int = 0
    schedule: str = DEFAULT.name
    recompute: str = "none"
    recompute_modules: tuple[str, ...] = ()  # Megatron-Core --recompute-modules names; () = the stack's selective
    tp_overlap: str = "none"
    is_moe: bool = False
    precision: str = "bf16"
    microbatch_size: int = 1
    tied_embeddings: bool = False  # the model ties its LM head to the input embedding
    num_microbatches: int = 0  # 0: not known (a factorisation or group probe); torch's micro-batch rules skip it
    compression: tuple[str, ...] = ()  # planner.schemas.compression methods


def config_of(cand, *, model: ModelSpec, precision: str) -> Config:
    """The Config of a cost-model Candidate (its degrees and the choices the rules read)."""
    return Config(**cand.as_dict(), vpp=cand.vpp, sp=cand.sp,
                  zero_stage=cand.zero_stage, schedule=cand.schedule, recompute=cand.recompute,
                  recompute_modules=getattr(cand, "recompute_modules", ()), tp_overlap=cand.tp_overlap,
                  is_moe=model.moe is not None, precision=precision, microbatch_size=cand.microbatch_size,
                  tied_embeddings=model.tied_embeddings,
                  num_microbatches=cand.num_microbatches, compression=getattr(cand, "compression", NONE).methods)


def plan_configs(plan: LaunchPlan) -> list[Config]:
    """A LaunchPlan as Configs, one per recompute mode its stages use (each must be runnable)."""
    par, spec = plan.parallelism, plan.request.model
    return [Config(**par.dims.as_dict(), vpp=par.vpp, sp=par.sp, zero_stage=par.zero_stage,
                   schedule=plan.schedule, recompute=mode, recompute_modules=plan.stages[0].recompute.modules if plan.stages else (),
                   tp_overlap=par.tp_overlap, is_moe=spec.moe is not None,
                   precision=plan.request.precision, microbatch_size=plan.batch.microbatch_size,
                   tied_embeddings=spec.tied_embeddings,
                   num_microbatches=plan.batch.num_microbatches, compression=par.compression.methods)
            for mode in sorted({s.recompute.mode for s in plan.stages} or {"none"})]


def torch_schedule_rule(class_name: str, *, pp: int, num_microbatches: int) -> str | None:
    """What torch.distributed.pipelining's schedule constructor raises for this count, or None.

    torch/distributed/pipelining/schedules.py: Schedule1F1B needs n_microbatches >= the number of stages;
    ScheduleInterleaved1F1B and ScheduleInterleavedZeroBubble (also with one stage per rank) need n_microbatches
    to be a multiple of their number of rounds, max(1, n_microbatches // pp)."""
    n = num_microbatches
    if pp == 1:
        return None
    if class_name in (ONE_F_ONE_B.executor_class, ONE_F_ONE_B.torchtitan_name) and n < pp:
        return f"{class_name} needs num_microbatches={n} >= the number of stages {pp}"
    if class_name in (DUALPIPEV.executor_class, DUALPIPEV.torchtitan_name) and n < 2 * pp:  # two stages per rank: 2 pp stages
        return f"schedule={DUALPIPEV.name} needs num_microbatches={n} >= pp*vpp={2 * pp} ({class_name}: at least one per stage)"
    if "Interleaved" in class_name:
        rounds = max(1, n // pp)
        if n % rounds:
            return (f"{class_name} requires num_microbatches={n} to be a multiple of its number of rounds "
                    f"max(1, num_microbatches // pp)={rounds}")
    return None


def _holds(actual, expected) -> bool:
    if isinstance(expected, list):
        return actual in expected
    if isinstance(expected, str) and expected[:1] in "<>" and expected[1:].isdigit():
        bound = int(expected[1:])
        return actual > bound if expected[0] == ">" else actual < bound
    return actual == expected


def precision_refusal(profile: FrameworkProfile, precision: str) -> str | None:
    """A precision the stack does not run; the reason of an exclusion on that precision alone, when it has one."""
    if precision not in profile.capabilities.precisions:
        why = next((f" ({rule.reason})" for rule in profile.capabilities.exclusions if rule.when == {"precision": precision}), "")
        return (f"precision={precision!r} is not run by framework {profile.name!r}{why}: choose one of "
                f"{list(profile.capabilities.precisions)} or another --framework")
    return None


def refusal(profile: FrameworkProfile, c: Config, *, allow_stale_weights: bool = True) -> tuple[str, str] | None:
    """(pruned key, message) of the first capability the configuration needs and the stack lacks; None if it runs."""
    caps, name, sched = profile.capabilities, profile.name, BY_NAME.get(c.schedule)
    if c.pp > 1 and c.schedule not in profile.schedule_names():
        what = f" ({sched.title}: two weight versions, one-step-stale updates)" if sched and sched.stale_weights else ""
        return "schedule_not_in_framework", (f"schedule={c.schedule!r}{what} is not run by framework {name!r}: choose one "
                                             f"of {list(profile.schedule_names())}")
    if sched and sched.stale_weights and c.pp > 1 and not allow_stale_weights:
        return "stale_weights_not_allowed", (f"schedule={c.schedule!r} ({sched.title}) trains with one-step-stale weights: "
                                             f"pass --allow-stale-weights (or --schedule {c.schedule}) to allow it")
    if caps.torch_pipelining and c.pp > 1 and c.num_microbatches and c.schedule in profile.schedule_names():
        rule = torch_schedule_rule(profile.native_schedule(c.schedule), pp=c.pp, num_microbatches=c.num_microbatches)
        if rule is not None:
            fix = (f"at least 2*pp={2 * c.pp}" if sched and sched.min_microbatches_is_stages else f"a multiple of pp={c.pp}") + " micro-batches"
            return "torch_schedule_microbatches", f"{rule} (framework {name!r}): choose a global batch that gives {fix}"
    if c.recompute not in caps.recompute.modes:
        return "recompute_not_in_framework", f"recompute={c.recompute!r} is not run by framework {name!r}: choose one of {list(caps.recompute.modes)}"
    modules = recompute_modules_refusal(profile, c.recompute_modules)
    if modules is not None:
        return modules
    zero_ok = caps.zero.stages_with_pp if c.pp > 1 else caps.zero.stages
    if c.zero_stage not in zero_ok:
        with_pp = " with pp > 1" if c.pp > 1 else ""
        return "zero_stage_not_in_framework", f"zero_stage={c.zero_stage} is not run by framework {name!r}{with_pp}: choose one of {list(zero_ok)}"
    if c.tp_overlap not in caps.tp_overlap:
        return "tp_overlap_not_in_framework", f"tp_overlap={c.tp_overlap!r} is not run by framework {name!r}: use {list(caps.tp_overlap)}"
    return (hsdp_refusal(profile, c) or compression_refusal(profile, c) or parallel_refusal(profile, c)
            or _exclusion(profile, c))


def recompute_modules_refusal(profile: FrameworkProfile, modules: tuple[str, ...]) -> tuple[str, str] | None:
    """Recompute modules the stack's selective does not take (capabilities.recompute.selective_modules), or None."""
    allowed = profile.capabilities.recompute.selective_modules
    unknown = [m for m in modules if m not in allowed]
    if not unknown:
        return None
    return "recompute_modules_not_in_framework", (f"recompute_modules={unknown} is not run by framework {profile.name!r}: "
                                                  f"its selective recompute takes {list(allowed)}, or no modules")


def hsdp_refusal(profile: FrameworkProfile, c: Config) -> tuple[str, str] | None:
    """HSDP (dp_replicate > 1) needs the stack's hybrid sharding (capabilities.zero.hsdp) and ZeRO-2/3 (FSDP
    shards); with experts (ep > 1) the planner prices no HSDP layout (how the experts' shards split over
    replicas differs per stack), so it is refused rather than guessed."""
    if c.dp_replicate <= 1:
        return None
    if c.dp % c.dp_replicate:
        return "hsdp_not_dividing_dp", f"dp_replicate={c.dp_replicate} must divide dp={c.dp}: choose a divisor of dp, or 1"
    if not profile.capabilities.zero.hsdp:
        return "hsdp_not_in_framework", (f"dp_replicate={c.dp_replicate}: framework {profile.name!r} has no hybrid sharding "
                                         f"(HSDP): use dp_replicate=1")
    if c.zero_stage not in (2, 3):  # the stack's own wording where its profile has the rule
        return _exclusion(profile, c) or ("hsdp_without_fsdp", (f"dp_replicate={c.dp_replicate} (HSDP) shards ZeRO-2/3 state within replicas: "
                                     f"zero_stage={c.zero_stage} has no shards; use zero_stage 2 or 3, or dp_replicate=1"))
    if c.ep > 1:
        return "hsdp_with_ep_not_priced", (f"dp_replicate={c.dp_replicate} (HSDP) with ep={c.ep}: the planner prices no "
                                           f"HSDP expert layout; use dp_replicate=1 or ep=1")
    return None


def compression_refusal(profile: FrameworkProfile, c: Config) -> tuple[str, str] | None:
    """A compression method the stack does not run at this ZeRO stage and pp (capabilities.compression), or one
    with nothing to compress (gradient and weight methods need dp > 1 or expert dp > 1, fp8 dispatch ep > 1)."""
    entries = {e.method: e for e in profile.capabilities.compression}
    for method in c.compression:
        entry = entries.get(method)
        if entry is None:
            runs = sorted(entries) or ["none"]
            return "compression_not_in_framework", (f"compression {method!r} is not run by framework {profile.name!r}: "
                                                    f"it runs {runs} (see `planner framework show {profile.name}`)")
        if c.zero_stage not in entry.zero_stages:
            return "compression_zero_stage", (f"compression {method!r} runs with zero_stage in {list(entry.zero_stages)} "
                                              f"in framework {profile.name!r}, not {c.zero_stage}: change one")
        if c.pp > 1 and not entry.with_pp:
            return "compression_with_pp", (f"compression {method!r} does not run with pp={c.pp} in framework "
                                           f"{profile.name!r} ({entry.source}): use pp=1 or drop it")
        if method == "fp8-dispatch" and c.ep <= 1:
            return "compression_without_ep", "compression 'fp8-dispatch' needs expert parallelism (ep > 1): drop it"
        if method != "fp8-dispatch" and c.dp_cp <= 1:
            return "compression_without_dp", f"compression {method!r} needs data parallelism (dp > 1): drop it"
    return None


GROUP_FIELDS = frozenset({"dp", "tp", "pp", "cp", "ep", "sp", "recompute", "tp_overlap", "is_moe", "precision",
                          "microbatch_size", "dp_replicate"})


def group_refusal(profile: FrameworkProfile, c: Config) -> tuple[str, str] | None:
    """The exclusions that read only a search group's fields (no ZeRO stage, schedule or vpp): they refuse every
    member of the group alike, so the search prunes the whole group before bounding it."""
    for rule in profile.capabilities.exclusions:
        if set(rule.when) <= GROUP_FIELDS and all(_holds(getattr(c, f), v) for f, v in rule.when.items()):
            return rule.key, _reason(profile, rule, c)
    return None


def parallel_refusal(profile: FrameworkProfile, c: Config) -> tuple[str, str] | None:
    caps, name = profile.capabilities, profile.name
    if c.sp and not caps.sequence_parallel.supported:
        return "sp_not_in_framework", f"sp=true: framework {name!r} has no sequence parallelism: set sp=false"
    tied = caps.tied_embeddings_across_stages
    if c.tied_embeddings and c.pp > 1 and not tied.supported:
        return "tied_embeddings_across_stages_not_in_framework", (
            f"the model ties its input and output embeddings and framework {name!r} does not tie them across pipeline "
            f"stages ({tied.source}): use pp=1, untie the embeddings, or another --framework")
    if c.cp > 1 and not caps.context_parallel.supported:
        return "cp_not_in_framework", f"cp={c.cp}: framework {name!r} has no context parallelism ({caps.context_parallel.source}): use cp=1"
    if c.cp > 1 and c.pp > 1 and not caps.context_parallel.with_pp:
        return "cp_with_pp_not_in_framework", f"cp={c.cp} with pp={c.pp}: framework {name!r} does not combine them"
    if c.ep > 1:
        if not caps.expert_parallel.supported:
            return "ep_not_in_framework", f"ep={c.ep}: framework {name!r} has no expert parallelism: use ep=1"
        span = {"dp": c.dp, "dp_cp": c.dp_cp, "tp_dp_cp": c.dp_cp}[caps.expert_parallel.span]
        folds = caps.expert_parallel.span == "tp_dp_cp" and c.ep % span == 0 and c.tp % (c.ep // span) == 0
        if span % c.ep and not folds:
            what = {"dp": "dp", "dp_cp": "dp*cp", "tp_dp_cp": "dp*cp (or dp*cp times a divisor of tp, folded)"}
            return "ep_outside_framework_span", (f"ep={c.ep} must divide {what[caps.expert_parallel.span]}={span} in framework "
                                                 f"{name!r} (expert groups are carved from those ranks): choose another ep")
    return None


def _exclusion(profile: FrameworkProfile, c: Config) -> tuple[str, str] | None:
    for rule in profile.capabilities.exclusions:
        if all(_holds(getattr(c, field), expected) for field, expected in rule.when.items()):
            return rule.key, _reason(profile, rule, c)
    return None


def _reason(profile: FrameworkProfile, rule, c: Config) -> str:
    """The rule's reason with the configuration's values in its {field} slots, naming the framework."""
    return rule.reason.format(**dataclasses.asdict(c)) + f" (framework {profile.name!r})"


def interleaved_split_reason(profile: FrameworkProfile, *, num_layers: int, pp: int, vpp: int,
                             num_microbatches: int, last_slots: int = 0) -> tuple[str, str] | None:
    """Whether the stack can run the split the cost model prices for `num_layers` decoder layers over pp*vpp
    interleaved chunks (planner.frameworks_split.balanced_split, judged by split_refusal).

    Equal chunks need num_layers % (pp*vpp) == 0; with an embedding and a loss slot (Megatron's
    --account-for-embedding/loss-in-pipeline-split, torchtitan's input/output weights counted as layers) the
    rule is on num_layers + slots; an explicit layout takes any count that leaves every chunk a layer, or the end
    chunks none where the stack allows (Llama-3.1 405B, 126 layers: pp 8 x vpp 8 in NeMo, pp 16 x vpp 8 in
    Llama 3's own runs, whose first and last chunks hold only the embedding and the loss). `last_slots`: MTP
    layers the last chunk runs (ModelSpec.mtp_num_layers), judged on the split the cost prices with them."""
    split, chunks = profile.capabilities.interleaved_split, pp * vpp
    if split.microbatches_divisible_by_pp and num_microbatches % pp:
        return "microbatches_not_divisible_by_pp", (f"num_microbatches={num_microbatches} must be divisible by pp={pp} "
                                                    f"for the interleaved schedule of framework {profile.name!r}")
    ends = 2 if split.empty_chunks != "none" else 0  # end chunks may hold only the embedding / the loss
    rule = None if num_layers + ends >= chunks else f"fewer than one layer a chunk"
    if rule is None:
        counts = balanced_split(num_layers, chunks, last_slots=last_slots)
        rule = split_refusal(profile, num_layers=num_layers, pp=pp, vpp=vpp, counts=counts)
    if rule is not None:
        return "layers_not_divisible_by_pp_vpp", (f"num_layers={num_layers} cannot be split over pp*vpp={chunks} chunks "
                                                  f"by framework {profile.name!r}: choose pp*vpp dividing {num_layers} "
                                                  f"({rule})")
    return None


def model_refusal(profile: FrameworkProfile, spec: ModelSpec) -> str | None:
    """The first model feature the stack cannot build (profile capabilities.unsupported_models), as one line naming
    the feature, the stack and why; None when it builds the model."""
    for rule in profile.capabilities.unsupported_models:
        if has_feature(spec, rule.feature):
            return (f"model {spec.name!r} has {describe(rule.feature)}, which framework {profile.name!r} does not build "
                    f"({rule.reason}): choose another --framework or change the model")
    return None


def plan_refusal(profile: FrameworkProfile, plan: LaunchPlan) -> str | None:
    """Why `profile`'s stack cannot run `plan` (precision, capabilities, exclusions, layer split), or None.

    The search's own judge applied to a finished plan: the executor's pre-launch check, `explain`'s verdicts and
    every exporter's re-check (a plan made for one framework is judged on its configuration, not its name)."""
    reason = precision_refusal(profile, plan.request.precision) or model_refusal(profile, plan.request.model)
    if reason is not None:
        return reason
    for config in plan_configs(plan):
        found = refusal(profile, config, allow_stale_weights=True)  # the plan already chose its schedule
        if found is not None:
            return found[1]
    par, split = plan.parallelism, profile.capabilities.interleaved_split
    if par.pp > 1 and par.vpp > 1 and split.microbatches_divisible_by_pp and plan.batch.num_microbatches % par.pp:
        return (f"num_microbatches={plan.batch.num_microbatches} must be divisible by pp={par.pp} for the interleaved "
                f"schedule of framework {profile.name!r}")
    counts = [sum(name.startswith("layers.") for name in stage.layers) for stage in sorted(plan.stages, key=lambda s: s.stage)]
    if len(counts) == par.pp * par.vpp:  # a plan whose stages do not match pp*vpp is check_runnable's to refuse
        return split_refusal(profile, num_layers=plan.request.model.num_layers, pp=par.pp, vpp=par.vpp, counts=counts)
    return None
