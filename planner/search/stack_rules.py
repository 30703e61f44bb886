"""What the request's stack runs and what its model allows, decided once when the search space is built.

The branch and bound used to ask the stack's profile (planner.frameworks) again at each of its stages: the rank
order for every group, the ZeRO stages run at a pp for every bound, the interleaving rules for every (schedule,
vpp) of every group. Here they are read once per request, from the FrameworkProfile object the request resolved
where it entered (planner.api) and from the request's numbers, into tables the space (planner.search.space) and
the bounds (planner.search.floors, members) index:

- the stack's fixed rank order (capabilities.rank_order), when it has one;
- the ZeRO stages it runs with and without pipeline parallelism (capabilities.zero, within SearchLimits);
- its exclusions that read only a group's fields (they refuse a whole group: planner.frameworks.group_refusal);
- per degree of one axis, the structural rule that degree alone breaks: tp must divide the attention heads, the
  KV heads (not with MLA) and the FFN width (Megatron-LM arguments.py), dp the global batch, 2*cp the sequence
  (load-balanced causal context parallelism), ep the experts;
- per pp, and whether pp divides num_microbatches, the (schedule, vpp) variants that pass the stack's interleaving
  rules (planner.frameworks.interleaved_split_reason reads nothing else of a group) and the count of the others
  per rule, so that pruning counts them as the search always has.

Rules that read a member's own fields with others (an exclusion on zero_stage with pp, say) stay where the
member is judged (planner.frameworks.refusal in the driver): folding them in here would move the counts of
`pruned` a plan reports.
"""

from __future__ import annotations

from collections import Counter

from planner.frameworks import GROUP_FIELDS, interleaved_split_reason
from planner.schemas.dims import Axis
from planner.schemas.plan import PlanRequest

Variants = tuple[tuple[str, int], ...]  # (schedule, vpp) pairs


class StackRules:
    """The tables above for one request; `variants[pp]` are the space's (schedule, vpp) pairs at each pp it can
    have, `degrees` every divisor of the GPU count (planner.search.space builds both)."""

    def __init__(self, request: PlanRequest, opts, variants: dict[int, Variants], degrees: list[int]):
        profile, model = opts.profile, request.model
        order = profile.capabilities.rank_order
        self.rank_order = (tuple(order.axes),) if order is not None else None
        self.zero_by_pp = (opts.zero_stages_for(1), opts.zero_stages_for(2))
        self.group_rules = tuple(r for r in profile.capabilities.exclusions if set(r.when) <= GROUP_FIELDS)
        self.axis = axis_rules(request, degrees)
        self.variant_table: dict[tuple[int, bool], tuple[Variants, Counter]] = {}
        for pp, pairs in variants.items():
            for divisible in (True, False):
                self.variant_table[(pp, divisible)] = _split_rules(profile, model, pp, pairs, divisible)

    def zero_stages(self, pp: int) -> tuple[int, ...]:
        """The ZeRO stages of the space the stack runs at this pp (Options.zero_stages_for)."""
        return self.zero_by_pp[pp > 1]

    def variants(self, pp: int, num_microbatches: int) -> tuple[Variants, Counter]:
        """(the variants that pass the interleaving rules, the others counted per rule) at this pp and count."""
        return self.variant_table[(pp, num_microbatches % pp == 0)]

    def valid_variants(self, pp: int, num_microbatches: int) -> Variants:
        return self.variants(pp, num_microbatches)[0]


def axis_rules(request: PlanRequest, degrees: list[int]) -> dict[Axis, dict[int, str | None]]:
    """Per axis and degree, the first structural rule that degree alone breaks, as a `pruned` key (None: none)."""
    m, r = request.model, request

    def tp_rule(tp: int) -> str | None:
        if m.num_attention_heads % tp:
            return "heads_not_divisible_by_tp"
        if m.mla is None and m.kv_heads % tp:
            return "kv_heads_not_divisible_by_tp"
        return "ffn_not_divisible_by_tp" if m.ffn_hidden_size % tp else None

    return {Axis.TP: {tp: tp_rule(tp) for tp in degrees},
            Axis.DP: {dp: "global_batch_not_divisible_by_dp" if r.global_batch_size % dp else None for dp in degrees},
            Axis.CP: {cp: "seq_len_not_divisible_by_2cp" if cp > 1 and r.seq_len % (2 * cp) else None for cp in degrees},
            Axis.EP: {ep: "experts_not_divisible_by_ep" if m.moe is not None and m.moe.num_experts % ep else None
                   for ep in degrees}}


def _split_rules(profile, model, pp: int, pairs: Variants, divisible: bool) -> tuple[Variants, Counter]:
    """The pairs the stack's interleaving rules allow at this pp, and the count of the others per rule, when pp
    divides num_microbatches (`divisible`) or not."""
    valid, rules = [], Counter()
    for schedule, vpp in pairs:
        found = None if vpp == 1 else interleaved_split_reason(profile, num_layers=model.num_layers, pp=pp, vpp=vpp,
                                                                num_microbatches=0 if divisible else 1,
                                                                last_slots=model.mtp_num_layers)
        if found is None:
            valid.append((schedule, vpp))
        else:
            rules[found[0]] += 1
    return tuple(valid), rules
