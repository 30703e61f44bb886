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
`--delay-wgrad-compute`, megatron/core/model_parallel_config.py) leaves max(0, comm - layer compute) exposed, where
the stack runs it for the layout (behaviour.overlap.moe_all_to_all_needs, batch_overlap_applies: Megatron-Core
refuses it with pp > 1 and no virtual stages, any full recompute, fp32); `moe_shared_expert_overlap` (Megatron-Core
`--moe-shared-expert-overlap`, transformer_config.py: the shared experts compute while the alltoall dispatcher
communicates) leaves max(0, comm - shared-expert compute) where the batch-level one does not run; else all exposed.
The Megatron export writes the flag of the overlap priced (planner.export.megatron.moe_overlap_args).

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


# Megatron-Core's spelling of each dispatcher (--moe-token-dispatcher-type; flex with the DeepEP backend is the
# per-node deduplicated one); the batch-level EP overlap runs with alltoall and flex, the shared-expert overlap with
# alltoall only (megatron/core/transformer/transformer_config.py, megatron-core 0.16.1, __post_init__:
# 'overlap_moe_expert_parallel_comm is supported with alltoall/flex token dispatcher' (line 1866),
# 'moe_shared_expert_overlap only works with alltoall token dispatcher.' (line 1090)).
OVERLAPPED_DISPATCHERS = ("alltoall", "flex")
SHARED_OVERLAP_DISPATCHERS = ("alltoall",)


def batch_overlap_applies(needs: tuple[str, ...], *, pp: int, vpp: int, recompute: str, full_layers: bool,
                          precision: str, modules: tuple[str, ...] = (), mtp_layers: int = 0) -> bool:
    """Whether a stack whose batch-level overlap (behaviour.overlap.moe_all_to_all) comes with the conditions
    `needs` (behaviour.overlap.moe_all_to_all_needs) runs it for this layout. Megatron-Core's
    TransformerConfig.__post_init__ (megatron/core/transformer/transformer_config.py, megatron-core 0.16.1, lines
    1852-1891) asserts, with overlap_moe_expert_parallel_comm: virtual_pipeline_model_parallel_size set when
    pipeline_model_parallel_size > 1 (interleaved_when_pp), recompute_granularity != 'full' and no
    recompute_method / recompute_num_layers (no_full_recompute: `recompute` the base mode, `full_layers` whether
    any layer is fully recomputed on top of it), bf16 or fp16 (half_precision), mtp_num_layers None or 1
    (single_mtp_layer: `mtp_layers`); Megatron-LM d98e8a64 (2026-08) adds "moe" not in recompute_modules
    (no_moe_recompute: `modules`, what a selective recompute reruns). Its other conditions (ep > 1, the
    alltoall/flex dispatcher, no shared-expert overlap) are `choose`'s."""
    return not unmet_needs(needs, pp=pp, vpp=vpp, recompute=recompute, full_layers=full_layers, precision=precision,
                           modules=modules, mtp_layers=mtp_layers)


def unmet_needs(needs: tuple[str, ...], *, pp: int, vpp: int, recompute: str, full_layers: bool, precision: str,
                modules: tuple[str, ...] = (), mtp_layers: int = 0) -> list[str]:
    """The conditions of `needs` this layout breaks (batch_overlap_applies), in `needs` order."""
    refused = {"interleaved_when_pp": pp > 1 and vpp <= 1,
               "no_full_recompute": recompute == "full" or full_layers,
               "half_precision": precision == "fp32",
               "no_moe_recompute": recompute == "selective" and "moe" in modules,
               "single_mtp_layer": mtp_layers > 1}
    return [need for need in needs if refused[need]]


def routed_node_limit(cfg: MoESpec, group: GroupLink) -> int | None:
    """The most nodes of the EP group one token's experts can be on under group-limited routing (num_groups,
    group_topk: DeepSeek-V2/V3 n_group / topk_group), where every node of the group holds whole expert groups
    (experts laid out in order over the EP ranks, Megatron-Core's and DeepSeek's placement): a token uses
    group_topk groups, so at most that many nodes. None where routing is not group-limited or groups straddle
    nodes."""
    if not cfg.num_groups or not cfg.group_topk or not group.spans_nodes or group.num_nodes <= 1:
        return None
    per_node = cfg.num_experts / group.num_nodes
    per_group = cfg.num_experts / cfg.num_groups
    if per_node < per_group or per_node % per_group:
        return None
    return min(group.num_nodes, cfg.group_topk)


def dispatch_options(tokens: float, cfg: MoESpec, hidden: int, *, group: GroupLink, hierarchical: bool,
                     allgather: bool, value_bytes: float = ACT_BYTES, gather_ranks: int = 1) -> dict[str, float]:
    """One dispatch (or combine) of `tokens` tokens of this rank by each dispatcher the stack runs, by its
    Megatron-Core name (`value_bytes` per element: bf16, or fp8 with its scales under fp8 dispatch); {} for ep 1.
    `gather_ranks`: the expert-TP ranks behind each EP rank where each TP rank dispatches its own tokens
    (planner.cost.moe_layer): the all-gather dispatcher gathers all of theirs (its tp x ep group), the flex one
    sends each copy on to all of them inside the destination node (comm.hierarchical_all_to_all_s fanout)."""
    if group.size <= 1:
        return {}
    routed_bytes = tokens * cfg.top_k * load_factor(cfg) * hidden * value_bytes
    options = {"alltoall": comm.all_to_all_s(routed_bytes, group=group)}
    if hierarchical:
        options["flex"] = comm.hierarchical_all_to_all_s(routed_bytes, top_k=cfg.top_k, group=group,
                                                         max_nodes=routed_node_limit(cfg, group), fanout=gather_ranks)
    if allgather:
        options["allgather"] = comm.all_gather_s(tokens * gather_ranks * group.size * hidden * value_bytes, group=group)
    return options


def dispatch_s(tokens: float, cfg: MoESpec, hidden: int, *, group: GroupLink, hierarchical: bool,
               allgather: bool, value_bytes: float = ACT_BYTES, gather_ranks: int = 1) -> float:
    """One dispatch (or combine): the fastest dispatcher the stack runs (dispatch_options)."""
    options = dispatch_options(tokens, cfg, hidden, group=group, hierarchical=hierarchical, allgather=allgather,
                               value_bytes=value_bytes, gather_ranks=gather_ranks)
    return min(options.values(), default=0.0)


def choose(options: dict[str, tuple[float, float]], *, layer_s: tuple[float, float], shared_s: tuple[float, float],
           batch_overlap: bool, shared_overlap: bool,
           unhidden: dict[str, tuple[float, float]] | None = None) -> tuple[str | None, float, float]:
    """(dispatcher, exposed forward s, exposed backward s): of the dispatchers' (forward, backward) communication,
    the one least exposed once the stack's overlaps apply: the batch-level one with alltoall and flex
    (OVERLAPPED_DISPATCHERS), the shared-expert one with alltoall (SHARED_OVERLAP_DISPATCHERS), never both (Megatron-Core
    asserts 'disable moe_shared_expert_overlap when enabling overlap_moe_expert_parallel_comm', transformer_config.py
    line 1886); ties go to the first (alltoall). `unhidden`: a dispatcher's (forward, backward) communication that no
    overlap hides (planner.cost.moe_layer.unhidden_s), added exposed. Without options (ep 1): (None, and the
    alltoall entry of `unhidden`, what the export's default dispatcher still runs: megatron_model._moe_args)."""
    if not options:
        return (None, *(unhidden or {}).get("alltoall", (0.0, 0.0)))
    best: tuple[str | None, float, float] = (None, 0.0, 0.0)
    for name, (fwd, bwd) in options.items():
        kw = dict(batch_overlap=batch_overlap and name in OVERLAPPED_DISPATCHERS,
                  shared_overlap=shared_overlap and name in SHARED_OVERLAP_DISPATCHERS)
        extra = (unhidden or {}).get(name, (0.0, 0.0))
        exposed = (name, extra[0] + exposed_s(fwd, layer_compute_s=layer_s[0], shared_compute_s=shared_s[0], **kw),
                   extra[1] + exposed_s(bwd, layer_compute_s=layer_s[1], shared_compute_s=shared_s[1], **kw))
        if best[0] is None or exposed[1] + exposed[2] < best[1] + best[2]:
            best = exposed
    return best


def exposed_s(comm_s: float, *, layer_compute_s: float, shared_compute_s: float, batch_overlap: bool,
              shared_overlap: bool) -> float:
    """The part of a layer's MoE communication (one direction) not hidden behind compute: the batch-level overlap
    where it runs, else the shared-expert one (Megatron-Core runs one of the two)."""
    if batch_overlap:
        return max(0.0, comm_s - layer_compute_s)
    if shared_overlap:
        return max(0.0, comm_s - shared_compute_s)
    return comm_s


# DeepEP's Buffer as Megatron-Core's flex dispatcher allocates it (megatron/core/transformer/moe/fused_a2a.py get_buffer:
# the larger of the dispatch and combine configurations' size hints for the tp x ep group, hidden bytes = hidden x
# max(element size, 2)). DeepEP deep_ep/buffers/legacy.py get_dispatch_config / get_combine_config (dd758ca,
# 2026-07-14; deep_ep/buffer.py at 92fe2de, 2025-11-05, the same): (nvl send, nvl recv, rdma send, rdma recv) chunk
# tokens by group size, any other size asserting 'Unsupported number of EP ranks'; Buffer.num_sms 20 (Megatron-Core
# moe_deepep_num_sms), 8 NVLink peers (csrc/kernels/legacy/compiled.cuh LEGACY_NUM_MAX_NVL_PEERS).
DEEPEP_DISPATCH = {2: (24, 256, 6, 128), 4: (6, 256, 6, 128), 8: (6, 256, 6, 128), 16: (36, 288, 20, 128),
                   24: (32, 288, 8, 128), 32: (32, 288, 8, 128), 48: (32, 288, 8, 128), 64: (32, 288, 8, 128),
                   96: (20, 480, 12, 128), 128: (20, 560, 12, 128), 144: (32, 720, 12, 128), 160: (28, 720, 12, 128)}
DEEPEP_COMBINE = {2: (10, 256, 6, 128), 4: (9, 256, 6, 128), 8: (4, 256, 6, 128), 16: (4, 288, 12, 128),
                  24: (1, 288, 8, 128), 32: (1, 288, 8, 128), 48: (1, 288, 8, 128), 64: (1, 288, 8, 128),
                  96: (1, 480, 8, 128), 128: (1, 560, 8, 128), 144: (2, 720, 8, 128), 160: (2, 720, 8, 128)}
DEEPEP_SMS = 20
DEEPEP_NVL_PEERS = 8
# csrc/legacy/config.hpp size hints: per received token the hidden bytes, an 8-byte SourceMeta (internode.cu), 128
# top-k indices (int64 topk_idx_t) and weights (fp32) and 128 fp32 scales (kNumMaxTopK, kNumMaxScales); RDMA adds an
# int4 per token and holds send and receive copies (x 2)
DEEPEP_TOKEN_EXTRA_BYTES = 8 + 128 * (8 + 4) + 128 * 4


def deepep_buffer_bytes(hidden: int, ranks: int) -> float:
    """Device bytes of DeepEP's NVLink and RDMA buffers for a tp x ep group of `ranks` (csrc/legacy/config.hpp
    Config::get_nvl_buffer_size_hint and get_rdma_buffer_size_hint, the larger of dispatch and combine, each rounded
    up to 128 bytes): allocated outside PyTorch's caching allocator, for the whole run. 0 for a group size DeepEP
    has no configuration for (deepep_runs)."""
    if not deepep_runs(ranks):
        return 0.0
    channels, token = DEEPEP_SMS // 2, hidden * 2 + DEEPEP_TOKEN_EXTRA_BYTES
    nvl_ranks, rdma_ranks = min(ranks, DEEPEP_NVL_PEERS), max(ranks // DEEPEP_NVL_PEERS, 1)
    nvl = rdma = 0
    for _, nvl_recv, rdma_send, rdma_recv in (DEEPEP_DISPATCH[ranks], DEEPEP_COMBINE[ranks]):
        nvl = max(nvl, _round128(channels * nvl_ranks * ((2 * rdma_ranks + 3) * 4 + nvl_recv * token)))
        if ranks > DEEPEP_NVL_PEERS:
            rdma_recv = -(-rdma_recv // rdma_send) * rdma_send  # Config's constructor aligns it up to the send chunk
            rdma = max(rdma, _round128(channels * rdma_ranks * ((DEEPEP_NVL_PEERS * 2 + 2) * 2 * 4
                                                                + rdma_recv * (token + 16) * 2)))
    return float(nvl + rdma)


def deepep_runs(ranks: int) -> bool:
    """Whether DeepEP has a configuration for a group of `ranks` (DEEPEP_DISPATCH)."""
    return ranks in DEEPEP_DISPATCH


def flex_refusal(ranks: int) -> str:
    """Why a stated flex (DeepEP) dispatcher cannot run for a tp x ep group of `ranks`, with the fix."""
    sizes = ", ".join(map(str, DEEPEP_DISPATCH))
    return (f"moe_dispatcher='flex': DeepEP's Buffer has no configuration for a tp x ep group of {ranks} ranks "
            f"(deep_ep get_dispatch_config: {sizes}): change ep or tp, or pass --moe-dispatcher alltoall")


def _round128(num_bytes: int) -> int:
    return (num_bytes + 127) // 128 * 128
