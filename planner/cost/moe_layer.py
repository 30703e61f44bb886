"""What an MoE layer runs per micro-batch besides its expert GEMMs and its EP dispatch/combine, as the stacks run it
(behaviour.moe of the stack's profile; CostOptions.moe_sp_dispatch, moe_count_exchange):

- Sequence-parallel dispatch (Megatron-Core, megatron/core/transformer/moe/token_dispatcher.py,
  MoEAlltoAllTokenDispatcher, megatron-core 0.16.1): under tp with sequence parallelism the MoE layer's input is
  each TP rank's sequence shard (moe_layer.py MoELayer.forward refuses tp > 1 without sp in training); the router
  runs on that shard, the EP all-to-all sends its routed tokens (compute.Shape.moe_tokens), then
  `dispatch_postprocess` all-gathers the received tokens over the expert-TP group (pg_collection.expt_tp, size
  expert_tensor_parallel_size, which defaults to tp: model_parallel_config.py __post_init__) and
  `combine_preprocess` reduce-scatters the experts' output over the same group before the combine all-to-all;
  backward runs the reverse of each (gather_from_sequence_parallel_region / reduce_scatter_to_sequence_parallel_region,
  megatron/core/tensor_parallel/mappings.py). The routed part of the layer has no TP all-gather/reduce-scatter of
  the dense MLP's kind; the shared experts (shared_experts.py SharedExpertMLP, column/row-parallel linears under sp)
  keep theirs. Under --overlap-moe-expert-parallel-comm the expert-TP collectives stay on the compute stream
  (megatron/core/models/gpt/fine_grained_callables.py: submodule_moe_forward runs routed_experts_compute, only the
  dispatch and combine nodes are communication), so they are priced exposed. The all-gather and flex dispatchers
  gather over the tp x ep group instead (MoEAllGatherTokenDispatcher, MoEFlexTokenDispatcher): no separate
  expert-TP collective.
- Token-count exchange before each dispatch (forward only, under no_grad): Megatron-Core's alltoall dispatcher
  all-gathers every rank's tokens-per-expert counts (num_experts int64) over the tp x ep group
  (MoEAlltoAllTokenDispatcher.preprocess); torchtitan all-to-alls them over the EP group
  (AllToAllTokenDispatcher._token_count_exchange, torchtitan/models/common/token_dispatcher.py). A latency-bound
  collective per MoE layer per micro-batch, priced on the EP link (the tp ranks of Megatron's tp x ep group are
  left out: a lower bound of its steps).
"""

from __future__ import annotations

import dataclasses

from planner.cost import comm, compute
from planner.cost.layer_terms import Env
from planner.topology.groups import GroupLink

COUNT_BYTES = 8  # int64 tokens-per-expert counts (routing_map.sum(dim=0).long(); torchtitan's counts likewise)


def expert_tp_link(env: Env) -> GroupLink:
    """The expert-TP group: etp consecutive ranks of the TP group (Megatron-Core's expert RankGenerator, with the
    default order 'tp-cp-ep-dp-pp' and cp 1, puts expert TP innermost: parallel_state.py initialize_model_parallel)."""
    tp, etp = env.links.tp, env.shape.etp
    if etp >= tp.size:
        return tp
    per_node = min(tp.ranks_per_node, etp)
    return dataclasses.replace(tp, size=etp, ranks_per_node=per_node, num_nodes=-(-etp // per_node))


def expert_tp_s(env: Env) -> float:
    """One direction of the expert-TP collectives of a sequence-parallel dispatch (module docstring): an
    all-gather and a reduce-scatter of the expert-side rows of h (compute.moe_rows), 16-bit; 0 where the stack
    dispatches replicated tokens or etp is 1."""
    shape = env.shape
    if not shape.moe_sp_dispatch or shape.etp <= 1 or env.spec.moe is None:
        return 0.0
    num_bytes = compute.moe_rows(env.spec, shape)[1] * env.spec.hidden_size * compute.ACT_BYTES
    link = expert_tp_link(env)
    return comm.all_gather_s(num_bytes, group=link) + comm.reduce_scatter_s(num_bytes, group=link)


def count_exchange_s(env: Env, kind: str) -> float:
    """The forward token-count exchange (module docstring) by the stack's collective: "all_gather" (Megatron-Core)
    or "all_to_all" (torchtitan) of num_experts int64 per rank over the EP link; 0 for "none" or ep 1."""
    group, cfg = env.links.ep, env.spec.moe
    if kind == "none" or cfg is None or group.size <= 1:
        return 0.0
    per_rank = cfg.num_experts * COUNT_BYTES
    if kind == "all_gather":
        return comm.all_gather_s(per_rank * group.size, group=group)
    return comm.all_to_all_s(per_rank, group=group)


def unhidden_s(env: Env, kind: str) -> dict[str, tuple[float, float]]:
    """{dispatcher: (forward, backward) s} of the MoE communication no EP overlap hides: the alltoall
    dispatcher's expert-TP collectives and token-count exchange (the other dispatchers gather over tp x ep and
    exchange their counts inside their own kernels)."""
    etp = expert_tp_s(env)
    return {"alltoall": (etp + count_exchange_s(env, kind), etp)}


def ffn_tp_collectives(spec, shape: compute.Shape, *, moe_layer: bool) -> float:
    """T*h TP collective pairs (all-reduce equivalents) of a layer's FFN block: 1 for a dense MLP or an MoE block
    whose tokens are replicated over tp (its input gathered and its output reduced over tp once: torchtitan's MoE
    wrapper, torchtitan/models/common/moe_sharding.py set_moe_sharding_config); under a sequence-parallel
    dispatch only the shared experts' own pair (SharedExpertMLP; 0 without shared experts): the routed tokens'
    collectives are the dispatcher's (layer_terms.ep_options, unhidden_s; with ep 1 the alltoall dispatcher's
    expert-TP all-gather/reduce-scatter, moe_comm.choose)."""
    if moe_layer and shape.moe_sp_dispatch and spec.moe is not None:
        return 1.0 if spec.moe.shared_ffn_hidden_size else 0.0
    return 1.0
