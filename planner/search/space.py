"""The plan space: every configuration the search considers, enumerated in groups, with structural pruning counted.

A configuration is (dp, tp, pp, cp, ep, sp, vpp, zero_stage, tp_overlap, microbatch_size, num_microbatches,
schedule, recompute, axis_order). The space, and what bounds it:

- dp x tp x pp x cp = gpus, every factorisation; tp a divisor of gpus_per_node (TP stays inside the fast
  intra-node fabric, as Megatron-LM and torchtitan place it; a node of a GB200 NVL72 topology is the 72-GPU NVLink
  domain, so TP up to 72 there); pp up to the number of decoder layers.
- ep (MoE models only): every divisor of dp x cp (expert-parallel groups are carved out of the data-parallel and
  context-parallel ranks, Megatron-Core's expert_model_parallel groups), and dp x cp times a divisor of tp where the
  stack folds experts over tp (MoE parallel folding); dense models have ep = 1.
- sp on/off when tp > 1 (off when tp = 1: nothing to shard); tp_overlap none/domino when tp > 1.
- microbatch_size: every divisor of global_batch_size / dp up to SearchLimits.max_microbatch_size;
  num_microbatches = global_batch_size / (dp * microbatch_size).
- zero_stage and recompute from SearchLimits (default 0..3 and none/selective/full); partial full recompute of
  some layers per stage is chosen by the ILP for configurations that do not fit otherwise.
- schedule: with pp = 1 every pipeline schedule is the same computation, so one stands for all (1f1b when
  allowed); with pp > 1 gpipe, 1f1b, 2bw, zero-bubble (vpp = 1) and interleaved with every vpp in 2..L/pp
  ((L+2)/pp where the stack lets the end chunks hold only the embedding and the loss); where SearchLimits.schedules
  names them (not by default) and the stack runs them, torch's interleaved-zero-bubble with every vpp in 1..that
  and zbv, dualpipev with vpp = 2 (two stages per rank in a V).
- axis_order: tp innermost; every order of the other axes whose size is > 1 (orders that differ only in where a
  size-1 axis sits are the same layout and are not counted twice).

Structural rules that prune whole groups, counted per reason (times the configurations each group holds):
heads, KV heads (not with MLA) and the FFN width divisible by tp, global batch by dp, seq_len by 2*cp (load-balanced causal context
parallelism, Megatron-Core), experts by ep, decoder layers over pp*vpp interleaved chunks as the stack splits them
(equal chunks, or uneven ones where it spells them: planner.frameworks.interleaved_split_reason) and
num_microbatches by pp (Megatron-LM's rule for interleaving).
What the request's framework (planner.frameworks, `frameworks/<name>.yaml`) does not run is never explored: its
schedules, ZeRO stages, recompute modes and TP overlaps bound the choices above; a factorisation it cannot run
(context or expert parallelism it lacks, expert groups outside its span) is pruned under the profile's key, and
the per-configuration rules (ZeRO with PP, exclusions) prune members in the driver. PipeDream-2BW enters only
with SearchLimits.allow_stale_weights (its one-step-stale weights change the optimizer's semantics).
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache

from planner.cost.validity import module_reasons
from planner.errors import BadInputError
from planner.frameworks import (Config, group_refusal, load_framework, model_refusal, parallel_refusal,
                                precision_refusal, recompute_modules_refusal)
from planner.schedules import ALL as ALL_SCHEDULES
from planner.schedules import DEFAULT
from planner.schedules import schedule as schedule_of
from planner.schemas.compression import NONE, Compression
from planner.schemas.dims import Axis, FixedDims, ParallelDims, divisors
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import AXES, PlanRequest, SearchLimits
from planner.search.stack_rules import StackRules


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


@dataclass(frozen=True)
class Group:
    """Configurations that share the per-layer time arrays: everything but zero, schedule/vpp and axis order."""

    fact: ParallelDims
    microbatch_size: int
    num_microbatches: int
    sp: bool
    recompute: str
    tp_overlap: str
    recompute_modules: tuple[str, ...] = ()  # with recompute selective: the modules it reruns

    def candidate_fields(self) -> dict:
        f = self.fact
        return dict(
            dp=f.dp, tp=f.tp, pp=f.pp, cp=f.cp, ep=f.ep, sp=self.sp, tp_overlap=self.tp_overlap,
            microbatch_size=self.microbatch_size, num_microbatches=self.num_microbatches, recompute=self.recompute,
            recompute_modules=self.recompute_modules,
        )


@dataclass(frozen=True)
class Member:
    zero_stage: int
    schedule: str
    vpp: int
    axis_order: tuple[str, ...]


def axis_orders(fact: ParallelDims, profile: FrameworkProfile | None = None) -> tuple[tuple[str, ...], ...]:
    """The stack's own rank order when its profile fixes one (Megatron tp-cp-ep-dp-pp, torchtitan's mesh
    [pp, dp_replicate, dp_shard, cp, tp]: capabilities.rank_order), so the plan is placed and its links priced as
    the stack lays ranks out; else (our executor) tp innermost and every permutation of the outer axes with size > 1,
    placed in the default order's slots."""
    fixed = profile.capabilities.rank_order if profile is not None else None
    if fixed is not None:
        return (tuple(fixed.axes),)
    return _orders(fact.pp > 1, fact.dp > 1, fact.cp > 1)


@lru_cache(maxsize=8)
def _orders(pp: bool, dp: bool, cp: bool) -> tuple[tuple[str, ...], ...]:
    """axis_orders for the outer axes of size > 1 (pp, dp, cp): at most 8 distinct answers."""
    outer = [a for a in AXES if a != "tp"]
    busy = [a for a in outer if {Axis.PP: pp, Axis.DP: dp, Axis.CP: cp}[a]]
    slots = [i for i, a in enumerate(outer) if a in busy]
    orders = []
    for perm in itertools.permutations(busy):
        order = list(outer)
        for slot, axis in zip(slots, perm, strict=True):
            order[slot] = axis
        orders.append((*order, "tp"))
    return tuple(orders)


def schedule_variants(pp: int, num_layers: int, opts: Options) -> list[tuple[str, int]]:
    """(schedule, vpp) pairs of the space for this pp (see the module docstring)."""
    if pp == 1:
        flat = [s for s in opts.schedules if schedule_of(s).stages_per_rank != "several"]
        return [(DEFAULT.name if DEFAULT.name in flat else flat[0], 1)] if flat and opts.vpp in (None, 1) else []
    variants = [(s.name, 1) for s in ALL_SCHEDULES if s.searched_vpp == "one" and s.name in opts.schedules]
    ends = 2 if opts.min_layers_per_chunk == 1 and opts.profile.capabilities.interleaved_split.empty_chunks != "none" else 0
    most = (num_layers + ends) // (pp * opts.min_layers_per_chunk)  # end chunks may hold only the embedding / the loss
    for kind in ("several", "any", "two"):  # where the stack allows; "two": two stages per rank, a V
        variants += [(s.name, v) for s in ALL_SCHEDULES if s.searched_vpp == kind and s.name in opts.schedules
                     for v in s.searched_vpps(most)]
    return [(s, v) for s, v in variants if opts.vpp in (None, v)]


class Space:
    """Enumerates groups and members of one request's space; `pruned` counts what structural rules removed."""

    def __init__(self, request: PlanRequest, opts: Options):
        self.request, self.opts = request, opts
        self.model = request.model
        self.pruned: Counter[str] = Counter()
        self.considered = 0
        self._sizes: dict[int, list[int]] = {}
        # what the stack runs and the model allows, read once here (planner.search.stack_rules), not at each stage
        pinned, layers = opts.fixed.get("pp"), self.model.num_layers
        degrees = divisors(request.gpus)
        self.schedule_variants = {pp: tuple(schedule_variants(pp, layers, opts)) for pp in degrees
                                  if pp <= layers and pinned in (None, pp)}
        self.rules = StackRules(request, opts, self.schedule_variants, degrees)

    def orders(self, fact: ParallelDims) -> tuple[tuple[str, ...], ...]:
        """axis_orders of the factorisation under this stack (its fixed rank order, when it has one)."""
        return self.rules.rank_order or _orders(fact.pp > 1, fact.dp > 1, fact.cp > 1)

    def factorisations(self) -> Iterator[ParallelDims]:
        gpus, gpn, fixed = self.request.gpus, self.request.topology.gpus_per_node, self.opts.fixed
        for tp in divisors(gpus):
            if (gpus > gpn and gpn % tp) or tp > gpn or not fixed.allows(Axis.TP, tp):
                continue
            for pp in divisors(gpus // tp):
                if pp > self.model.num_layers or not fixed.allows(Axis.PP, pp):
                    continue
                for cp in divisors(gpus // (tp * pp)):
                    dp = gpus // (tp * pp * cp)
                    if not (fixed.allows(Axis.CP, cp) and fixed.allows(Axis.DP, dp)):
                        continue
                    for ep in self._eps(dp * cp, tp):
                        yield ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep)

    def _eps(self, span: int, tp: int) -> list[int]:
        """Every divisor of dp*cp, and where the stack folds experts over tp (capabilities.expert_parallel.span
        tp_dp_cp: Megatron-Core's MoE parallel folding) dp*cp times each divisor of tp (ParallelDims.expert_fold)."""
        if self.model.moe is None:
            return [1]
        found = divisors(span)
        if self.opts.profile.capabilities.expert_parallel.span == "tp_dp_cp":
            found += [span * k for k in divisors(tp) if k > 1]
        return [e for e in found if self.opts.fixed.allows(Axis.EP, e)]

    def microbatch_sizes(self, dp: int) -> list[int]:
        found = self._sizes.get(dp)
        if found is None:
            per_replica, rest = divmod(self.request.global_batch_size, dp)
            fixed = self.opts.microbatch_size
            found = self._sizes[dp] = [] if rest else [m for m in divisors(per_replica)
                                                       if (fixed is None and m <= self.opts.max_microbatch_size) or m == fixed]
        return found

    def fact_reason(self, fact: ParallelDims) -> str | None:
        """The first structural rule a factorisation breaks, as a `pruned` key; None when it is valid."""
        m, rules = self.model, self.rules.axis
        reason = rules[Axis.TP][fact.tp] or rules[Axis.DP][fact.dp]
        if reason is not None:
            return reason
        if fact.dp % self.opts.dp_replicate or (self.opts.dp_replicate > 1 and fact.ep > 1):
            return "hsdp_not_dividing_dp" if fact.dp % self.opts.dp_replicate else "hsdp_with_ep_not_priced"
        reason = rules[Axis.CP][fact.cp] or rules[Axis.EP][fact.ep]
        if reason is not None:
            return reason
        refused = parallel_refusal(self.opts.profile, Config(dp=fact.dp, tp=fact.tp, pp=fact.pp, cp=fact.cp, ep=fact.ep,
                                                             tied_embeddings=m.tied_embeddings))
        return refused[0] if refused is not None else None

    def group_options(self, fact: ParallelDims) -> tuple[list[int], list[bool], list[str]]:
        """microbatch sizes (at least one even for an invalid dp, for counting), sp and tp_overlap choices."""
        sizes = self.microbatch_sizes(fact.dp) or [1]
        sps = [sp for sp in ([False, True] if fact.tp > 1 else [False]) if self.opts.sp in (None, sp)]
        if fact.tp > 1 and self.opts.sp_with_tp:
            sps = [sp for sp in sps if sp]
        overlaps = list(self.opts.tp_overlap) if fact.tp > 1 else ["none"]
        return sizes, sps, overlaps

    def members_per_group(self, fact: ParallelDims) -> int:
        return len(self.opts.zero_stages) * len(self.schedule_variants[fact.pp]) * len(self.orders(fact))

    def fact_count(self, fact: ParallelDims) -> int:
        """Configurations of the space with this factorisation (every group times its members)."""
        sizes, sps, overlaps = self.group_options(fact)
        return len(sizes) * len(sps) * len(overlaps) * len(self.opts.recompute_modes) * self.members_per_group(fact)

    def fact_groups(self, fact: ParallelDims) -> list[Group]:
        """The groups of a valid factorisation, in a fixed order; a group every member of which the framework
        refuses for its group-level fields (sp, recompute, tp_overlap, micro-batch) is counted under the rule."""
        sizes, sps, overlaps = self.group_options(fact)
        out = []
        for mbs, sp, rec, overlap in itertools.product(sizes, sps, self.opts.recompute_modes, overlaps):
            group = Group(fact, mbs, self.request.global_batch_size // (fact.dp * mbs), sp, rec, overlap,
                          self.opts.modules_for(rec))
            if not self.refuses_group(group):
                out.append(group)
        return out

    def refuses_group(self, group: Group) -> bool:
        """True (and the group's members counted under the rule's key) when the framework refuses every member of
        the group for its group-level fields (planner.frameworks.group_refusal)."""
        if not self.rules.group_rules:  # the stack has no exclusion on a group's fields alone
            return False
        f = group.fact
        config = Config(dp=f.dp, tp=f.tp, pp=f.pp, cp=f.cp, ep=f.ep, sp=group.sp, recompute=group.recompute,
                        recompute_modules=group.recompute_modules, tp_overlap=group.tp_overlap, is_moe=self.model.moe is not None, precision=self.request.precision,
                        microbatch_size=group.microbatch_size)
        refused = group_refusal(self.opts.profile, config)
        if refused is not None:
            self.prune_group(group, refused[0])
        return refused is not None

    def groups(self) -> Iterator[Group]:
        """Valid groups in a fixed order; invalid factorisations are counted into `pruned` and `considered`."""
        for fact in self.factorisations():
            count = self.fact_count(fact)
            self.considered += count
            reason = self.fact_reason(fact)
            if reason is not None:
                self.pruned[reason] += count
                continue
            yield from self.fact_groups(fact)

    def variants(self, group: Group) -> Iterator[tuple[str, int, int]]:
        """(schedule, vpp, members) of a group that pass the interleaving rules; the rest are counted pruned."""
        f = group.fact
        per_variant = len(self.opts.zero_stages) * len(self.orders(f))
        valid, rules = self.rules.variants(f.pp, group.num_microbatches)
        for rule, count in rules.items():
            self.pruned[rule] += count * per_variant
        for schedule, vpp in valid:
            yield schedule, vpp, per_variant

    def prune_group(self, group: Group, reason: str, copies: int = 1) -> None:
        """Count a whole group (`copies` groups of its factorisation and num_microbatches) as pruned for
        `reason`, its variants that break an interleaving rule under that rule (what `variants` would count)."""
        self.prune_members(group.fact, group.num_microbatches, reason, copies)

    def prune_members(self, fact: ParallelDims, num_microbatches: int, reason: str, copies: int) -> None:
        """prune_group for `copies` groups of `fact` with `num_microbatches`."""
        valid, rules = self.rules.variants(fact.pp, num_microbatches)
        per_variant = len(self.opts.zero_stages) * len(self.orders(fact)) * copies
        for rule, count in rules.items():
            self.pruned[rule] += count * per_variant
        self.pruned[reason] += len(valid) * per_variant

    def prune_groups(self, groups: list[Group], reason: str) -> None:
        """prune_group for each group, in one count per (factorisation, num_microbatches)."""
        counts: dict[tuple, list] = {}
        for group in groups:
            entry = counts.setdefault((group.fact, group.num_microbatches), [group, 0])
            entry[1] += 1
        for group, copies in counts.values():
            self.prune_group(group, reason, copies)

    def members(self, group: Group, schedule: str, vpp: int) -> Iterator[Member]:
        """The members of one (schedule, vpp) variant: every ZeRO stage and axis order."""
        for zero, order in itertools.product(self.opts.zero_stages, self.orders(group.fact)):
            yield Member(zero, schedule, vpp, order)
