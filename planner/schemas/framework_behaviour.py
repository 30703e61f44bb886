"""The `behaviour` section of a framework profile: how a stack runs what it runs, as the cost model reads it.

Which communication the stack overlaps (Overlap), its kernels (Kernels), the bytes and allocator habits of its
memory (RecipeBytes, MemoryHabits), what it does when nothing is said (TrainingDefaults, RecipeRecompute), how it
runs an MoE layer (MoeExecution) and, for this repository's executor, the facts of its own code (ExecutorCode).
Split from planner.schemas.framework (the profile, its capabilities and export naming), which holds `behaviour`
as a Behaviour and is where a profile is read from; `Sourced` (every section's `source` field) lives here so both
modules share one definition.
"""

from typing import Annotated, Literal

from pydantic import Field, model_validator

from planner.schemas.base import Schema

Sourced = Field(min_length=1, description="the framework file, flag or document these facts come from")


class Overlap(Schema):
    """Which communication the stack hides behind compute (read by the cost model)."""

    tp_comm: bool = Field(description="TP all-gather/reduce-scatter overlapped with GEMMs (userbuffers, async TP)")
    dp_grad_reduce: bool = Field(description="gradient all-reduce/reduce-scatter overlapped with backward")
    dp_param_gather: bool = Field(description="ZeRO-1/2: the all-gather of the updated parameters overlapped with "
                                              "the next step's first forward (ZeRO-3 gathers: zero3_prefetch_layers)")
    pp_send_recv: bool = Field(description="pipeline sends/receives overlapped with compute")
    moe_all_to_all: bool = Field(description="MoE dispatch/combine all-to-all overlapped with compute")
    zero3_prefetch_layers: int = Field(ge=0, description="layers whose parameters are gathered ahead (prefetch depth)")
    pp_scatter_gather: bool = Field(default=False, description="pipeline sends split over the TP ranks and all-gathered "
                                                               "by the receiver (2021 Megatron-LM scatter/gather)")
    moe_shared_expert_overlap: bool = Field(default=False, description="shared experts compute while the MoE dispatcher "
                                                                       "communicates (Megatron-Core --moe-shared-expert-overlap)")
    moe_all_to_all_needs: tuple[Literal["interleaved_when_pp", "no_full_recompute", "half_precision", "no_moe_recompute",
                                        "single_mtp_layer"], ...] = Field(
        default=(), description="conditions the stack sets on its batch-level MoE all-to-all overlap (moe_all_to_all), "
        "without which it runs the all-to-all exposed: interleaved_when_pp (pp > 1 needs virtual stages), "
        "no_full_recompute (no full recompute of any layer), half_precision (bf16/fp16 parameters), "
        "no_moe_recompute (selective recompute does not rerun the MoE block), single_mtp_layer (at most one "
        "multi-token prediction layer); planner.cost.moe_comm.batch_overlap_applies")
    moe_all_to_all_extra_microbatch: bool = Field(default=False, description="the batch-level MoE overlap holds one "
        "more micro-batch (one model chunk with virtual stages) in flight than the schedule without it (Megatron-Core's "
        "combined 1F1B; planner.cost.pipelining_memory.ep_overlap_extra_microbatches)")
    zero3_hierarchical: bool = Field(default=True, description="ZeRO-3 gathers/reduce-scatters cross nodes once per "
                                                               "node (NCCL hierarchical); False: a flat ring per rank")
    zero3_regather_for_recompute: bool = Field(default=False, description="with full recompute, ZeRO-3 gathers the "
                                                                          "weights again for the recompute forward")
    zero3_sync_per_tensor: bool = Field(default=False, description="ZeRO-3 gathers each parameter tensor by its own "
                                        "synchronous collective copied out rank by rank (DeepSpeed before v0.5.6)")
    source: str = Sourced


class Kernels(Schema):
    fused_attention: bool = Field(description="flash/cuDNN attention: no s x s score tensor saved")
    attention_kernel: Literal["flash-attention-1", "flash-attention-2", "cudnn"] = Field(
        default="flash-attention-2", description="the fused-attention kernel the stack runs on Hopper-class GPUs: "
        "FlashAttention v1 (about half the v2 rate), FlashAttention-2, or cuDNN's fused attention (Transformer "
        "Engine's FusedAttention); priced at the device family's measured rate (planner/cost/calibration.yaml)")
    fused_norm: bool
    fused_activation: bool
    eager_ops: tuple[Literal["activation", "rope", "norm"], ...] = Field(default=(), description=(
        "components the stack's code runs as several eager PyTorch ops under its 16-bit recipe (fp32 upcasts, a "
        "kernel per op), priced with planner.cost.kernel_bytes.EAGER's bytes for that component; the others as one "
        "fused kernel each (kernel_bytes.FUSED)"))
    softmax_backward_in_place: bool = Field(default=False, description="without fused attention: the softmax "
                                            "backward overwrites its output gradient (Megatron's fused scaled-masked "
                                            "softmax) instead of writing a second s x s tensor")
    source: str = Sourced


class RecipeBytes(Schema):
    """Bytes per parameter one precision recipe holds and moves, as the stack runs it (before ZeRO division): read by
    the cost model instead of its default for that precision (planner.cost.memory.RECIPES)."""

    weights: float = Field(ge=0, le=16, description="parameters, plus any cast copies held through backward")
    grads: float = Field(ge=0, le=16, description="gradients")
    optimizer: float = Field(ge=0, le=32, description="optimizer: fp32 master copy (if any) and Adam moments")
    grad_reduce: float = Field(ge=0, le=8, description="bytes per gradient element in the data-parallel reduction")
    gather: float = Field(ge=0, le=8, description="bytes per weight element in ZeRO all-gathers")
    source: str = Sourced


class MemoryHabits(Schema):
    recipes: dict[Literal["bf16", "amp-bf16", "fp32", "fp8"], RecipeBytes] = Field(
        default_factory=dict, description="precision -> the bytes per parameter of the stack's own recipe; a "
                                          "precision not listed takes the cost model's default")
    main_grads_fp32: bool = Field(description="gradients accumulated in an fp32 buffer (4 bytes/param) under bf16")
    distributed_optimizer: bool = Field(description="ZeRO-1 is the stack's distributed optimizer")
    allocator: Literal["default", "expandable_segments"] = Field(
        default="default", description="the CUDA caching allocator setting the stack's launch runs under "
        "(PYTORCH_CUDA_ALLOC_CONF / PYTORCH_ALLOC_CONF expandable_segments:True, else PyTorch's default); the cost "
        "model's allocator allowance is calibration.yaml's `memory` entry of this setting")
    allocator_source: str = Field(default="not set by the stack's launch: PyTorch's default caching allocator",
                                  min_length=1, description="where the stack's launch sets `allocator`")
    allocator_allowance_fraction: float | None = Field(
        default=None, ge=0, lt=0.5, description="an allowance of one's own (device memory kept beyond the allocated "
        "bytes, a fraction of them) in place of calibration.yaml's for `allocator`; None: calibration.yaml's")
    selective_recompute: Literal["attention_core", "half_forward", "norm_and_up_proj", "op_sac"] = Field(
        default="attention_core", description="what `selective` recompute reruns: the attention core (Megatron, "
                                              "Korthikanti et al. 2022), half of each layer's forward (torchtitan's "
                                              "every-other-layer option), the norms and MLA up-projections "
                                              "(DeepSeek-V3), or torchtitan's per-op policy (planner.cost.sac)")
    fp8_saves_fp8_inputs: bool = Field(default=True, description="under fp8 the GEMMs save their fp8-cast inputs "
                                       "for backward (Transformer Engine); False: the high-precision inputs (torchao "
                                       "Float8Linear saves input_hp and weight_hp)")
    grad_reduce_fp32: bool = Field(default=True, description="gradients reduced across data-parallel ranks in fp32 "
                                                             "(else in the 16-bit training dtype)")
    logits_live_in_backward: bool = Field(default=False, description="the loop keeps the loss's fp32 logits alive "
                                          "through the layers' backward (a HuggingFace model's output object holds them)")
    fsdp_grads_unsharded_across_microbatches: bool = Field(
        default=False, description="ZeRO-2/3 by FSDP2 reduce-scatters only after the step's last micro-batch: the "
                                   "rank holds its unsharded gradients through the step (more than one micro-batch)")
    split_backward_retains_graph: bool = Field(
        default=False, description="torch.distributed.pipelining's split backward (ScheduleInterleavedZeroBubble): the "
                                   "B pass retains each micro-batch's graph and weight-gradient inputs until its W "
                                   "pass, which lags rank r's B pass by r micro-batches")
    pp_recv_buffers_per_microbatch: bool = Field(
        default=False, description="torch.distributed.pipelining's PipelineStage allocates an activation and a "
                                   "gradient receive buffer per micro-batch, alive through the step")
    zero3_gather_unit: Literal["block", "module"] = Field(
        default="block", description="what ZeRO-3 gathers at once: a whole block (FSDP, Megatron-FSDP) or one "
                                     "sub-module (DeepSpeed ZeRO-3's per-module hooks)")
    zero3_max_live_params: float = Field(default=0, ge=0, le=1e12, description="gathered parameters a per-module "
                                         "ZeRO-3 keeps resident (DeepSpeed stage3_max_live_parameters)")
    zero3_reduce_bucket_params: float = Field(default=0, ge=0, le=1e12, description="elements of the contiguous "
                                              "16-bit gradient bucket ZeRO-3 allocates once (DeepSpeed reduce_bucket_size)")
    zero3_grads_fp32: bool = Field(default=True, description="under ZeRO-3 the gradient partition is fp32; False: "
                                   "the 16-bit dtype, cast to fp32 only in the optimizer step (DeepSpeed stage 3)")
    zero3_step_fp32_grad_params: float = Field(default=0, ge=0, le=1e12, description="with zero3_grads_fp32 false: "
                                               "parameters whose fp32 gradient copies the optimizer step holds at once "
                                               "(DeepSpeed: two sub-groups of sub_group_size)")
    source: str = Sourced


class RecipeRecompute(Schema):
    """The activation recompute one of the stack's own recipes (launch script, train config) runs for one model."""

    model: str = Field(min_length=1, description="the recipe's model and file, e.g. 'llama3_70b.toml'")
    params_b: float = Field(gt=0, le=1e5, description="the model's total parameters, billions")
    moe: bool = Field(default=False, description="a mixture-of-experts model")
    recompute: Literal["none", "selective", "full"]
    modules: tuple[str, ...] = Field(default=(), description="with selective: the modules the recipe reruns, in the "
                                     "stack's names (Megatron-Core --recompute-modules); () = the stack's selective")
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=4096, description=(
        "the device memory the recipe is made for, where the stack's recipes differ by device (NeMo's per-GPU "
        "configuration files); None = any"))

    @model_validator(mode="after")
    def _modules_need_selective(self) -> "RecipeRecompute":
        if self.modules and self.recompute != "selective":
            raise ValueError(f"modules={list(self.modules)} need recompute 'selective', got {self.recompute!r}")
        return self


class TrainingDefaults(Schema):
    """What the stack does when neither the model nor the request says (a model spec's None fields)."""

    dropout: bool = Field(default=False, description="dropout layers on by default (attention and hidden dropout)")
    source: str = Field(default="no dropout unless the model says", min_length=1)
    recompute_recipes: tuple[RecipeRecompute, ...] = Field(
        default=(), description="the recompute of the stack's own recipes by model size: what a published run that "
        "does not state its recompute is read to have run (benchmarks/published_runs.py recipe_recompute)")
    recompute_source: str = Field(default="no recipe recorded", min_length=1)


class ExecutorCode(Schema):
    """The stack is this repository's executor: its memory and eager time are counted from its own code
    (planner.cost.executor), with the implementation facts below (each cited in `source`)."""

    bf16_recipe: Literal["autocast", "bf16-params"] = Field(description="how `--precision bf16` runs: fp32 "
                                                                   "parameters under torch.autocast, or bf16 parameters")
    moe_expert_impl: Literal["loop", "grouped"] = Field(description="routed experts as a Python loop of per-expert "
                                                                    "GEMMs over weight slices, or grouped GEMMs")
    adamw_impl: Literal["foreach", "fused"] = Field(description="torch.optim.AdamW's implementation: the foreach "
                                                                "multi-tensor passes (torch's CUDA default) or fused")
    sdpa_gqa: Literal["repeat", "native"] = Field(description="GQA's k and v: repeated to every query head before "
                                                              "SDPA, or passed with their kv heads (enable_gqa) in the "
                                                              "16-bit recipes (fp32 on CUDA repeats either way)")
    source: str = Sourced


class MoeExecution(Schema):
    """How the stack runs an MoE layer besides its dispatcher and overlaps (read by the cost model:
    planner.cost.moe_layer). Defaults: tokens replicated over TP, one GEMM launch per expert per matmul, no second
    sort, no token-count exchange (what the cost model priced before these facts)."""

    sequence_parallel_dispatch: bool = Field(default=False, description="each TP rank routes and dispatches its own "
        "sequence-parallel shard of the tokens, all-gathers the routed tokens over the expert-TP group before the "
        "experts and reduce-scatters them after; the MoE block has no TP all-gather/reduce-scatter of its own "
        "(shared experts keep theirs)")
    expert_gemm_launches: Literal["per_expert", "per_matmul"] = Field(default="per_expert", description="GEMM kernels "
        "the routed experts launch: one per local expert per matmul, or one grouped kernel per matmul")
    expert_sort: Literal["never", "several_local_experts", "expert_parallel"] = Field(default="never", description=
        "when the received tokens are sorted again by local expert before the experts (and back after): with more "
        "than one local expert, or with ep > 1")
    token_count_exchange: Literal["none", "all_gather", "all_to_all"] = Field(default="none", description="the "
        "collective that exchanges tokens-per-expert counts before each dispatch (forward only)")
    combine_scores: Literal["in_activation", "fp32_multiply"] = Field(default="in_activation", description="where "
        "the routing scores weight the expert outputs: inside the fused activation (nothing extra), or by an eager "
        "fp32 multiply of the combined rows that keeps their fp32 copy for backward")
    flex_kernels: Literal["own", "deepep"] = Field(default="own", description="what runs the flex (per-node "
        "deduplicated) dispatcher: DeepEP's Buffer, which has configurations for some group sizes only and holds its "
        "NVLink and RDMA buffers (planner.cost.moe_comm.deepep_buffer_bytes), or the stack's own kernels")
    source: str = Field(default="not stated: the cost model's defaults", min_length=1)


class AccumulationPath(Schema):
    """One way a stack sums a weight dtype's gradients over the micro-batches of a step: its HBM traffic and what
    its optimizer holds meanwhile (planner.cost.grad_accumulation)."""

    name: Literal["fused", "autograd", "fp32_main_grad_hook", "bf16_optimizer"] = Field(description="fused: into "
        "the weight-gradient GEMM; autograd: torch's AccumulateGrad adds into .grad in place; fp32_main_grad_hook: a "
        "hook adds .grad into an fp32 buffer; bf16_optimizer: DeepSpeed's BF16_Optimizer update_hp_grads")
    dtype: Literal["bf16", "fp16"] = Field(description="the 16-bit weight dtype it is run for")
    zero_stages: tuple[Annotated[int, Field(ge=0, le=3)], ...] = Field(description="ZeRO stages it runs at (ZeRO-2/3 "
                                         "reduce-scatter every micro-batch into sharded gradients instead)")
    pipeline: bool | None = Field(default=None, description="only with (True) or without (False) pipeline stages")
    bytes_per_element: float = Field(ge=0, le=64, description="HBM bytes read and written per gradient element per "
                                     "micro-batch beyond the weight-gradient GEMM's own output")
    every_microbatch: bool = Field(description="the first micro-batch pays too (a copy into a separate buffer); "
                                   "False: the first gradient is stored and the later ones added in place")
    grad_bytes: float | None = Field(default=None, ge=0, le=64, description="bytes per parameter of the gradients "
                                     "this path holds through the backward (every copy it keeps, unsharded), in place "
                                     "of the recipe's; None: the recipe's")
    bucket_params: float = Field(default=0, ge=0, le=1e12, description="elements of the contiguous 16-bit gradient "
                                 "bucket the path's optimizer allocates for each backward (DeepSpeed reduce_bucket_size)")
    shards_optimizer: bool = Field(default=False, description="its optimizer partitions the fp32 master weights and "
                                   "moments over the data-parallel ranks even at ZeRO-0 (DeepSpeed BF16_Optimizer)")


class GradAccumulation(Schema):
    """Gradient accumulation over micro-batches (planner.cost.grad_accumulation): the first path that matches a
    candidate's dtype, ZeRO stage and pipeline is priced; bf16 is what the planner's bf16 and fp8 recipes run, fp16
    is read for runs that state it (benchmarks/published_grad_accumulation.grad_accumulation_of)."""

    paths: tuple[AccumulationPath, ...]
    source: str = Sourced


class Behaviour(Schema):
    overlap: Overlap
    kernels: Kernels
    memory: MemoryHabits
    grad_accumulation: GradAccumulation | None = Field(default=None, description="unfused gradient accumulation "
                                                       "over micro-batches; None: none priced (fused or sharded)")
    defaults: TrainingDefaults = Field(default_factory=TrainingDefaults)
    moe: MoeExecution = Field(default_factory=MoeExecution)
    executor: ExecutorCode | None = Field(default=None, description="set for the planner's own executor only")
