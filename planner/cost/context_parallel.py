"""Context parallelism's communication per flavour, as the stacks implement it; the fastest flavour the stack runs
(capabilities.context_parallel.flavours) is taken, since the flavour is a setting the plan chooses.

Each rank holds s/cp tokens (causally load-balanced: Megatron-Core splits the sequence into 2cp chunks and gives
rank i chunks i and 2cp-1-i, megatron/training/utils.py get_batch_on_this_cp_rank; torch's context_parallel does
the same with its load balancer on, torchtitan's default), so every rank does the same attention work, which
compute.attention_gemms prices at the kernel's measured rate on blocks of s/cp tokens (compute.attention_seq_factor,
profiles/kernels-h100.json). The flavours:
- ring (Megatron-Core / Transformer Engine `--cp-comm-type p2p`, the default: AttnFuncWithCPAndKVP2P; torch's
  ring attention with `rotate_method` "alltoall", torchtitan `--parallelism.context_parallel_rotate_method
  alltoall`): cp - 1 steps each passing this rank's K and V chunk to the next rank while the previous chunk's
  attention computes (Liu et al. 2023, Ring Attention); the backward passes K, V and their gradients. Exposed:
  max(0, transfers - attention core).
- all-gather (TE `all_gather`: AttnFuncWithCPAndKVAllGather; torch's `rotate_method` "allgather", torchtitan's
  default): the K and V of all ranks gathered before the blockwise attention, only the local block's attention
  beside it; the backward gathers them again and reduce-scatters their gradients. Exposed: max(0, transfer -
  attention core / cp).
- all-to-all by heads (TE `a2a`, DeepSpeed-Ulysses, Jacobs et al. 2023): Q, K, V re-split from sequence to heads
  before the attention and the output back after it (needs heads divisible by cp), the backward the same bytes;
  nothing overlaps it. `a2a+p2p` (TE's hierarchical) is not priced: it is left out of the choices (options).
The flavour chosen is the plan's (Parallelism.cp_comm_type) and the Megatron export writes it (--cp-comm-type).
"""

from __future__ import annotations

from planner.cost import comm
from planner.topology.groups import GroupLink

# A profile's flavour names -> the mechanism priced.
FLAVOURS = {"p2p": "ring", "alltoall": "ring", "all_gather": "allgather", "allgather": "allgather", "a2a": "heads",
            "ulysses": "heads"}


def ring_s(*, kv_bytes: float, cp: int, group: GroupLink, core_fwd_s: float, core_bwd_s: float) -> tuple[float, float]:
    fwd = (cp - 1) * comm.p2p_s(kv_bytes, group=group)
    bwd = (cp - 1) * comm.p2p_s(2 * kv_bytes, group=group)
    return max(0.0, fwd - core_fwd_s), max(0.0, bwd - core_bwd_s)


def allgather_s(*, kv_bytes: float, cp: int, group: GroupLink, core_fwd_s: float, core_bwd_s: float) -> tuple[float, float]:
    gather = comm.all_gather_s(kv_bytes * cp, group=group)
    bwd = gather + comm.reduce_scatter_s(kv_bytes * cp, group=group)
    return max(0.0, gather - core_fwd_s / cp), max(0.0, bwd - core_bwd_s / cp)


def heads_s(*, q_bytes: float, kv_bytes: float, group: GroupLink) -> tuple[float, float]:
    one = comm.all_to_all_s(2 * q_bytes + kv_bytes, group=group)  # Q and the output (a heads), K and V (kv heads)
    return one, one


def options(flavours: tuple[str, ...], *, q_bytes: float, kv_bytes: float, cp: int, heads: int, kv_heads: int,
            group: GroupLink, core_fwd_s: float, core_bwd_s: float) -> dict[str, tuple[float, float]]:
    """(forward, backward) exposed CP communication of one layer and micro-batch by each flavour the stack runs,
    keyed by the profile's spelling (the first of each mechanism); a flavour FLAVOURS does not price (TE's a2a+p2p)
    is left out, not priced as another, and a heads split the head counts do not allow is left out."""
    out: dict[str, tuple[float, float]] = {}
    seen = set()
    for flavour in flavours or ("p2p",):
        kind = FLAVOURS.get(flavour)
        if kind is None or kind in seen:
            continue
        seen.add(kind)
        if kind == "ring":
            out[flavour] = ring_s(kv_bytes=kv_bytes, cp=cp, group=group, core_fwd_s=core_fwd_s, core_bwd_s=core_bwd_s)
        elif kind == "allgather":
            out[flavour] = allgather_s(kv_bytes=kv_bytes, cp=cp, group=group, core_fwd_s=core_fwd_s, core_bwd_s=core_bwd_s)
        elif heads % cp == 0 and kv_heads % cp == 0:
            out[flavour] = heads_s(q_bytes=q_bytes, kv_bytes=kv_bytes, group=group)
    return out


def choose(flavours: tuple[str, ...], **kwargs) -> tuple[str | None, float, float]:
    """(flavour, exposed forward s, exposed backward s): the least exposed of `options` (the first on a tie);
    (None, 0, 0) for cp 1. Where no flavour is left (only a heads split the head counts do not allow), ring
    attention's bytes with nothing hidden, under no flavour name."""
    if kwargs["cp"] <= 1:
        return None, 0.0, 0.0
    found = options(flavours, **kwargs)
    if not found:
        fwd, bwd = ring_s(kv_bytes=kwargs["kv_bytes"], cp=kwargs["cp"], group=kwargs["group"], core_fwd_s=0.0, core_bwd_s=0.0)
        return None, fwd, bwd
    name = min(found, key=lambda f: sum(found[f]))
    return (name, *found[name])


def exposed_s(flavours: tuple[str, ...], **kwargs) -> tuple[float, float]:
    """(forward, backward) exposed CP communication of one layer and micro-batch: the least over the stack's
    flavours (choose). `q_bytes`, `kv_bytes`: this rank's Q (or output) and K+V bytes."""
    _, fwd, bwd = choose(flavours, **kwargs)
    return fwd, bwd
