"""The space's per-request choices: Options, what SearchLimits asks narrowed to what the request's framework runs.

Options.from_request reads the request's limits, its fixed degrees and its stack profile once, before the space
(planner.search.space) is enumerated, and refuses up front, as BadInputError naming the fix, a request no
configuration could answer (a precision, degree, compression, HSDP replica count or recompute module set the stack
or the model rules out; a list of choices of which the stack runs none). Kept apart from the enumeration: the
search, the practice rule (planner.search.practice) and the tests build Options without walking the space.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from planner.cost.validity import module_reasons
from planner.errors import BadInputError
from planner.frameworks import (Config, load_framework, model_refusal, parallel_refusal, precision_refusal,
                                recompute_modules_refusal)
from planner.schedules import schedule as schedule_of
from planner.schemas.compression import NONE, Compression
from planner.schemas.dims import Axis, FixedDims
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import PlanRequest, SearchLimits


@dataclass(frozen=True)
class Options:
    """The per-request choices of the space, after SearchLimits and the framework profile are applied."""

    schedules: tuple[str, ...]
    zero_stages: tuple[int, ...]
    recompute_modes: tuple[str, ...]
    tp_overlap: tuple[str, ...]
    max_microbatch_size: int
    profile: FrameworkProfile
    fixed: FixedDims = field(default_factory=FixedDims)  # degrees fixed by the caller (--tp, --pp, ...), checked
    allow_stale_weights: bool = False
    sp: bool | None = None  # fixed sequence parallelism (None: both)
    vpp: int | None = None  # fixed virtual stages per rank (None: every valid one)
    microbatch_size: int | None = None  # fixed micro-batch size (None: every divisor up to max_microbatch_size)
    sp_with_tp: bool = False  # tp > 1 only with sequence parallelism (a stack's practice: planner.search.practice)
    min_layers_per_chunk: int = 1  # interleaved: decoder layers per virtual stage at least (a stack's practice)
    compression: Compression = NONE  # fixed compression of every member (planner.search.compression_space)
    compression_auto: bool = False  # each member with the compression that makes it fastest
    dp_replicate: int = 1  # HSDP replicas fixed by the request (SearchLimits.dp_replicate), not searched
    recompute_modules: tuple[str, ...] = ()  # what `selective` reruns (SearchLimits.recompute_modules), not searched

    def modules_for(self, recompute: str) -> tuple[str, ...]:
        """The modules a group of this recompute mode reruns: the request's, with selective only."""
        return self.recompute_modules if recompute == "selective" else ()

    def zero_stages_for(self, pp: int) -> tuple[int, ...]:
        """The ZeRO stages the framework runs at this pp (bounds need hold only for members it can run)."""
        zero = self.profile.capabilities.zero
        allowed = zero.stages_with_pp if pp > 1 else zero.stages
        return tuple(z for z in self.zero_stages if z in allowed)

    @staticmethod
    def from_request(request: PlanRequest, fixed: Mapping[str, int] | None = None,
                     framework: FrameworkProfile | None = None) -> Options:
        """The space's choices for `request` run by `framework` (its profile, resolved once by the caller; else read
        by the request's framework name)."""
        limits = request.search or SearchLimits()
        profile = framework_of(request, framework)
        pinned = FixedDims.of({**limits.fixed, **(fixed or {})}, request.gpus)
        _check_framework_request(profile, request.precision, pinned, request.model.moe is not None)
        _check_compression(profile, limits.compression)
        only = limits.schedules[0] if len(limits.schedules) == 1 else None  # asking for 2BW alone allows it
        stale = limits.allow_stale_weights or (only is not None and schedule_of(only).stale_weights)
        runs = set(profile.schedule_names())
        schedules = tuple(s for s in limits.schedules if s in runs and (not schedule_of(s).stale_weights or stale))
        caps = profile.capabilities
        if (limits.vpp or 1) > 1 and not any(schedule_of(s).searched_vpp != "one" for s in schedules):
            raise BadInputError(f"vpp={limits.vpp} needs the interleaved schedule, which is not among {list(schedules)}: "
                                f"drop --vpp or allow --schedule interleaved")
        zeros = tuple(sorted(z for z in limits.zero_stages if z in caps.zero.stages + caps.zero.stages_with_pp
                             and (limits.dp_replicate == 1 or z >= 2)))
        _check_hsdp(profile, limits.dp_replicate, pinned)
        _check_recompute_modules(profile, request, limits)
        return Options(
            schedules=_narrowed("schedule", limits.schedules, schedules, profile),
            zero_stages=_narrowed("zero_stage", limits.zero_stages, zeros, profile),
            recompute_modes=_narrowed("recompute", limits.recompute_modes, tuple(r for r in limits.recompute_modes if r in caps.recompute.modes), profile),
            tp_overlap=tuple(o for o in limits.tp_overlap if o in caps.tp_overlap) or ("none",),
            max_microbatch_size=limits.max_microbatch_size,
            profile=profile,
            fixed=pinned,
            allow_stale_weights=stale,
            sp=limits.sp, vpp=limits.vpp, microbatch_size=limits.microbatch_size,
            compression=NONE if limits.compression == "auto" else limits.compression,
            recompute_modules=limits.recompute_modules,
            compression_auto=limits.compression == "auto",
            dp_replicate=limits.dp_replicate,
        )


def _check_recompute_modules(profile: FrameworkProfile, request: PlanRequest, limits: SearchLimits) -> None:
    """Recompute modules the stack does not take or the model lacks are refused up front (else every selective
    candidate would be pruned without a word)."""
    modules = limits.recompute_modules
    if not modules:
        return
    if "selective" not in limits.recompute_modes:
        raise BadInputError(f"recompute_modules={list(modules)} name what selective reruns, and the search may not choose "
                            f"selective (recompute_modes={list(limits.recompute_modes)}): allow it, or drop the modules")
    refused = recompute_modules_refusal(profile, modules)
    if refused is not None:
        raise BadInputError(refused[1])
    reasons = module_reasons(request.model, modules)
    if reasons:
        raise BadInputError("; ".join(reasons))


def _check_hsdp(profile: FrameworkProfile, dp_replicate: int, fixed: FixedDims) -> None:
    """A fixed dp_replicate (HSDP) the stack cannot run, or that cannot divide the fixed dp, has no answer."""
    if dp_replicate == 1:
        return
    if not profile.capabilities.zero.hsdp:
        raise BadInputError(f"dp_replicate={dp_replicate}: framework {profile.name!r} has no hybrid sharding (HSDP): "
                            f"drop --dp-replicate or choose another --framework")
    if Axis.DP in fixed and fixed[Axis.DP] % dp_replicate:
        raise BadInputError(f"dp_replicate={dp_replicate} must divide dp={fixed[Axis.DP]}: choose a divisor of dp, or drop --dp-replicate")


def framework_of(request: PlanRequest, profile: FrameworkProfile | None = None) -> FrameworkProfile:
    """The request's framework profile (`profile`, the object resolved where the request entered, else read by the
    request's name), checked against the request: SearchLimits.runnable (the old --runnable) means the `planner`
    executor, and the stack must build the model."""
    limits = request.search or SearchLimits()
    if limits.runnable and request.framework != "planner":
        raise BadInputError(f"runnable=true with framework={request.framework!r}: --runnable means --framework planner; drop one")
    profile = profile if profile is not None else load_framework(request.framework)
    refused = model_refusal(profile, request.model)
    if refused is not None:
        raise BadInputError(refused)
    return profile


def _narrowed(name: str, asked: tuple, kept: tuple, profile: FrameworkProfile) -> tuple:
    """The choices the framework runs among those asked; none left is bad input naming the framework."""
    if not kept:
        raise BadInputError(f"{name}={list(asked)}: framework {profile.name!r} runs none of them "
                            f"(see `planner framework show {profile.name}`): choose another {name} or --framework")
    return kept


def _check_framework_request(profile: FrameworkProfile, precision: str, fixed: FixedDims, is_moe: bool) -> None:
    """A precision or fixed degree the framework cannot run has no answer: say so before searching."""
    refused = precision_refusal(profile, precision)
    if refused is not None:
        raise BadInputError(refused)
    probe = Config(dp=fixed.get(Axis.DP, 1), tp=fixed.get(Axis.TP, 1), pp=fixed.get(Axis.PP, 1), cp=fixed.get(Axis.CP, 1),
                   ep=1 if not is_moe else fixed.get(Axis.EP, 1), is_moe=is_moe)
    found = parallel_refusal(profile, probe) if probe.cp > 1 or probe.ep > 1 else None
    if found is not None and found[0] != "ep_outside_framework_span":
        raise BadInputError(found[1])


def _check_compression(profile: FrameworkProfile, compression: Compression | str) -> None:
    """A fixed compression method the stack never runs has no answer: say so before searching (one it runs only
    at some ZeRO stages or pp narrows the space instead: planner.frameworks.compression_refusal)."""
    if compression == "auto":
        return
    runs = {e.method for e in profile.capabilities.compression}
    for method in compression.methods:
        if method not in runs:
            raise BadInputError(f"compression={compression.label!r}: framework {profile.name!r} does not run {method!r}; "
                                f"it runs {sorted(runs) or ['none']} (see `planner framework show {profile.name}`)")


__all__ = ["Options", "framework_of"]
