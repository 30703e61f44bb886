"""The value types of the cost package: the search's point of the plan space (Candidate), the software facts the
model reads (CostOptions), and the per-module arrays one candidate costs to (LayerCosts, Detail).

The bottom layer of planner/cost: it imports nothing from the package, so the formula modules (layers, memory,
comm, arrays, evaluate, bounds) and the CostModel facade (planner.cost.model, which re-exports these) all depend on
it and not on each other's private names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from planner.schedules import DEFAULT
from planner.schemas.compression import NONE, Compression
from planner.schemas.dims import LAYOUT_AXES, ParallelDims


@dataclass(frozen=True, kw_only=True)
class Candidate(ParallelDims):
    """One point of the plan space (hashable): its parallel degrees (a ParallelDims: dp, tp, pp, ep, cp,
    dp_replicate and the sizes derived from them) and the per-plan choices on top of them."""

    sp: bool = False
    vpp: int = 1
    zero_stage: int = 0
    tp_overlap: str = "none"  # "none" | "domino"
    microbatch_size: int
    num_microbatches: int
    schedule: str = DEFAULT.name  # one of planner.schedules.NAMES
    recompute: str = "none"  # "none" | "selective" | "full" (stage-wide base mode)
    recompute_modules: tuple[str, ...] = ()  # what selective reruns (planner.cost.selective); () = the stack's mode
    axis_order: tuple[str, ...] = LAYOUT_AXES  # outermost -> innermost
    compression: Compression = NONE  # communication compression (planner.cost.compression)


class AccumulationEntry(NamedTuple):
    """One gradient accumulation path as CostOptions holds it (a profile's AccumulationPath, planner.cost.stack
    path_entry): hashable and comparable like the plain tuple it is."""

    zero_stages: tuple[int, ...]  # ZeRO stages it runs at
    pipeline: bool | None  # only with (True) or without (False) pipeline stages; None: either
    bytes_per_element: float  # HBM bytes per gradient element per micro-batch
    every_microbatch: bool  # the first micro-batch pays too
    grad_bytes: float | None  # gradient bytes per parameter its optimizer holds in place of the recipe's; None: those
    bucket_params: float  # elements of the 16-bit gradient bucket(s) its optimizer allocates for each backward
    shards_optimizer: bool  # its optimizer keeps the fp32 states on a 1/dp share even at ZeRO-0


@dataclass(frozen=True, kw_only=True)
class CostOptions:
    """Software facts the analytic model cannot see in the request (defaults: a modern Megatron/torchtitan stack).

    flash_attention: fused attention that keeps no s^2 scores; None = on for bf16/amp-bf16/fp8, off for fp32.
    fused_kernels: fused norm/activation/RoPE kernels; None = on for bf16 and fp8 (the Megatron-LM/torchtitan
        recipes with bf16 parameters), off for amp-bf16 and fp32 (plain PyTorch with torch.autocast or none, as
        HuggingFace transformers runs: eager fp32 norms, unfused SwiGLU and RoPE; kernel_bytes.KernelBytes).
    dropout: dropout layers present (GPT-3-era models); adds masks to activations and memory traffic. Taken from
        the model spec when it says (ModelSpec.dropout), else the stack's default (behaviour.defaults.dropout).
    dp_overlap: gradient reduction overlapped with backward (Megatron --overlap-grad-reduce, FSDP, DeepSpeed
        ZeRO overlap_comm); False = the reduction starts after the last backward (2021-22 Megatron-LM, DeepSpeed
        PipelineEngine).
    bucket_params: gradient bucket size in parameters; with overlap the last bucket stays exposed
        (Megatron-LM's default --ddp-bucket-size, 40M).
    dp_gather_overlap, pp_overlap, tp_overlap, moe_overlap: parameter all-gathers (ZeRO-1/3), pipeline sends,
        TP collectives, MoE all-to-all run beside compute (the stack's `behaviour.overlap`).
    pp_scatter_gather: pipeline sends split over the TP ranks and all-gathered on the receiver (2021 Megatron-LM).
    zero3_hierarchical, zero3_regather_for_recompute: how the stack's ZeRO-3 collectives run (evaluate.dp_comm_s).
    zero3_sync_per_tensor: ZeRO-3 gathers one synchronous collective per parameter tensor, copied out per rank
        (DeepSpeed before v0.5.6; planner.cost.zero3_legacy), exposed.
    zero3_prefetch_layers: ZeRO-3 modules whose weights are gathered ahead of the one computing.
    moe_overlap_extra_microbatch: the stack's MoE batch-level overlap holds one more micro-batch in flight
        (behaviour.overlap.moe_all_to_all_extra_microbatch; pipelining_memory.ep_overlap_extra_microbatches).
    eager_ops: the components the stack runs as eager op sequences under a 16-bit recipe (behaviour.kernels.eager_ops:
        activation, rope, norm), priced with kernel_bytes.EAGER's bytes for them (compute.Shape.kernels).
    grad16_buffer_bytes: the gradient buffer's bytes per parameter when a 16-bit gradient method (bf16-grads) runs
        where the stack's method sets the buffer's dtype (the profile's compression entry grad_buffer_bytes:
        Megatron's --grad-reduce-in-bf16); None: the recipe's gradient bytes.
    zero3_layer_collectives: ZeRO-3 gathers and reduces layer by layer, each collective with its own fixed latency
        (compression.zero3_unit_latency_s); False: one collective's latency per pass (an ablation).
    fp8_casts: under fp8 each linear's input and output gradient are cast to fp8 (fp8_recipe.cast_bytes);
        False: the casts are free (an ablation).
    fp8_16bit_gemms: under fp8 the matmuls every stack keeps in 16 bits (planner.cost.fp8_recipe: LM head, MoE
        router, chunked delta rule) run at the bf16 rate; False: at the fp8 rate like the rest (an ablation).
    grad_accum_paths: the stack's gradient accumulation over micro-batches outside the weight-gradient GEMM
        (behaviour.grad_accumulation's bf16 paths; planner.cost.grad_accumulation), each an AccumulationEntry.
    grad_accum_memory: the memory of those paths (their gradient bytes and buckets) is counted; False: the
        recipe's gradient bytes, no bucket (an ablation).
    main_grads_fp32: bf16 weights with an fp32 main-gradient buffer and an fp32 master copy in the optimizer
        (Megatron/DeepSpeed: 2 + 4 + 12 bytes per parameter); False: the stack's parameters are the fp32 master and
        bf16 exists only as the gathered/cast compute copy (FSDP mixed precision: 4 + 4 + 8, memory.FP32_MASTER_PARAMS_BF16).
    recipe_bytes: the stack's own bytes per parameter of the request's precision (weights, grads, optimizer, grad
        reduction, gather; behaviour.memory.recipes), replacing memory.RECIPES and main_grads_fp32; None = those.
    fp8_saves_fp8_inputs: under fp8 the GEMMs save 1-byte inputs for backward (Transformer Engine); False: 2-byte
        (torchao Float8Linear saves its high-precision input; behaviour.memory.fp8_saves_fp8_inputs).
    grad_reduce_fp32: gradients reduced in fp32 (Megatron --accumulate-allreduce-grads-in-fp32, FSDP reduce_dtype
        fp32), else in the 16-bit dtype (DeepSpeed ZeRO's communication_data_type default).
    selective_mode: what the stack's "selective" recompute reruns: "attention_core" (Megatron, Korthikanti et al.
        2022), "half_forward" (torchtitan's selective_ac_option N=2: every other layer checkpointed),
        "op_sac" (torchtitan's per-op policy: every second matmul and the pointwise ops, planner.cost.sac),
        "norm_and_up_proj" (DeepSeek-V3: RMSNorm and MLA up-projections).
    moe_hierarchical: MoE dispatch/combine deduplicated per destination node (comm.hierarchical_all_to_all_s): the
        stack lists flex among capabilities.expert_parallel.flavours.
    moe_dispatchers: the MoE token dispatchers the cost may price (Megatron-Core names); None = every one the stack
        runs (moe_hierarchical, moe_allgather); a user's pin narrows it (planner.cost.pins).
    moe_deepep: the flex dispatcher is DeepEP's Buffer (behaviour.moe.flex_kernels): offered only for the tp x ep group
        sizes DeepEP has a configuration for, its buffers held beside the model (moe_comm.deepep_buffer_bytes).
    moe_allgather, moe_shared_overlap: the stack's all-gather dispatcher (allgather among those flavours), and its
        shared experts computing during the dispatch (planner.cost.moe_comm).
    moe_overlap_needs: the conditions the stack sets on `moe_overlap` (behaviour.overlap.moe_all_to_all_needs;
        planner.cost.moe_comm.batch_overlap_applies).
    moe_sp_dispatch, moe_expert_launches, moe_expert_sort, moe_count_exchange, moe_combine_scores: how the stack runs the MoE layer
        (behaviour.moe; planner.cost.moe_layer): tokens dispatched per sequence-parallel shard with an expert-TP
        all-gather/reduce-scatter, GEMM launches of the routed experts, a second sort by local expert, the
        tokens-per-expert exchange before each dispatch, the routing scores applied by an eager fp32 multiply.
    cp_flavours: the context-parallel flavours the stack runs (capabilities.context_parallel.flavours), the fastest
        priced (planner.cost.context_parallel).
    attention_kernel: the stack's fused-attention kernel ("flash-attention-1", "flash-attention-2", "cudnn"),
        priced at the device family's measured rate for the model's head dim (calibration.attention_rate_for).
    allocator: the caching-allocator setting the stack runs under (behaviour.memory.allocator): its allowance is
        calibration.yaml's `memory` entry of that name.
    allocator_fraction: device memory the stack's allocator keeps beyond the allocated bytes, as a fraction of them
        (behaviour.memory.allocator_allowance_fraction); None = the `allocator` entry's fragmentation_fraction.
    softmax_in_place: the unfused softmax's backward overwrites its output gradient (kernels.softmax_backward_in_place).
    logits_live_in_backward: the fp32 logits stay allocated through the layers' backward (else the loss's phase and
        a layer's backward phase do not overlap: CostModel.stage_other_bytes).
    fsdp_grads_unsharded_across_microbatches: under FSDP2 (ZeRO-2/3) with more than one micro-batch a rank holds its
        gradients unsharded through the step (behaviour.memory; planner.cost.static_bytes.static_parts).
    split_backward_retains_graph, pp_recv_buffers_per_microbatch: what torch.distributed.pipelining holds beyond a
        schedule's textbook count (behaviour.memory; planner.cost.pipelining_memory).
    zero3_gather_unit, zero3_max_live_params, zero3_reduce_bucket_params, zero3_grads_fp32,
        zero3_step_fp32_grad_params: how the stack holds ZeRO-3 memory (behaviour.memory; memory.zero3_working_set_bytes,
        measured by benchmarks/gpu_memory.py).
    executor_code, bf16_autocast, moe_expert_impl, adamw_impl: the stack is the planner's executor, priced from its
        code (planner.cost.executor; behaviour.executor): bf16 run under autocast or not, MoE experts as a loop or
        grouped GEMMs, AdamW foreach or fused; sdpa_gqa: GQA's k/v repeated before SDPA or native (enable_gqa).
    Without explicit options the CostModel takes them from the request's framework (planner.cost.stack).
    """

    flash_attention: bool | None = None
    fused_kernels: bool | None = None
    dropout: bool = False
    dp_overlap: bool = True
    bucket_params: float = 40e6
    dp_gather_overlap: bool = True
    pp_overlap: bool = False
    tp_overlap: bool = False
    moe_overlap: bool = False
    zero3_prefetch_layers: int = 1
    main_grads_fp32: bool = True
    recipe_bytes: tuple[float, float, float, float, float] | None = None
    fp8_saves_fp8_inputs: bool = True
    allocator: str = "default"
    allocator_fraction: float | None = None
    logits_live_in_backward: bool = False
    fsdp_grads_unsharded_across_microbatches: bool = False
    split_backward_retains_graph: bool = False
    pp_recv_buffers_per_microbatch: bool = False
    softmax_in_place: bool = False
    zero3_gather_unit: str = "block"
    zero3_max_live_params: float = 0.0
    zero3_reduce_bucket_params: float = 0.0
    zero3_grads_fp32: bool = True
    zero3_step_fp32_grad_params: float = 0.0
    pp_scatter_gather: bool = False
    grad_reduce_fp32: bool = True
    selective_mode: str = "attention_core"
    attention_kernel: str = "flash-attention-2"
    moe_hierarchical: bool = False
    moe_allgather: bool = False
    moe_dispatchers: tuple[str, ...] | None = None
    moe_deepep: bool = False
    moe_shared_overlap: bool = False
    moe_overlap_needs: tuple[str, ...] = ()
    moe_overlap_extra_microbatch: bool = False
    grad16_buffer_bytes: float | None = None
    eager_ops: tuple[str, ...] = ()
    moe_sp_dispatch: bool = False
    moe_expert_launches: str = "per_expert"
    moe_expert_sort: str = "never"
    moe_count_exchange: str = "none"
    moe_combine_scores: str = "in_activation"
    cp_flavours: tuple[str, ...] = ("p2p",)
    zero3_hierarchical: bool = True
    zero3_regather_for_recompute: bool = False
    executor_code: bool = False
    bf16_autocast: bool = False
    moe_expert_impl: str = "grouped"
    adamw_impl: str = "fused"
    sdpa_gqa: str = "native"
    zero3_sync_per_tensor: bool = False
    zero3_layer_collectives: bool = True
    fp8_casts: bool = True
    fp8_16bit_gemms: bool = True
    grad_accum_paths: tuple[AccumulationEntry, ...] = ()
    grad_accum_memory: bool = True


@dataclass(frozen=True)
class LayerCosts:
    """Arrays of length L = num_layers + 2 over (tok_embeddings, layers.0..n-1, output); one micro-batch, one GPU."""

    names: tuple[str, ...]
    forward_s: np.ndarray  # TP/EP/CP communication that is not hidden included
    backward_s: np.ndarray  # without recompute
    recompute_s: np.ndarray  # extra time of the candidate's recompute mode
    full_recompute_s: np.ndarray  # extra time if this layer is fully recomputed (= its forward)
    static_bytes: np.ndarray  # params + grads + optimizer states after TP/EP sharding and ZeRO division
    activation_bytes: np.ndarray  # saved per micro-batch under the candidate's recompute mode
    full_recompute_activation_bytes: np.ndarray  # saved per micro-batch if fully recomputed


@dataclass(frozen=True)
class Detail:
    """LayerCosts plus the parts evaluate needs for the breakdown and the data-parallel terms."""

    costs: LayerCosts
    compute_s: np.ndarray  # forward + backward compute (no comm)
    tp_s: np.ndarray
    ep_s: np.ndarray
    cp_s: np.ndarray
    bwd_compute_s: np.ndarray  # the window a gradient reduction can hide behind
    weight_bytes: np.ndarray
    grad_bytes: np.ndarray
    optimizer_bytes: np.ndarray
    dense_params: np.ndarray
    expert_params: np.ndarray
    model_fwd_flops: np.ndarray  # per sequence, whole module, full-attention convention, no capacity padding
    hw_fwd_flops: np.ndarray  # per sequence, with MoE capacity padding
    core_fwd_flops: np.ndarray  # per sequence, attention core (what selective recompute reruns)
    prefix: np.ndarray | None = None  # prefix sums of every evaluate row (planner.cost.arrays.prefix_sums)

    @property
    def model_fwd_total(self) -> float:
        return float(self.model_fwd_flops.sum())

    @property
    def hw_fwd_total(self) -> float:
        return float(self.hw_fwd_flops.sum())
