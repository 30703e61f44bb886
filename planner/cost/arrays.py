"""Assemble a candidate's per-module arrays (the LayerCosts of the contract plus breakdown parts)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import compute, memory, mixer_layers, mixers, moe_comm, mtp
from planner.cost.layer_terms import Env, Links, ModuleCost
from planner.cost.layers import decoder_cost, embedding_cost, expert_shard_ep, head_cost, module_params
from planner.cost.profiling_seam import apply_profile
from planner.cost.static_bytes import static_parts
from planner.cost.types import Candidate, Detail, LayerCosts
from planner.models import counting
from planner.schedules import schedule as schedule_of

if TYPE_CHECKING:
    from planner.cost.model import CostModel


# Rows of the per-module matrix whose prefix sums give every stage sum in one numpy operation.
ROWS = ("fwd", "bwd", "rec", "compute", "tp", "ep", "cp", "bwd_compute", "weights", "grads", "optimizer", "act",
        "dense", "expert", "rec_flops", "full_dt", "full_dact", "full_dflops")

MODULE_FIELDS = ("compute_fwd_s", "compute_bwd_s", "tp_fwd_s", "tp_bwd_s", "ep_fwd_s", "ep_bwd_s", "cp_fwd_s", "cp_bwd_s",
                 "selective_s", "act_none", "act_selective", "act_full", "full_recompute_s", "act_transient")
KIND_ORDER = ("embedding", "decoder", "moe_decoder", "head", "linear_decoder", "linear_moe_decoder", "mamba_decoder",
              "mamba_moe_decoder")  # decoder kinds: token mixer (attention, Gated DeltaNet, Mamba) x FFN (dense, MoE)


def kind_name(mixer: str, moe_layer: bool) -> str:
    """The module type of a decoder layer: decoder / moe_decoder, prefixed by its mixer unless attention."""
    return ("" if mixer == "attention" else f"{mixer}_") + ("moe_decoder" if moe_layer else "decoder")


def layer_kinds(model: "CostModel") -> dict[str, tuple[str, bool, np.ndarray]]:
    """Decoder module types present in the model: name -> (mixer, moe_layer, mask over the decoder layers)."""
    found = model.memo.get("layer_kinds")
    if found is None:
        spec = model.spec
        mixer = np.array([spec.mixer(i) for i in range(spec.num_layers)])
        found = {}
        for name in KIND_ORDER:
            for kind in spec.mixers:
                for moe_layer in (False, True):
                    mask = (mixer == kind) & (model.moe_mask == moe_layer)
                    if kind_name(kind, moe_layer) == name and mask.any():
                        found[name] = (kind, moe_layer, mask)
        model.memo["layer_kinds"] = found
    return found


def moe_batch_overlap(model: "CostModel", cand: "Candidate") -> bool:
    """Whether the candidate's MoE dispatch and combine run under the stack's batch-level overlap: the stack has
    it (behaviour.overlap.moe_all_to_all) and the candidate meets the stack's conditions on it
    (moe_comm.batch_overlap_applies with behaviour.overlap.moe_all_to_all_needs). A partial full recompute breaks
    Megatron-Core's (no_full_recompute): the search adds none to a candidate for which this holds."""
    return model.options.moe_overlap and not moe_overlap_unmet(model, cand)


def moe_overlap_unmet(model: "CostModel", cand: "Candidate") -> list[str]:
    """The stack's conditions on its batch-level overlap the candidate breaks (moe_comm.unmet_needs)."""
    return moe_comm.unmet_needs(model.options.moe_overlap_needs, pp=cand.pp, vpp=cand.vpp, recompute=cand.recompute,
                                full_layers=False, precision=model.request.precision, modules=cand.recompute_modules,
                                mtp_layers=model.spec.mtp_num_layers)


def kind_costs(model: "CostModel", cand: "Candidate", links: Links, overlap: bool) -> dict[str, ModuleCost]:
    """One ModuleCost per module type (embedding, decoder, moe_decoder, head), measured where a profile covers it;
    `overlap`: the MoE all-to-all under the stack's batch-level overlap (moe_batch_overlap). The MoE layers of
    every mixer share one token dispatcher, as a run has one --moe-token-dispatcher-type (one_dispatcher)."""
    kinds = kinds_with(model, cand, links, overlap, model.options.moe_dispatchers)
    chosen = {cost.moe_dispatcher for cost in kinds.values() if cost.moe_dispatcher is not None}
    return kinds if len(chosen) <= 1 else one_dispatcher(model, cand, links, overlap, sorted(chosen))


def one_dispatcher(model: "CostModel", cand: "Candidate", links: Links, overlap: bool,
                   dispatchers: list[str]) -> dict[str, ModuleCost]:
    """Where MoE layer types of different mixers would each pick another dispatcher (the batch-level overlap hides
    more behind a layer with more compute), the one dispatcher of the least MoE communication over all the
    model's layers (exposed dispatch and combine, and what a selective recompute reruns of it)."""
    counts = {name: int(mask.sum()) for name, (_, _, mask) in layer_kinds(model).items()}

    def total(kinds: dict[str, ModuleCost]) -> float:
        return sum(counts.get(name, 0) * (cost.ep_fwd_s + cost.ep_bwd_s + cost.selective_s)
                   for name, cost in kinds.items() if cost.moe_dispatcher is not None)

    return min((kinds_with(model, cand, links, overlap, (name,)) for name in dispatchers), key=total)


def kinds_with(model: "CostModel", cand: "Candidate", links: Links, overlap: bool,
               dispatchers: tuple[str, ...] | None) -> dict[str, ModuleCost]:
    """kind_costs with the MoE dispatchers priced narrowed to `dispatchers` (None: all the stack runs)."""
    recipe = model.executor_recipe_for(cand)
    precision = "fp32" if recipe is not None and recipe.compute == 4 else model.request.precision  # as the executor runs
    env = Env(spec=model.spec, device=model.device, cal=model.cal, precision=precision,
              shape=model.shape(cand), links=links, tp_overlap=cand.tp_overlap,
              stack_tp_overlap=model.options.tp_overlap, moe_overlap=overlap,
              selective_mode=model.options.selective_mode, selective_modules=cand.recompute_modules,
              moe_hierarchical=model.options.moe_hierarchical, executor=recipe,
              moe_loop=model.options.moe_expert_impl == "loop",
              moe_dispatch_fp8=cand.compression.has("fp8-dispatch"), moe_allgather=model.options.moe_allgather,
              moe_dispatchers=dispatchers, moe_deepep=model.options.moe_deepep,
              # Megatron-Core refuses shared-expert recompute with the shared-expert overlap (transformer_config.py)
              moe_shared_overlap=shared_overlap(model, cand),
              moe_count_exchange=model.options.moe_count_exchange,
              cp_flavours=model.options.cp_flavours, fp8_casts=model.options.fp8_casts,
              fp8_16bit_gemms=model.options.fp8_16bit_gemms)
    kinds = {"embedding": embedding_cost(env), "head": head_cost(env)}
    for name, (mixer, moe_layer, _) in layer_kinds(model).items():
        kinds[name] = (decoder_cost(env, moe_layer=moe_layer) if mixer == "attention"
                       else mixer_layers.decoder_cost(env, moe_layer=moe_layer, mixer=mixer))
    if model.profile is not None:
        kinds = apply_profile(model, cand, kinds)
    else:
        model.analytic_shapes.update(
            f"{kind}(tp={cand.tp}, ep={cand.ep}, microbatch_size={cand.microbatch_size}, seq_len={model.request.seq_len})"
            for kind in kinds if kind.endswith("decoder")
        )
    return dict(kinds, head=mtp.with_mtp(kinds["head"], kinds[mtp_kind(model)], env))


def shared_overlap(model: "CostModel", cand: "Candidate") -> bool:
    """Whether the stack's shared-expert overlap is on offer for the candidate (behaviour.overlap
    moe_shared_expert_overlap): Megatron-Core refuses it beside a recompute of the shared experts
    (transformer_config.py); moe_comm.choose gives it to the alltoall dispatcher only."""
    return model.options.moe_shared_overlap and "shared_experts" not in cand.recompute_modules


def mtp_kind(model: "CostModel") -> str:
    """The module type each MTP layer repeats (planner.models.counting.mtp_layer_index)."""
    index = counting.mtp_layer_index(model.spec)
    return kind_name(model.spec.mixer(index), bool(model.moe_mask[index]))


def priced_choices(model: "CostModel", cand: "Candidate") -> tuple[str | None, str | None, str | None]:
    """(MoE token dispatcher, MoE overlap, context-parallel flavour) the candidate's layers are priced with, which
    the plan carries for its exports: the dispatcher of planner.cost.moe_comm.choose (Megatron-Core's name,
    alltoall / flex / allgather), one for the MoE layers of every mixer (kind_costs); the overlap it ran under
    ("batch": the stack's batch-level overlap, moe_batch_overlap, with a dispatcher it runs with; "shared": the
    shared-expert overlap, where the model has shared experts; else "none"), both None without MoE layers or with
    ep 1; the flavour of planner.cost.context_parallel.choose (the profile's spelling; None with cp 1)."""
    has_moe = cand.ep > 1 and bool(model.moe_mask.any())
    if not has_moe and cand.cp <= 1:
        return None, None, None
    key = ("priced_choices", cand)  # read by the plan, the EP overlap's extra micro-batch and the dispatch buffers
    if key not in model.memo:
        model.memo[key] = _priced_choices(model, cand, has_moe)
    return model.memo[key]


def _priced_choices(model: "CostModel", cand: "Candidate", has_moe: bool) -> tuple[str | None, str | None, str | None]:
    """priced_choices, computed from the candidate's module costs."""
    batch = moe_batch_overlap(model, cand)
    kinds = kind_costs(model, cand, model.links(cand), batch)
    dispatcher = overlap = None
    if has_moe:
        dispatcher = next(cost.moe_dispatcher for name, cost in kinds.items() if name.endswith("moe_decoder"))
        shared = (shared_overlap(model, cand) and bool(model.spec.moe.shared_ffn_hidden_size)
                  and dispatcher in moe_comm.SHARED_OVERLAP_DISPATCHERS)
        overlap = ("batch" if batch and dispatcher in moe_comm.OVERLAPPED_DISPATCHERS else
                   "shared" if shared else "none")
    flavour = next((cost.cp_flavour for name, cost in kinds.items() if name.endswith("decoder") and cost.cp_flavour),
                   None) if cand.cp > 1 else None
    return dispatcher, overlap, flavour


def module_table(model: "CostModel", cand: "Candidate", links: Links | None = None, *,
                 overlap: bool | None = None) -> np.ndarray:
    """MODULE_FIELDS x L matrix over (tok_embeddings, layers..., output), memoised per shape and the links of the
    tp, cp and ep groups, the only links a module's cost reads (planner.cost.layers), so factorisations and axis
    orders that give those groups the same links share it; the candidate's ZeRO stage and schedule do not change a
    module's cost, its pp, vpp, recompute mode and precision only through whether the stack's MoE overlap runs
    (moe_batch_overlap). `links` overrides the candidate's (planner.cost.bounds.floor_links), `overlap` that
    (the bounds' stack-wide best case)."""
    links = model.links(cand) if links is None else links
    overlap = moe_batch_overlap(model, cand) if overlap is None else overlap
    key = ("modules", cand.tp, cand.ep, cand.cp, cand.sp, cand.microbatch_size, cand.tp_overlap, links.tp, links.cp,
           links.ep, model.executor_recipe_for(cand), cand.compression.has("fp8-dispatch"), overlap, cand.recompute_modules)
    found = model.memo.get(key)
    if found is None:
        kinds = kind_costs(model, cand, links, overlap)
        table = np.array([[getattr(kinds[k], f) for f in MODULE_FIELDS] if k in kinds else [0.0] * len(MODULE_FIELDS)
                          for k in KIND_ORDER]).T
        layers = np.zeros(model.spec.num_layers, dtype=int)
        for name, (_, _, mask) in layer_kinds(model).items():
            layers[mask] = KIND_ORDER.index(name)
        index = np.concatenate([[0], layers, [3]])
        found = table[:, index]
        found[MODULE_FIELDS.index("full_recompute_s"), 0] = 0.0  # the embedding is never recomputed, nor the head:
        found[MODULE_FIELDS.index("full_recompute_s"), -1] = mtp.recompute_s(  # its column recomputes only MTP layers
            model.spec, kinds[mtp_kind(model)])
        found.setflags(write=False)  # shared by every Detail of this shape: callers must not modify it
        model.memo[key] = found
    return found


def flops_per_sequence(model: "CostModel") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward FLOPs of one sequence per module (model, hardware, attention core), memoised read-only per model."""
    found = model.memo.get("flops")
    if found is None:
        found = model.memo["flops"] = _count_flops_per_sequence(model)
        for array in found:
            array.setflags(write=False)
    return found


def _count_flops_per_sequence(model: "CostModel") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Forward FLOPs of one sequence per module, whole model (no parallel split), full-attention convention:
    (model: MoE without capacity padding, hardware: with it, attention core)."""
    spec = model.spec
    shape = compute.Shape(microbatch_size=1, seq_len=model.request.seq_len)
    n = spec.num_layers
    model_f, hw_f, core_f = np.zeros(n + 2), np.zeros(n + 2), np.zeros(n + 2)
    moe = counting.moe_params(spec) if spec.moe is not None else None
    for mixer, moe_layer, layers in layer_kinds(model).values():
        if mixer == "attention":
            attn, extra = compute.attention_gemms(spec, shape, full=True), 0.0
        else:  # Gated DeltaNet / Mamba: their GEMMs and the conv1d and scan FLOPs (planner.cost.mixers)
            attn, extra = mixers.mixer_gemms(spec, shape, mixer, full=True), mixers.non_gemm_flops(spec, shape.tokens, mixer)
        mlp_model = compute.mlp_gemms(spec, shape, moe=moe if moe_layer else None, full=True, hardware=False)
        mlp_hw = compute.mlp_gemms(spec, shape, moe=moe if moe_layer else None, full=True, hardware=True)
        mask = np.concatenate([[False], layers, [False]])
        model_f[mask] = compute.gemms_flops(attn + mlp_model) + extra
        hw_f[mask] = compute.gemms_flops(attn + mlp_hw) + extra
        core_f[mask] = compute.gemms_flops(attn, attention_only=True)
    head = compute.gemms_flops(compute.head_gemms(spec, shape, full=True))
    model_f[-1] = hw_f[-1] = head
    if spec.mtp_num_layers:  # each MTP module: its layer, eh_proj and the head once more (planner.cost.mtp)
        k, last = spec.mtp_num_layers, counting.mtp_layer_index(spec) + 1
        proj = compute.gemms_flops(mtp.projection_gemms(spec, shape, full=True))
        model_f[-1] += k * (model_f[last] + proj + head)
        hw_f[-1] += k * (hw_f[last] + proj + head)
        core_f[-1] = k * core_f[last]
    return model_f, hw_f, core_f


def rows_of(table: np.ndarray, recompute: str) -> dict[str, np.ndarray]:
    """The per-module rows of a module table under a recompute mode (forward and backward with exposed comm)."""
    col = dict(zip(MODULE_FIELDS, table))
    fwd = col["compute_fwd_s"] + col["tp_fwd_s"] + col["ep_fwd_s"] + col["cp_fwd_s"]
    bwd = col["compute_bwd_s"] + col["tp_bwd_s"] + col["ep_bwd_s"] + col["cp_bwd_s"]
    if recompute == "full":
        rec, act = col["full_recompute_s"], col["act_full"]
    elif recompute == "selective":
        rec, act = col["selective_s"], col["act_selective"]
    else:
        rec, act = np.zeros_like(fwd), col["act_none"]
    return dict(col, fwd=fwd, bwd=bwd, rec=rec, act=act)


def module_params_of(model: "CostModel", cand: "Candidate") -> tuple[np.ndarray, np.ndarray]:
    """(dense, expert) parameters per module held by one GPU, memoised per (tp, ep, a tied copy). A tied head
    keeps its own copy of the embedding where it runs on another rank than the embedding (pp > 1), not in a V
    (zbv, dualpipev: both on rank 0, planner.executor.pipeline shares the one matrix)."""
    ep = expert_shard_ep(ep=cand.ep, dp=cand.dp, cp=cand.cp)
    tied_copy = cand.pp > 1 and not schedule_of(cand.schedule).v_placed
    key = ("params", cand.tp, ep, tied_copy)
    if key not in model.memo:
        model.memo[key] = module_params(model.spec, tp=cand.tp, ep=ep, tied_copy=tied_copy)
    return model.memo[key]


def zero3_working_bytes(model: "CostModel", cand: "Candidate") -> float:
    """What the stack's ZeRO-3 holds gathered at once (memory.zero3_working_set_bytes): two whole blocks, or
    per sub-module (the largest nn.Linear or embedding on this GPU) within the resident-parameter limit; plus the
    contiguous gradient bucket a DeepSpeed-style stack allocates once."""
    key = ("zero3_working", cand.tp, cand.ep, cand.pp > 1 and not schedule_of(cand.schedule).v_placed)
    found = model.memo.get(key)
    if found is None:
        o = model.options
        gather = model.recipe.gather_bytes
        if o.zero3_gather_unit == "module":
            unit_params = counting.largest_linear_params(model.spec) / cand.tp
        else:
            dense, expert = module_params_of(model, cand)
            unit_params = float(np.max(dense + expert))
        found = memory.zero3_working_set_bytes(unit_params, gather_bytes=gather, unit=o.zero3_gather_unit,
                                               max_live_params=o.zero3_max_live_params)
        found += memory.reduce_bucket_bytes(o.zero3_reduce_bucket_params)
        model.memo[key] = found
    return found


def layer_working_bytes(model: "CostModel", cand: "Candidate", *, recompute: str) -> float:
    """Transient bytes of the layer running its backward (the largest over modules): the gradients in flight
    (memory.backward_transient_bytes) and what the recompute `recompute` rebuilt for it, alive until its backward
    ends: under full the layer's activations (memory.recompute_working_set_bytes), under selective the dropped
    parts (a checkpointed module reruns its forward inside the backward: Megatron-Core CheckpointFunction,
    torch.utils.checkpoint). One layer of one micro-batch at a time on a pipeline rank."""
    col = dict(zip(MODULE_FIELDS, module_table(model, cand)))
    kept = {"full": col["act_full"], "selective": col["act_selective"]}.get(recompute, col["act_none"])
    extra = col["act_transient"] + np.maximum(0.0, col["act_none"] - kept)
    return float(np.max(extra))


def build_detail(model: "CostModel", cand: "Candidate") -> "Detail":
    """All per-module arrays of `cand` (memoised by CostModel.detail)."""
    row = rows_of(module_table(model, cand), cand.recompute)
    compute_fwd, compute_bwd = row["compute_fwd_s"], row["compute_bwd_s"]
    dense, expert = module_params_of(model, cand)
    weights, grads, optim = static_parts(model, cand, dense, expert)
    model_f, hw_f, core_f = flops_per_sequence(model)
    costs = LayerCosts(
        names=model.names, forward_s=row["fwd"], backward_s=row["bwd"], recompute_s=row["rec"],
        full_recompute_s=row["full_recompute_s"], static_bytes=weights + grads + optim, activation_bytes=row["act"],
        full_recompute_activation_bytes=row["act_full"],
    )
    detail = Detail(
        costs=costs, compute_s=compute_fwd + compute_bwd, tp_s=row["tp_fwd_s"] + row["tp_bwd_s"],
        ep_s=row["ep_fwd_s"] + row["ep_bwd_s"], cp_s=row["cp_fwd_s"] + row["cp_bwd_s"], bwd_compute_s=compute_bwd,
        weight_bytes=weights, grad_bytes=grads, optimizer_bytes=optim, dense_params=dense, expert_params=expert,
        model_fwd_flops=model_f, hw_fwd_flops=hw_f, core_fwd_flops=core_f,
    )
    return dataclasses.replace(detail, prefix=prefix_sums(detail, cand.recompute))


def layer_costs_with(model: "CostModel", cand: "Candidate", links: Links, *, overlap: bool | None = None) -> "LayerCosts":
    """LayerCosts of `cand` under `links` (its own, or planner.cost.bounds.floor_links), equal to build_detail's;
    `overlap` as module_table's."""
    row = rows_of(module_table(model, cand, links, overlap=overlap), cand.recompute)
    key = ("static", cand.tp, cand.ep, cand.pp > 1, cand.zero_stage, cand.dp_cp, cand.dp_replicate, cand.num_microbatches > 1,
           (schedule_of(cand.schedule).weight_versions, schedule_of(cand.schedule).v_placed))
    static = model.memo.get(key)
    if static is None:
        static = model.memo[key] = sum(static_parts(model, cand, *module_params_of(model, cand)))
        static.setflags(write=False)  # shared by the LayerCosts of every shape of this layout
    return LayerCosts(
        names=model.names, forward_s=row["fwd"], backward_s=row["bwd"], recompute_s=row["rec"],
        full_recompute_s=row["full_recompute_s"], static_bytes=static, activation_bytes=row["act"],
        full_recompute_activation_bytes=row["act_full"],
    )


def prefix_sums(detail: "Detail", recompute: str) -> np.ndarray:
    """Prefix sums (len(ROWS) x L+1) of the per-module quantities of a Detail (stored on it by build_detail)."""
    c = detail.costs
    rec_flops = np.zeros_like(detail.hw_fwd_flops)
    if recompute == "full":
        rec_flops[1:-1] = detail.hw_fwd_flops[1:-1]
    elif recompute == "selective" and c.recompute_s[1:-1].any():
        rec_flops[1:-1] = detail.core_fwd_flops[1:-1]
    full_dflops = detail.hw_fwd_flops - rec_flops
    full_dflops[0] = full_dflops[-1] = 0.0
    rows = np.vstack([
        c.forward_s, c.backward_s, c.recompute_s, detail.compute_s, detail.tp_s, detail.ep_s, detail.cp_s,
        detail.bwd_compute_s, detail.weight_bytes, detail.grad_bytes, detail.optimizer_bytes, c.activation_bytes,
        detail.dense_params, detail.expert_params, rec_flops, c.full_recompute_s - c.recompute_s,
        c.full_recompute_activation_bytes - c.activation_bytes, full_dflops,
    ])
    prefix = np.zeros((rows.shape[0], rows.shape[1] + 1))
    np.cumsum(rows, axis=1, out=prefix[:, 1:])
    return prefix
