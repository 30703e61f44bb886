"""What the cost model reads from the request's software stack (frameworks/<name>.yaml `behaviour`).

The stack decides mechanisms, not factors: whether attention keeps the s x s scores (fused attention), which
communication runs beside compute (data-parallel gradient reduction and parameter gathers, pipeline sends, TP
collectives, MoE all-to-all), how ZeRO-3 gathers (flat or per node, again for the recompute forward), whether
pipeline sends are split over the TP ranks, the dtype gradients are reduced in, and the allocator allowance.
`options_for` turns a profile into the CostOptions the model uses.

Norm/activation kernel bytes follow the precision recipe (CostOptions.fused_kernels None), not `kernels.fused_norm`,
except for the components a profile lists in `kernels.eager_ops` (the stack's code runs them as eager op sequences
in bf16: torchtitan's SwiGLU and complex RoPE without compile), which get kernel_bytes.EAGER's bytes for that component:
the eager byte counts (kernel_bytes.EAGER) are HuggingFace's kernels under torch.autocast with an fp32 residual stream,
measured on the TinyLlama rows; stacks computing in bf16 save far less per unfused norm, and the published
torchtitan Llama-2 13B run without recompute at micro-batch 2 (published_runs.json) fits in 80 GB only with the
fused counts.
"""

from __future__ import annotations

from planner.cost.types import AccumulationEntry, CostOptions
from planner.frameworks import load_framework
from planner.schemas.framework import FrameworkProfile


def options_for(framework: FrameworkProfile | str, precision: str) -> CostOptions:
    """CostOptions of a stack for a precision recipe: its profile object (the request's, resolved once), or a name
    or profile path read here (tests and benchmarks that name a stack)."""
    profile = load_framework(framework) if isinstance(framework, str) else framework
    b = profile.behaviour
    k, o, m, x = b.kernels, b.overlap, b.memory, b.executor
    dispatchers = profile.capabilities.expert_parallel.flavours  # the token dispatchers it runs, Megatron-Core's names
    return CostOptions(
        flash_attention=(k.fused_attention and precision != "fp32"), dropout=b.defaults.dropout,
        fused_kernels=None,
        dp_overlap=o.dp_grad_reduce, dp_gather_overlap=o.dp_param_gather, pp_overlap=o.pp_send_recv,
        tp_overlap=o.tp_comm, moe_overlap=o.moe_all_to_all, zero3_prefetch_layers=o.zero3_prefetch_layers,
        main_grads_fp32=b.memory.main_grads_fp32, pp_scatter_gather=o.pp_scatter_gather,
        recipe_bytes=_recipe_bytes(m.recipes.get(precision)), fp8_saves_fp8_inputs=m.fp8_saves_fp8_inputs,
        zero3_hierarchical=o.zero3_hierarchical, zero3_regather_for_recompute=o.zero3_regather_for_recompute,
        zero3_sync_per_tensor=o.zero3_sync_per_tensor,
        allocator=m.allocator, allocator_fraction=m.allocator_allowance_fraction,
        grad_reduce_fp32=m.grad_reduce_fp32,
        selective_mode=m.selective_recompute, attention_kernel=k.attention_kernel,
        moe_hierarchical="flex" in dispatchers, moe_allgather="allgather" in dispatchers,
        moe_shared_overlap=o.moe_shared_expert_overlap, moe_overlap_needs=tuple(o.moe_all_to_all_needs),
        moe_overlap_extra_microbatch=o.moe_all_to_all_extra_microbatch, eager_ops=tuple(k.eager_ops),
        grad16_buffer_bytes=next((c.grad_buffer_bytes for c in profile.capabilities.compression
                                  if c.method in ("bf16-grads", "fp16-grads") and c.grad_buffer_bytes), None),
        moe_sp_dispatch=b.moe.sequence_parallel_dispatch, moe_expert_launches=b.moe.expert_gemm_launches,
        moe_expert_sort=b.moe.expert_sort, moe_count_exchange=b.moe.token_count_exchange,
        moe_combine_scores=b.moe.combine_scores, moe_deepep=b.moe.flex_kernels == "deepep",
        cp_flavours=tuple(profile.capabilities.context_parallel.flavours) or ("p2p",), softmax_in_place=k.softmax_backward_in_place,
        logits_live_in_backward=m.logits_live_in_backward,
        fsdp_grads_unsharded_across_microbatches=m.fsdp_grads_unsharded_across_microbatches,
        split_backward_retains_graph=m.split_backward_retains_graph,
        pp_recv_buffers_per_microbatch=m.pp_recv_buffers_per_microbatch, zero3_gather_unit=m.zero3_gather_unit,
        zero3_max_live_params=m.zero3_max_live_params, zero3_reduce_bucket_params=m.zero3_reduce_bucket_params,
        zero3_grads_fp32=m.zero3_grads_fp32, zero3_step_fp32_grad_params=m.zero3_step_fp32_grad_params,
        executor_code=x is not None, bf16_autocast=x is not None and x.bf16_recipe == "autocast",
        moe_expert_impl=x.moe_expert_impl if x is not None else "grouped",
        adamw_impl=x.adamw_impl if x is not None else "fused", sdpa_gqa=x.sdpa_gqa if x is not None else "native",
        grad_accum_paths=grad_accumulation_paths(b.grad_accumulation) if precision in SIXTEEN_BIT_WEIGHTS else (),
    )


def hf_eager_options(precision: str):
    """CostOptions of HuggingFace transformers' modeling code under plain PyTorch (torch.autocast, fused AdamW), the
    recipe of validation/h100_hf_tinyllama.jsonl priced by planner.cost.eager and planner.cost.autocast: the planner
    stack's options without its executor facts (its own code is priced by planner.cost.executor instead)."""
    import dataclasses

    return dataclasses.replace(options_for("planner", precision), executor_code=False, bf16_autocast=False,
                               moe_expert_impl="grouped", adamw_impl="fused")


SIXTEEN_BIT_WEIGHTS = ("bf16", "fp8")
"""The precision recipes whose weights and gradients are bf16, the dtype the profiles' accumulation paths are for;
fp32 and amp-bf16 (fp32 parameters) accumulate 4-byte gradients, which no profile records, so none is priced."""


def grad_accumulation_paths(found, dtype: str = "bf16") -> tuple:
    """CostOptions.grad_accum_paths of a profile's gradient accumulation for one weight dtype (bf16: the weights of
    the planner's bf16 and fp8 recipes); () where the profile records none."""
    if found is None:
        return ()
    return tuple(path_entry(p) for p in found.paths if p.dtype == dtype)


def path_entry(path, zero_stages: tuple[int, ...] | None = None, pipeline: bool | None = None) -> AccumulationEntry:
    """One AccumulationPath as CostOptions.grad_accum_paths holds it; `zero_stages` and `pipeline` replace the
    path's."""
    stages = tuple(path.zero_stages) if zero_stages is None else zero_stages
    pipe = path.pipeline if zero_stages is None else pipeline
    return AccumulationEntry(stages, pipe, path.bytes_per_element, path.every_microbatch, path.grad_bytes,
                             path.bucket_params, path.shards_optimizer)


def _recipe_bytes(recipe):
    """(weights, grads, optimizer, grad_reduce, gather) of a profile's RecipeBytes, or None."""
    if recipe is None:
        return None
    return (recipe.weights, recipe.grads, recipe.optimizer, recipe.grad_reduce, recipe.gather)
