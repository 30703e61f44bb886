"""MoE token dispatch as the stacks run it: which dispatcher, how much of it hides behind compute, and the load of
the slowest expert-parallel rank.

Dispatchers (one collective each for dispatch and for combine, in each direction; the fastest the stack runs,
since the dispatcher is a setting the plan chooses like any other):
- all-to-all (GShard, Lepikhin et al. 2021 Sec. 2.2; Megatron-Core `--moe-token-dispatcher-type alltoall`,
  DeepSpeed-MoE, torchtitan's ExpertParallel): each rank sends tokens * top_k rows of h (comm.all_to_all_s);
- per-node deduplicated (DeepSeek-V3 report Sec. 3.2.2, DeepEP; Megatron-Core `--moe-token-dispatcher-type flex
  --moe-enable-deepep`): a token crosses the NICs once per destination node (comm.hierarchical_all_to_all_s);
- all-gather (Megatron-Core's default `moe_token_dispatcher_type = "allgather"`,
  megatron/core/transformer/moe/token_dispatcher.py MoEAllGatherTokenDispatcher): every rank gathers all ep ranks'
  tokens (tokens * h each) and the combine reduce-scatters them back.

Overlap (behaviour.overlap): `moe_all_to_all` (batch-level: the dispatch/combine of one micro-batch runs under
another micro-batch's layer compute: DeepSeek's DualPipe, Megatron-Core `--overlap-moe-expert-parallel-comm` with
`--delay-wgrad-compute`, megatron/core/model_parallel_config.py) leaves max(0, comm - layer compute) exposed;
`moe_shared_expert_overlap` (Megatron-Core `--moe-shared-expert-overlap`, transformer_config.py: the shared
experts compute while the dispatcher communicates) leaves max(0, comm - shared-expert compute); else all exposed.

Load: the slowest EP rank receives (1 + routing_skew) x the mean routed tokens (MoESpec.routing_skew, the
request's; 0 = balanced, as no stack's load-balancing loss comes with a measured per-rank imbalance). With a
capacity factor c every expert's buffer is padded to c x the mean and what exceeds it is dropped, so the load is
c; dropless (None), the load is 1 + skew. `load_factor` multiplies the routed tokens of the slowest rank's
expert GEMMs, its activations and the bytes it receives.
"""

from __future__ import annotations

from planner.cost import comm
from planner.schemas.model import MoESpec
from planner.topology.groups import GroupLink

ACT_BYTES = 2  # bf16 hidden states on the wire (compute.ACT_BYTES)


def load_factor(cfg: MoESpec) -> float:
    """Routed tokens of the slowest EP rank over the mean: the capacity factor where tokens are padded and
    dropped, else 1 + routing_skew (dropless)."""
    return float(cfg.capacity_factor) if cfg.capacity_factor else 1.0 + cfg.routing_skew


def dropped_fraction(cfg: MoESpec) -> float:
    """The share of the slowest rank's routed tokens dropped at its expert capacity (0 when dropless)."""
    if not cfg.capacity_factor:
        return 0.0
    wanted = 1.0 + cfg.routing_skew
    return max(0.0, wanted - cfg.capacity_factor) / wanted


def dispatch_s(tokens: float, cfg: MoESpec, hidden: int, *, group: GroupLink, hierarchical: bool,
               allgather: bool, value_bytes: float = ACT_BYTES) -> float:
    """One dispatch (or combine) of `tokens` tokens of this rank: the fastest dispatcher the stack runs
    (`value_bytes` per element: bf16, or fp8 with its scales under fp8 dispatch)."""
    if group.size <= 1:
        return 0.0
    routed_bytes = tokens * cfg.top_k * load_factor(cfg) * hidden * value_bytes
    options = [comm.all_to_all_s(routed_bytes, group=group)]
    if hierarchical:
        options.append(comm.hierarchical_all_to_all_s(routed_bytes, top_k=cfg.top_k, group=group))
    if allgather:
        options.append(comm.all_gather_s(tokens * group.size * hidden * value_bytes, group=group))
    return min(options)


def exposed_s(comm_s: float, *, layer_compute_s: float, shared_compute_s: float, batch_overlap: bool,
              shared_overlap: bool) -> float:
    """The part of a layer's MoE communication (one direction) not hidden behind compute."""
    if batch_overlap:
        return max(0.0, comm_s - layer_compute_s)
    if shared_overlap:
        return max(0.0, comm_s - shared_compute_s)
    return comm_s
