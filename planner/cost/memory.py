"""Memory per GPU: parameters, gradients and optimizer states per precision recipe with ZeRO sharding, and
activations saved per micro-batch per layer (Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models").

Bytes per parameter (Adam), split weights / grads / optimizer:
- bf16 (Megatron-LM mixed precision with the distributed-optimizer accounting): bf16 weights 2 + fp32 main
  grads 4 + fp32 master weights 4 + Adam m and v 8 = 18.
- amp-bf16 (torch.autocast): fp32 weights 4 + fp32 grads 4 + Adam 8 = 16, plus 2 for the bf16 copies of the
  weights that autocast's cast cache holds from the first use in forward until the end of backward.
- fp32: weights 4 + grads 4 + Adam 8 = 16.
- fp8 (Transformer Engine): as bf16, plus 1 for the fp8 weight copy cached for the GEMMs = 19.
ZeRO (Rajbhandari et al. 2020, Sec. 5): stage 1 divides the optimizer states (with the fp32 master) by dp,
stage 2 also the gradients, stage 3 also the weights (plus the working set of gathered layers).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from planner.cost import moe_comm
from planner.cost.compute import ACT_BYTES, Shape, moe_rows
from planner.schemas.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class Recipe:
    """Bytes per parameter held on the GPU (before ZeRO division)."""

    weight_bytes: float
    grad_bytes: float
    optimizer_bytes: float
    grad_reduce_bytes: float  # bytes per gradient element in the data-parallel reduction
    gather_bytes: float  # bytes per weight element in ZeRO all-gathers

    @property
    def total(self) -> float:
        return self.weight_bytes + self.grad_bytes + self.optimizer_bytes


RECIPES: Mapping[str, Recipe] = MappingProxyType({
    "bf16": Recipe(weight_bytes=2, grad_bytes=4, optimizer_bytes=12, grad_reduce_bytes=4, gather_bytes=2),
    "amp-bf16": Recipe(weight_bytes=4 + 2, grad_bytes=4, optimizer_bytes=8, grad_reduce_bytes=4, gather_bytes=4),
    "fp32": Recipe(weight_bytes=4, grad_bytes=4, optimizer_bytes=8, grad_reduce_bytes=4, gather_bytes=4),
    "fp8": Recipe(weight_bytes=2 + 1, grad_bytes=4, optimizer_bytes=12, grad_reduce_bytes=4, gather_bytes=2),
})

FP32_MASTER_PARAMS_BF16 = Recipe(weight_bytes=4, grad_bytes=4, optimizer_bytes=8, grad_reduce_bytes=4, gather_bytes=2)
"""bf16 compute where the parameters themselves are the fp32 master (PyTorch FSDP1/FSDP2 MixedPrecision with
param_dtype=bf16, reduce_dtype=fp32; the planner's executor): fp32 params 4 + fp32 grads 4 + Adam m and v 8 = 16
bytes per parameter, sharded by ZeRO as usual; the bf16 copy exists only for the module being computed (the
ZeRO-3 working set). Chosen by the stack's behaviour.memory.main_grads_fp32 = false (planner.cost.model)."""

OPTIMIZER_BYTES_TOUCHED: Mapping[str, int] = MappingProxyType({"bf16": 30, "amp-bf16": 28, "fp32": 28, "fp8": 31})
"""HBM bytes an Adam step moves per parameter: read master/weights, grads, m, v; write master, m, v (and the
low-precision copy). bf16: read 4+4+4+4, write 4+4+4+2 = 30; fp32/amp-bf16: read 16, write 12 = 28."""


AUTOCAST_CAST_BYTES: Mapping[str, tuple[float, float]] = MappingProxyType({"amp-bf16": (6.0, 10.0)})
"""HBM bytes per parameter per micro-batch that torch.autocast adds (forward, backward): forward reads each fp32
weight and writes its bf16 copy (4 + 2); backward casts the bf16 weight gradient to fp32 (2 + 4) and accumulates it
into the fp32 .grad (read 4, amortised write ~0). Other recipes keep low-precision weights: no casts."""


def static_split(params: float, recipe: Recipe, *, zero_stage: int, dp: int) -> tuple[float, float, float]:
    """(weights, grads, optimizer) bytes of `params` parameters on one GPU after ZeRO division by dp."""
    weights = params * recipe.weight_bytes / (dp if zero_stage >= 3 else 1)
    grads = params * recipe.grad_bytes / (dp if zero_stage >= 2 else 1)
    optimizer = params * recipe.optimizer_bytes / (dp if zero_stage >= 1 else 1)
    return weights, grads, optimizer


@dataclass(frozen=True)
class LayerActivations:
    """Bytes one micro-batch saves for backward in one decoder layer on one GPU."""

    none: float  # no recompute
    selective: float  # attention core recomputed
    full: float  # only the layer input kept
    transient: float = 0.0  # gradients in flight while the layer runs its backward (backward_transient_bytes)


def decoder_activation_bytes(spec: ModelSpec, shape: Shape, *, moe_layer: bool) -> LayerActivations:
    """Saved activations of one decoder layer, generalising Korthikanti et al. 2022 (Sec. 4.1, Table 2).

    For GPT with dropout and no flash this is s*b*h*(34 + 5*a*s/h) bytes without parallelism,
    s*b*h*(10 + 24/t + 5*a*s/(h*t)) with TP and no SP, s*b*h*(34/t + 5*a*s/(h*t)) with TP+SP. Terms (bf16):
    norm inputs 2*2sbh, QKV input 2sbh, Q/K/V 2*s*b*d*(a + 2kv)/t, scores: softmax output 2*a*s^2*b/t
    (+ dropout mask a*s^2*b and output 2*a*s^2*b when dropout), out-proj input 2*s*b*a*d/t, FFN input 2sbh,
    FFN intermediates: plain 4*s*b*f/t (activation input and fc2 input), gated 6*s*b*f/t (Megatron's fused
    SwiGLU keeps its 2f-wide input and the fc2 input), dropout masks sbh each. Flash attention keeps no
    s^2 scores, only the fp32 log-sum-exp 4*b*a*s/t. Selective recompute drops the s^2 terms; full recompute
    keeps the layer input 2sbh (/t with SP). MoE: router logits fp32, the routed tokens (x top_k x capacity)
    at the expert input and intermediates; the expert input is what the experts' fc1 (column-parallel over the
    expert-TP ranks) saves, whole rows of h for every token the GPU's experts take in (compute.moe_rows: Megatron-Core
    TEGroupedMLP's linear_fc1 saves the all-gathered dispatch output, experts.py; torchtitan's experts run on the
    TP-replicated tokens), so it is not divided by tp; the intermediates are (f split by etp). Where the stack weights
    the combined rows by their scores in an eager fp32 multiply (torchtitan: compute.FP32_SCORE_MULTIPLY_BYTES), the
    fp32 copy it keeps, 4 bytes per element of the dispatch-side rows. Replicated regions (norms, FFN/QKV inputs, dropout masks) are
    divided by tp only with SP. CP splits the sequence. Eager kernels (Shape.fused_kernels False) save more per
    norm and FFN element (kernel_bytes.KernelBytes: HuggingFace's fp32 RMSNorm keeps 10 bytes per element, not 2).
    Under the fp8 recipe (Shape.fp8_inputs) the inputs saved for the backward of the linear layers (QKV, out-proj,
    FFN and expert inputs, fc2 input) are the fp8 casts, 1 byte per element (Transformer Engine Linear keeps its
    fp8 input; DeepSeek-V3 report Sec. 3.3.3 caches the MoE inputs in fp8); attention inputs stay bf16.
    """
    b, s, t = shape.microbatch_size, shape.seq_len / shape.cp, shape.tp
    h, a = spec.hidden_size, spec.num_attention_heads
    sbh = s * b * h
    k = shape.kernels
    g = 1 if shape.fp8_inputs else 2  # bytes of a saved GEMM input (Transformer Engine keeps the fp8 cast)
    saved_norm = k.saved_rmsnorm if spec.norm == "rmsnorm" else k.saved_layernorm
    replicated = (spec.norms_per_layer * saved_norm + g + g) * sbh + (2 * sbh if shape.dropout else 0)
    ffn = ffn_saved_bytes(spec, shape, moe_layer=moe_layer)
    if shape.flash_attention:
        core = 4 * b * a * s
    else:
        core = a * s * (s * shape.cp) * b * (5 if shape.dropout else 2)
    base = replicated / shape.sp_div + attention_saved_bytes(spec, shape) / t + ffn.total
    full = 2 * sbh / shape.sp_div
    return LayerActivations(none=base + core / t, selective=base, full=full,
                            transient=backward_transient_bytes(spec, shape, moe_layer=moe_layer))


@dataclass(frozen=True)
class FfnSaved:
    """What one decoder layer's FFN (dense MLP or MoE) saves for backward on one GPU, by the part a selective
    recompute of one module drops (planner.cost.selective): the dense MLP's intermediates; the routed experts'
    intermediates (`routed`: fc1 output and fc2 input; `routed_act_out`: the fc2 input alone); the shared experts'
    intermediates; the router's fp32 logits; the experts' fc1 input rows (and the fp32 score copy)."""

    mlp: float = 0.0
    routed: float = 0.0
    routed_act_out: float = 0.0  # part of `routed`, not added to the total
    shared: float = 0.0
    router: float = 0.0
    expert_input: float = 0.0

    @property
    def total(self) -> float:
        return self.mlp + self.moe

    @property
    def moe(self) -> float:
        """Everything inside the MoE layer (its input, the pre-MLP norm's output, is kept by the layer)."""
        return self.routed + self.shared + self.router + self.expert_input


def ffn_saved_bytes(spec: ModelSpec, shape: Shape, *, moe_layer: bool) -> FfnSaved:
    """The FFN's terms of decoder_activation_bytes: intermediates of plain 4 and gated 6 bytes per element of f
    (KernelBytes.saved_*: the activation input and the fc2 input, the latter g bytes under fp8), split by tp; for
    MoE layers over the routed tokens (x top_k x capacity) and the shared experts, plus the router's fp32 logits
    (replicated, /tp with SP) and the experts' fc1 input rows (whole rows of h, compute.moe_rows)."""
    b, s, t = shape.microbatch_size, shape.seq_len / shape.cp, shape.tp
    k, h = shape.kernels, spec.hidden_size
    g = 1 if shape.fp8_inputs else 2
    saved_ffn = (k.saved_gated if spec.gated else k.saved_plain) - (2 - g)  # the fc2 input is a GEMM input
    if not moe_layer:
        return FfnSaved(mlp=s * b * saved_ffn * spec.ffn_hidden_size / t)
    cfg = spec.moe
    routed = s * b * cfg.top_k * moe_comm.load_factor(cfg) * cfg.expert_ffn_hidden_size / t
    expert_input = g * h * moe_rows(spec, shape)[1]  # fc1's saved input: whole rows of h, not split by tp
    if shape.moe_combine_scores == "fp32_multiply":  # the fp32 copy the scores' multiply keeps (compute.FP32_SCORE_MULTIPLY_BYTES)
        expert_input += 4 * h * moe_rows(spec, shape)[0]
    return FfnSaved(routed=routed * saved_ffn, routed_act_out=routed * g,
                    shared=s * b * saved_ffn * cfg.shared_ffn_hidden_size / t,
                    router=4 * s * b * cfg.num_experts / shape.sp_div, expert_input=expert_input)


def attention_saved_bytes(spec: ModelSpec, shape: Shape) -> float:
    """What attention saves between its input projection and its core, before the tp split: Q, K, V (bf16) and the
    out-projection input (the saved GEMM input: 1 byte under fp8). The core's own (scores or log-sum-exp) apart."""
    b, s = shape.microbatch_size, shape.seq_len / shape.cp
    a, kv, d = spec.num_attention_heads, spec.kv_heads, spec.dim_per_head
    qk_d, v_d = (d, d) if spec.mla is None else (spec.mla.qk_nope_head_dim + spec.mla.qk_rope_head_dim, spec.mla.v_head_dim)
    g = 1 if shape.fp8_inputs else 2
    return 2 * s * b * (a * qk_d + kv * qk_d + kv * v_d) + g * s * b * a * v_d


def backward_transient_bytes(spec: ModelSpec, shape: Shape, *, moe_layer: bool) -> float:
    """Gradient tensors one layer's backward holds beyond what it saved: an elementwise op's backward reads the
    gradient of its output and writes that of its input, both alive at once (16-bit each). The largest such pair:
    without fused attention the softmax over the s x s scores per head (2 * a*s^2*b elements; a*s^2*b when the
    stack's fused softmax backward runs in place, megatron/fused_kernels/scaled_upper_triang_masked_softmax_cuda.cu
    "backward pass is completely in-place"), else the FFN
    activation function (output f wide, input f wide, or 2f for a gated unit: Megatron's fused SwiGLU takes
    the 2f-wide fc1 output; HuggingFace's act(gate) * up holds f + f + f), or for MoE layers the same over the
    routed tokens (what one GPU receives, as decoder_activation_bytes) or the shared experts.
    Measured: without this term the unfused-attention steps of benchmarks/gpu_memory.py exceed the prediction
    (benchmarks/memory_mechanisms.py)."""
    b, s, t = shape.microbatch_size, shape.seq_len / shape.cp, shape.tp
    pair = 3 if spec.gated else 2  # output gradient f wide + input gradient f (2f gated) wide, in units of f
    largest = s * b * pair * spec.ffn_hidden_size
    if moe_layer:
        cfg = spec.moe
        routed = s * b * cfg.top_k * moe_comm.load_factor(cfg)
        largest = max(s * b * pair * cfg.shared_ffn_hidden_size, routed * pair * cfg.expert_ffn_hidden_size)
    if not shape.flash_attention:  # an in-place softmax backward (Megatron's fused kernel) writes no second tensor
        largest = max(largest, (1 if shape.softmax_in_place else 2) * spec.num_attention_heads * s * (s * shape.cp) * b)
    return 2 * largest / t


def recompute_working_set_bytes(layer: LayerActivations) -> float:
    """What full recompute adds at its peak: the layer being recomputed holds everything it saves without
    recompute (its checkpoint is already counted among the saved inputs) while its backward runs. Megatron-LM's
    CheckpointFunction and torch.utils.checkpoint rerun one layer's forward at a time inside the backward
    (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost", Sec. 4: the peak is the checkpoints plus
    one segment's activations). Measured: benchmarks/gpu_memory.py, benchmarks/memory_mechanisms.py."""
    return max(0.0, layer.none - layer.full)


def zero3_working_set_bytes(module_params: float, *, gather_bytes: float, unit: str, max_live_params: float) -> float:
    """Gathered weights (and unsharded gradients) a ZeRO-3 stack holds at once, by how it gathers.

    unit "block" (PyTorch FSDP1/FSDP2, Megatron-FSDP): the running block and the prefetched next, each gathered
    whole, `module_params` being the largest block. unit "module" (DeepSpeed ZeRO-3: per sub-module hooks,
    deepspeed/runtime/zero/partitioned_param_coordinator.py): the parameter coordinator keeps at most
    stage3_max_live_parameters gathered, but always the module running (`module_params` = the largest single
    nn.Linear / embedding); in backward that module's full-size weight gradient exists until it is reduce-scattered.
    """
    if unit == "module":
        return (max(max_live_params, module_params) + module_params) * gather_bytes
    return 2 * module_params * gather_bytes


DEEPSPEED_REDUCE_BUCKET_BYTES = 2
"""Bytes per element of DeepSpeed ZeRO-3's contiguous gradient bucket (reduce_bucket_size elements of the 16-bit
training dtype, allocated once: deepspeed/runtime/zero/stage3.py __ipg_bucket_flat_buffer). Measured as the
difference of the static bytes with reduce_bucket_size 5e8 and 1e7 (profiles/memory-h200.json)."""


def reduce_bucket_bytes(bucket_params: float) -> float:
    """The contiguous gradient bucket a ZeRO-3 stack allocates once (behaviour.memory.zero3_reduce_bucket_params)."""
    return bucket_params * DEEPSPEED_REDUCE_BUCKET_BYTES


def embedding_activation_bytes(spec: ModelSpec, shape: Shape) -> float:
    """The embedding keeps the token ids (int64) and, with dropout, its 1-byte mask of T*h (/t with SP)."""
    ids = 8 * shape.tokens
    return ids + (shape.tokens * spec.hidden_size / shape.sp_div if shape.dropout else 0)


def head_activation_bytes(spec: ModelSpec, shape: Shape) -> float:
    """Final norm input and LM-head input (2*T*h each, /t with SP) and the fp32 softmax that the vocab-parallel
    cross-entropy keeps for backward (4*T*V/t; Megatron-LM tensor_parallel/cross_entropy.py)."""
    return 2 * 2 * shape.tokens * spec.hidden_size / shape.sp_div + 4 * shape.tokens * spec.vocab_size / shape.tp


def logits_buffer_bytes(spec: ModelSpec, shape: Shape) -> float:
    """Transient logits on the last stage: the fp32 working copy of T*V/t (s*b*V/t*4 bytes)."""
    return 4 * shape.tokens * spec.vocab_size / shape.tp


def p2p_activation_bytes(spec: ModelSpec, shape: Shape) -> float:
    """What one pipeline boundary sends per micro-batch each way: s*b*h bf16 (/t with SP)."""
    return shape.tokens * spec.hidden_size * ACT_BYTES / shape.sp_div
