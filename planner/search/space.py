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
The choices themselves, and the checks that refuse a request before any enumeration: planner.search.options.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from functools import lru_cache

from planner.frameworks import Config, group_refusal, parallel_refusal
from planner.schedules import ALL as ALL_SCHEDULES
from planner.schedules import DEFAULT
from planner.schedules import schedule as schedule_of
from planner.schemas.dims import Axis, ParallelDims, divisors
from planner.schemas.framework import FrameworkProfile
from planner.schemas.plan import AXES, PlanRequest
from planner.search.options import Options
from planner.search.stack_rules import StackRules


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
