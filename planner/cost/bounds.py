"""What the search's bounds ask of the cost model: single terms of `evaluate` without building a Detail, and
per-module costs that are at most a candidate's under every placement of its groups. The top of planner/cost:
nothing in it imports this module; planner/search calls these functions with the CostModel.

Placement floor. A module's cost reads the links of the tp, cp and ep groups only (planner.cost.layers). tp is
innermost in every axis order of the search's space, so its groups are the same ranks under every order (the
real tp link is used). A cp or ep group of n ranks lives on the dp x cp ranks of one tp coordinate: at most
g = gpus_per_node / tp of them share a node, so its worst group has rpn <= min(n, g) ranks on one node and
nodes >= ceil(n / rpn) nodes (one node exactly when rpn = n). For a fixed rpn the collectives of
planner.cost.comm read the node count only through "spans nodes" and the latency that goes with it, both least
at the fewest nodes. So the least time over rpn in 1..min(n, g) at ceil(n / rpn) nodes is at most the time of
every placement: `floor_links` takes, per group, the footprint that gives the least EP all-to-all (forward and
backward) and the least CP ring transfer (exposed CP time is max(0, transfer - attention), increasing in the
transfer); where no single footprint gives the least of both directions the group's communication is taken
as free (a single-rank link), still a lower bound. dp and pp get single-rank links: modules do not read them.
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import autocast, comm, compute, mixers, p2p
from planner.cost import moe_layer as moe_layer_terms
from planner.cost import layer_terms as T
from planner.cost.arrays import MODULE_FIELDS, layer_costs_with, layer_kinds, module_params_of, module_table, rows_of
from planner.cost.static_bytes import static_parts
from planner.cost.evaluate import dp_exposed, dp_exposed_rows, dp_fits
from planner.models import counting
from planner.schedules import schedule as schedule_of
from planner.topology.groups import GroupLink
from planner.topology.placement import axis_link, make_link

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate, LayerCosts


@dataclasses.dataclass(frozen=True)
class _DpTerms:
    """(slope, intercept) of the dense and expert gradient reduction time and of its ZeRO-1/2 weight-gather part
    (the fields dp_exposed reads)."""

    dp_dense: tuple[float, float]
    dp_expert: tuple[float, float]
    gather_dense: tuple[float, float]
    gather_expert: tuple[float, float]


def _memo(model: "CostModel", key: tuple, make):
    found = model.memo.get(key)
    if found is None:
        found = model.memo[key] = make()
    return found


def _order(cand: "Candidate") -> tuple[str, ...]:
    """What of the axis order the floor depends on: nothing with tp innermost (module docstring)."""
    return () if cand.axis_order[-1] == "tp" else tuple(cand.axis_order)


def _alone(like: GroupLink) -> GroupLink:
    return dataclasses.replace(like, size=1, ranks_per_node=1, num_nodes=1)


def _footprints(model: "CostModel", cand: "Candidate", size: int) -> tuple[GroupLink, ...]:
    """A link for every (rpn, fewest nodes) a group of `size` ranks of one tp coordinate can have (docstring)."""
    def make() -> tuple[GroupLink, ...]:
        topo = model.topology
        gpn = topo.gpus_per_node
        if cand.world_size <= gpn:  # every rank on one node: the only footprint (no inter-node link to price)
            return (make_link(topo, size=size, num_nodes=1, ranks_per_node=size),)
        share = gpn // cand.tp if gpn % cand.tp == 0 else gpn
        return tuple(make_link(topo, size=size, num_nodes=1 if rpn == size else max(2, math.ceil(size / rpn)),
                               ranks_per_node=rpn) for rpn in range(1, min(size, share) + 1))

    return _memo(model, ("footprints", size, cand.tp, cand.world_size), make)


def _env(model: "CostModel", cand: "Candidate", tp: GroupLink, *, cp: GroupLink | None = None,
         ep: GroupLink | None = None, cal=None, overlap: str | None = None) -> T.Env:
    """The Env of the candidate's shape with these tp, cp and ep links (others single-rank)."""
    alone = _memo(model, ("alone", tp), lambda: _alone(tp))
    links = T.Links(tp=tp, cp=cp or alone, ep=ep or alone, dp=alone, expert_dp=alone, pp=alone)
    return T.Env(spec=model.spec, device=model.device, cal=cal or model.cal, precision=model.request.precision,
                 shape=model.shape(cand), links=links, tp_overlap=overlap or cand.tp_overlap,
                 stack_tp_overlap=model.options.tp_overlap, moe_overlap=model.options.moe_overlap,
                 selective_mode=model.options.selective_mode,
                 moe_hierarchical=model.options.moe_hierarchical,
                 moe_dispatch_fp8=cand.compression.has("fp8-dispatch"),
                 moe_allgather=model.options.moe_allgather, moe_shared_overlap=model.options.moe_shared_overlap,
                 moe_count_exchange=model.options.moe_count_exchange,
                 cp_flavours=model.options.cp_flavours, fp8_casts=model.options.fp8_casts,
              fp8_16bit_gemms=model.options.fp8_16bit_gemms)


def _least(options: tuple[GroupLink, ...], cost) -> GroupLink | None:
    """The option with the least (forward, backward) cost in both directions; None when none has both."""
    times = [cost(link) for link in options]
    fwd, bwd = min(t[0] for t in times), min(t[1] for t in times)
    for link, (f, b) in zip(options, times):
        if f <= fwd and b <= bwd:
            return link
    return None


def _tp_link(model: "CostModel", cand: "Candidate") -> GroupLink:
    return _memo(model, ("tp_link", cand.tp, cand.world_size, _order(cand)),
                 lambda: axis_link(model.topology, cand.sizes(), tuple(cand.axis_order), "tp"))


def floor_links(model: "CostModel", cand: "Candidate") -> T.Links:
    """The candidate's tp link and the cheapest footprints of its cp and ep groups (module docstring)."""
    key = ("floor_links", cand.tp, cand.cp, cand.ep, cand.microbatch_size, cand.sp, cand.world_size, _order(cand))
    found = model.memo.get(key)
    if found is not None:
        return found
    tp = _tp_link(model, cand)
    cp = ep = None
    if cand.cp > 1:
        cp = _least(_footprints(model, cand, cand.cp), lambda link: T.cp_times(_env(model, cand, tp, cp=link), 0.0))
    if cand.ep > 1:
        ep = _least(_footprints(model, cand, cand.ep), lambda link: T.ep_times(_env(model, cand, tp, ep=link)))
    found = model.memo[key] = _env(model, cand, tp, cp=cp, ep=ep).links
    return found


def floor_costs(model: "CostModel", cand: "Candidate") -> "LayerCosts":
    """layer_costs under floor_links: every time at most the candidate's under any placement of its groups
    (memory arrays and static bytes are the candidate's). Shared by every axis order."""
    sched = schedule_of(cand.schedule)
    key = ("floor_costs", *model.layout_key(cand)[:-2], _order(cand), sched.weight_versions,
           sched.v_placed)  # a V keeps no tied copy (arrays.module_params_of)
    return _memo(model, key, lambda: layer_costs_with(model, cand, floor_links(model, cand),
                                                      overlap=model.options.moe_overlap))


def compute_rows(model: "CostModel", cand: "Candidate") -> np.ndarray:
    """(forward, backward) compute seconds per module (no communication): the same under every layout."""
    key = ("compute_rows", cand.tp, cand.cp, cand.ep, cand.microbatch_size, cand.sp, cand.tp_overlap)
    rows = [MODULE_FIELDS.index("compute_fwd_s"), MODULE_FIELDS.index("compute_bwd_s")]
    return _memo(model, key, lambda: module_table(model, cand, floor_links(model, cand),
                                                  overlap=model.options.moe_overlap)[rows])


def held_static_bytes(model: "CostModel", cand: "Candidate") -> np.ndarray:
    """Per-module static bytes held at the memory peak with the activations: params + grads + optimizer states,
    less the grads where the amp-bf16 peak comes before any exist (planner.cost.autocast); what a rank holds at
    least besides in-flight activations and other bytes."""
    def make():
        weights, grads, optimizer = static_parts(model, cand, *module_params_of(model, cand))
        if model.request.precision == autocast.RECIPE and autocast.grads_absent_at_activation_peak(
                dp=cand.dp, cp=cand.cp, zero_stage=cand.zero_stage, num_microbatches=cand.num_microbatches):
            grads = 0.0 * grads
        held = weights + grads + optimizer
        held.setflags(write=False)
        return held

    key = ("held", cand.dp, cand.tp, cand.pp, cand.ep, cand.cp, cand.zero_stage, cand.num_microbatches == 1,
           schedule_of(cand.schedule).weight_versions)
    return _memo(model, key, make)


def pp_comm_floor_s(model: "CostModel", cand: "Candidate") -> float:
    """pp_comm_s over the cheapest footprint a pp group of the candidate's size can have (module docstring: a
    point-to-point send, bytes / bandwidth + latency, reads the node count only through "spans nodes"): at most
    pp_comm_s under every placement."""
    return pp_comm_floors_s(model, cand, [(cand.schedule, cand.vpp)])[0]


def pp_comm_floors_s(model: "CostModel", cand: "Candidate", variants: list[tuple[str, int]]) -> list[float]:
    """pp_comm_floor_s of the candidate under each (schedule, vpp) of `variants`: one send over the cheapest
    footprint (it reads the micro-batch shape, not the schedule), times each schedule's sequential transfers."""
    def send() -> float:
        size = p2p.p2p_bytes(model, cand)
        return min(comm.p2p_s(size, group=link) for link in _footprints(model, cand, cand.pp))

    key = ("p2p_floor", cand.microbatch_size, cand.tp, cand.cp, cand.sp, cand.pp, cand.world_size)
    out = []
    for name, vpp in variants:
        transfers = schedule_of(name).p2p_transfers(pp=cand.pp, vpp=vpp, num_microbatches=cand.num_microbatches,
                                                    overlapped=model.options.pp_overlap)  # planner.cost.p2p.p2p_transfers
        out.append(0.0 if transfers == 0 else 2 * transfers * _memo(model, key, send))
    return out


def dp_exposed_s(model: "CostModel", cand: "Candidate", ranks: np.ndarray, *, floor: bool = False) -> float:
    """The breakdown's dp_comm_exposed_s with module i on pipeline rank ranks[i] (evaluate's formula), without
    the candidate's Detail: per-rank sums memoised per shape and split, the reduction's (slope, intercept) per
    ZeRO stage and links. With `floor`, the least over the footprints the dp axis's groups can have (module
    docstring: the ring all-reduce, reduce-scatter and all-gather read the node count through "spans nodes" and
    the inter-node ring over the nodes, both least at the fewest nodes), at most the time under every placement:
    the dp x cp reduction runs on the dp axis's footprint (planner.cost.links), the exposure grows with it."""
    row = _dp_rows(model, cand, ranks)
    if floor and cand.dp_replicate > 1:  # HSDP: no footprint floor derived for its two groups; 0 is a floor
        return 0.0
    if not floor:
        links = model.links(cand)
        return float(dp_exposed(model, cand, _dp_terms(model, cand, links.dp, links.expert_dp, links.dp_replicate), row))
    return float(dp_exposed_rows(model, cand, _floor_terms(model, cand), row).max(axis=-1).min())


def dp_split_rows(model: "CostModel", cands: list["Candidate"], splits: list[np.ndarray]) -> dict[str, np.ndarray]:
    """The per-rank parameter and compute sums dp_exposed reads, of each candidate with its modules on the ranks of
    its split (the variants of one group: they differ in vpp and schedule only), as rows (split, rank): one bincount
    per sum, each bin added in the order a single split's bincount adds it."""
    pp, count = cands[0].pp, len(splits)
    index = np.concatenate([ranks + i * pp for i, ranks in enumerate(splits)])
    params = [module_params_of(model, each) for each in cands]  # a V keeps no tied copy of the embedding
    fwd, bwd = compute_rows(model, cands[0])

    def sums(weights: np.ndarray) -> np.ndarray:
        return np.bincount(index, weights=weights, minlength=count * pp).reshape(count, pp)

    return {"dense": sums(np.concatenate([dense for dense, _ in params])),
            "expert": sums(np.concatenate([expert for _, expert in params])),
            "bwd_compute": sums(np.tile(bwd, count)), "compute": sums(np.tile(fwd + bwd, count))}


def dp_exposed_floors_s(model: "CostModel", cand: "Candidate", rows: dict[str, np.ndarray]) -> list[float]:
    """dp_exposed_s(floor=True) at the candidate's ZeRO stage under each split of dp_split_rows' `rows`, in one
    array operation: (footprint, split, rank)."""
    if cand.dp_replicate > 1:
        return [0.0] * len(rows["dense"])
    terms = _floor_terms(model, cand)
    columns = _DpTerms(*((slope[:, :, None], intercept[:, :, None]) for slope, intercept in
                         (getattr(terms, f.name) for f in dataclasses.fields(_DpTerms))))
    return dp_exposed_rows(model, cand, columns, rows).max(axis=-1).min(axis=0).tolist()


def _dp_rows(model: "CostModel", cand: "Candidate", ranks: np.ndarray) -> dict:
    """Per-rank sums of the parameters and compute dp_exposed reads, memoised per shape and split."""
    def rows() -> dict:
        dense, expert = module_params_of(model, cand)
        fwd, bwd = compute_rows(model, cand)
        pp = cand.pp
        return {"dense": np.bincount(ranks, weights=dense, minlength=pp),
                "expert": np.bincount(ranks, weights=expert, minlength=pp),
                "bwd_compute": np.bincount(ranks, weights=bwd, minlength=pp),
                "compute": np.bincount(ranks, weights=fwd + bwd, minlength=pp)}

    return _memo(model, ("dp_rows", cand.tp, cand.cp, cand.ep, cand.pp, cand.microbatch_size, cand.sp,
                         cand.tp_overlap, ranks.tobytes()), rows)


def _floor_terms(model: "CostModel", cand: "Candidate") -> _DpTerms:
    """The dp and expert-dp fits over every footprint of the dp axis's groups, as columns (module docstring)."""
    edp = cand.expert_dp
    key = (cand.dp, cand.tp, cand.world_size, cand.cp, edp)  # what the footprints' dp and expert-dp links read
    links = _memo(model, ("dp_floor_links", *key), lambda: tuple(
        (dataclasses.replace(link, size=cand.dp_cp), dataclasses.replace(link, size=edp))
        for link in _footprints(model, cand, cand.dp)))
    m = cand.num_microbatches if cand.zero_stage >= 2 else 0  # what _dp_terms reads of the candidate, as its key
    return _memo(model, ("dp_floor_terms", cand.zero_stage, m, *key), lambda: _columns(
        [_dp_terms(model, cand, dp, expert_dp) for dp, expert_dp in links]))


def _columns(terms: list[_DpTerms]) -> _DpTerms:
    """The (slope, intercept) fits of several links as columns: dp_exposed_rows then gives one row per link."""
    def column(field: str) -> tuple[np.ndarray, np.ndarray]:
        fits = np.array([getattr(t, field) for t in terms], dtype=np.float64)
        return fits[:, :1], fits[:, 1:]

    return _DpTerms(*(column(f.name) for f in dataclasses.fields(_DpTerms)))


def _dp_terms(model: "CostModel", cand: "Candidate", dp: GroupLink, expert_dp: GroupLink,
              replicate: GroupLink | None = None) -> _DpTerms:
    links = T.Links(tp=dp, cp=dp, ep=dp, dp=dp, expert_dp=expert_dp, pp=dp, dp_replicate=replicate)  # what dp_comm_s reads
    m = cand.num_microbatches if cand.zero_stage >= 2 else 0  # ZeRO-0/1 reduce once per step
    units = cand.pp if cand.zero_stage >= 3 else 0  # ZeRO-3 pays a latency per sharded layer (dp_comm_s)
    key = ("dp_terms", cand.zero_stage, m, units, dp, expert_dp) + ((replicate,) if replicate is not None else ())
    return _memo(model, key, lambda: _DpTerms(*dp_fits(model, cand, links)))


def per_sample_floor_s(model: "CostModel", cand: "Candidate") -> float:
    """A lower bound of sum_l (forward_s + backward_s) / microbatch_size over every micro-batch size and every
    placement of the cp, ep, dp and pp groups, for the candidate's tp, cp, ep, sp and tp_overlap; 0 with a
    measured profile (its times follow no formula). The search bounds all micro-batch sizes of a
    factorisation family with it before any module table is built.

    Per micro-batch of b sequences every term below is b x its value at b = 1 plus a non-negative fixed part,
    which the bound drops: matmuls take flops / (peak x ceiling) + calls x t0 (planner.cost.compute.gemm_time_s,
    flops proportional to the tokens), backward 2x (FLASH_BACKWARD_FACTOR x for a flash core); TP all-reduces
    and EP all-to-alls are bytes / bandwidth + latencies (planner.cost.comm), exposed whole without overlap and
    at least half under Domino (comm.domino_exposed_s), the EP all-to-alls counted 0 where the stack may hide them
    (behaviour.overlap.moe_all_to_all or moe_shared_expert_overlap: moe_comm.exposed_s); the EP link is the cheapest footprint (module docstring).
    Exposed CP time is max(0, ring - attention core) per direction, the ring b x its bytes at b = 1 over the
    cheapest footprint, the core at most b x its time at b = 1 (t0 >= 0). Memory-bound operators and recompute
    are >= 0 and left out."""
    if model.profile is not None:
        return 0.0
    key = ("per_sample", cand.tp, cand.cp, cand.ep, cand.sp, cand.world_size)
    rest, tp = _memo(model, key, lambda: _per_sample(model, dataclasses.replace(cand, microbatch_size=1)))
    return rest + (0.5 if cand.tp_overlap == "domino" else 1.0) * tp


def _per_sample(model: "CostModel", cand: "Candidate") -> tuple[float, float]:
    """(everything but TP communication, TP communication) of per_sample_floor_s, for either tp_overlap."""
    spec, shape = model.spec, model.shape(cand)

    tp = _tp_link(model, cand).without_latency()
    env = _env(model, cand, tp, cal=dataclasses.replace(model.cal, gemm_fixed_s=0.0), overlap="none")
    real = _env(model, cand, tp)  # t0 kept: the attention core at b = 1 is at least its per-sequence share at b
    hidden = model.options.moe_overlap or model.options.moe_shared_overlap  # may leave none exposed (moe_comm.exposed_s)
    ep_s = min((sum(T.ep_times(_env(model, cand, tp, ep=link.without_latency()))) for link in _footprints(model, cand, cand.ep)),
               default=0.0) if cand.ep > 1 and not hidden else 0.0
    total = tp_total = 0.0
    for mixer, moe_layer, layers in layer_kinds(model).values():
        count = int(layers.sum())
        token_mixer = (compute.attention_gemms(spec, shape) if mixer == "attention"
                       else mixers.mixer_gemms(spec, shape, mixer))  # Gated DeltaNet / Mamba layers
        gemms = token_mixer + compute.mlp_gemms(spec, shape, moe=counting.moe_params(spec) if moe_layer else None)
        fwd, bwd, _ = T.gemm_times(env, gemms)
        core = T.gemm_times(real, gemms)[2]
        cp_s = _memo(model, ("per_sample_cp", cand.tp, cand.cp, cand.sp, cand.world_size, _order(cand), core), lambda: min(
            (sum(T.cp_times(_env(model, cand, tp, cp=link.without_latency()), core)) for link in _footprints(model, cand, cand.cp)),
            default=0.0)) if cand.cp > 1 else 0.0  # cp_times reads no expert degree: shared by the families of every ep
        total += count * (fwd + bwd + cp_s + (ep_s if moe_layer else 0.0))
        pairs = 1 + moe_layer_terms.ffn_tp_collectives(spec, shape, moe_layer=moe_layer)  # as layers.decoder_cost
        tp_total += count * sum(T.tp_times(env, fwd, bwd, collectives=pairs))
    fwd, bwd, _ = T.gemm_times(env, compute.head_gemms(spec, shape))
    tp_fwd, tp_bwd = T.tp_times(env, fwd, bwd, collectives=1)
    return total + fwd + bwd, tp_total + tp_bwd + (tp_fwd if shape.sp else 0.0)


def floor_time_sum_s(model: "CostModel", cand: "Candidate") -> float:
    """sum_l forward_s + backward_s + min(0, selective recompute, full recompute) under floor_links: at most the
    sum of the module times of any recompute mode (with or without a partial full recompute) under every
    placement; one number for the three modes."""
    def make() -> float:
        row = rows_of(module_table(model, cand, floor_links(model, cand), overlap=model.options.moe_overlap), "none")
        least = np.minimum(0.0, np.minimum(row["selective_s"], row["full_recompute_s"]))
        return float((row["fwd"] + row["bwd"] + least).sum())

    key = ("floor_sum", cand.tp, cand.cp, cand.ep, cand.microbatch_size, cand.sp, cand.tp_overlap, cand.world_size,
           _order(cand))
    return _memo(model, key, make)
