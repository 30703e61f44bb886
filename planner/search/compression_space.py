"""Which compressions the search tries for one configuration (planner.schemas.compression).

A compression changes a configuration's data-parallel (or MoE) traffic, its (de)compression kernels and its memory,
never its compute: so it is chosen per configuration, as the least predicted step time among the variants that fit
(planner.search.driver visits a member once and evaluates each variant), and the compute floors that bound the
search hold for every variant. What a variant may be:

- fixed by the request (SearchLimits.compression a Compression): that one only (a member the stack cannot run it
  with is refused by planner.frameworks.compression_refusal and counted under its key);
- `auto`: none, and every combination of the methods the stack runs at the member's ZeRO stage and pp
  (capabilities.compression) with at most one gradient method, where it can matter: hpZ and qgZ only when the
  data-parallel group spans nodes with several ranks per node (inside one node there is nothing to keep local),
  PowerSGD at rank AUTO_POWERSGD_RANK. fp8 MoE dispatch changes every MoE layer's cost, so it is not a per-member
  choice: the request fixes it.

A compression replaces the member's uncompressed variant only when it is predicted faster by more than the
model's ranking band (calibration `ranking_band`: how far the model's error moves between two configurations of one
source, the same band planner.search.practice uses): a smaller gain is within what the model cannot tell apart, and
compression is never free (memory, kernels, changed arithmetic).

Lossy methods change the arithmetic, which the cost model does not price: `auto` is the user's opt-in (as
`--allow-stale-weights` is for PipeDream-2BW), and PowerSGD's rank is not searched (a lower rank is always
cheaper to send, never better to train): the user names another with powersgd:R.
"""

from __future__ import annotations

import itertools

from planner.schemas.compression import GRADIENT_METHODS, METHODS, NONE, Compression
from planner.schemas.framework import FrameworkProfile
from planner.topology.groups import GroupLink

# Vogels et al. 2019 train their language model (LSTM on WikiText-2) with PowerSGD up to rank 4; torch's
# PowerSGDState docstring suggests starting at rank 1-4 (matrix_approximation_rank).
AUTO_POWERSGD_RANK = 4


def variants(profile: FrameworkProfile, *, zero_stage: int, pp: int, replicas: int, dp_link: GroupLink,
             auto: bool, fixed: Compression) -> tuple[Compression, ...]:
    """The compressions to evaluate for one member (the first is what a tie keeps)."""
    if not auto:
        return (fixed,)
    if replicas <= 1:
        return (NONE,)
    spans = dp_link.num_nodes > 1 and dp_link.ranks_per_node > 1
    methods = [e.method for e in profile.capabilities.compression
               if zero_stage in e.zero_stages and (pp == 1 or e.with_pp) and e.method != "fp8-dispatch"
               and (spans or e.method not in ("hpz", "qgz"))]
    weights = [m for m in methods if m not in GRADIENT_METHODS]
    grads = [None] + [m for m in methods if m in GRADIENT_METHODS]
    out = []
    for count in range(len(weights) + 1):
        for chosen in itertools.combinations(weights, count):
            for grad in grads:
                picked = tuple(sorted((*chosen, *([grad] if grad else [])), key=METHODS.index))
                out.append(Compression(methods=picked,
                                       powersgd_rank=AUTO_POWERSGD_RANK if "powersgd" in picked else 0,
                                       hpz_partition_size=dp_link.ranks_per_node if "hpz" in picked else 0))
    return tuple(out)


def pick(items: list, *, margin: float):
    """The variant that stands for a member (`items`: Scored, the uncompressed one first when there is one): the
    fastest fitting compressed variant if it beats the first by more than `margin` (a fraction) or the first does
    not fit, else the first."""
    base = items[0]
    best = base
    for item in items[1:]:
        if not item.ev.fits:
            continue
        beats_base = not base.ev.fits or item.ev.step_time_s < base.ev.step_time_s * (1 - margin)
        if beats_base and (best is base or item.key < best.key):
            best = item
    return best
