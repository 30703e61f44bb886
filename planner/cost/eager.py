"""The eager recipe (amp-bf16): HuggingFace transformers' modeling code run by plain PyTorch under torch.autocast
(fp32 parameters and fp32 residual stream, bf16 matmuls, no fused kernels). Per module, the aten operators it
issues and the HBM bytes its memory-bound operators move, forward and backward, and the rule that turns them
into time.

Counted operator by operator from transformers 5.17 modeling_llama.py (LlamaRMSNorm, rotate_half RoPE with the
fp32 cos/sin the rotary module returns for fp32 inputs, sdpa_attention_forward with enable_gqa, LlamaMLP,
ForCausalLMLoss) and torch's autograd formulas, and checked against a TorchDispatchMode trace of
LlamaForCausalLM under autocast (benchmarks/eager_op_count.py; TinyLlama shape, one step with fused AdamW and
zero_grad(set_to_none=True)): per decoder layer 48 operators forward, 87 backward, 46 recomputed by
torch.utils.checkpoint (non-reentrant, early stop), 174 and 409 bytes per T*h element forward and backward.
Bytes are reads + writes of each operator's tensors (fp32 4, bf16 2 bytes per element); GEMMs, attention and
the weight casts are costed elsewhere (compute.gemm_time_s, memory.AUTOCAST_CAST_BYTES).

Time. A GPU runs the kernels in the order the host issues them and never ahead of it, so a phase of a module
(its forward; its backward with the recomputed forward of a checkpointed layer) takes the longer of its device
time and its host time (a lower bound of the exact queue, exact when one side dominates):
    phase_s = max(device_s + ops * eager_kernel_s, ops * eager_host_op_s)
device_s: GEMMs + bytes / achieved HBM bandwidth; eager_kernel_s: device time per kernel beyond that (launch gap,
ramp-up and tail, under-vectorised mixed-dtype kernels); eager_host_op_s: CPU time per operator (Python module
code, dispatcher, autocast, autograd recording or the autograd engine, allocator, launch). Both are global per
device family in calibration.yaml, derived from the H100 TinyLlama measurements (benchmarks/tinyllama_accuracy.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.compute import Shape
from planner.schemas.model import ModelSpec

RECIPE = "amp-bf16"
MODEL_SETUP_OPS = 16  # LlamaModel.forward outside the layers: rotary cos/sin (7), position ids and mask checks (9)
RECOMPUTE_SKIPPED_OPS = 2  # early stop: the last linear's GEMM and the closing residual add are not rerun


@dataclass(frozen=True, kw_only=True)
class OpCount:
    """Aten operators (about one kernel each) and bytes their memory-bound kernels move, forward and backward."""

    fwd_ops: int = 0
    bwd_ops: int = 0
    fwd_bytes: float = 0.0
    bwd_bytes: float = 0.0

    def __add__(self, other: "OpCount") -> "OpCount":
        return OpCount(fwd_ops=self.fwd_ops + other.fwd_ops, bwd_ops=self.bwd_ops + other.bwd_ops,
                       fwd_bytes=self.fwd_bytes + other.fwd_bytes, bwd_bytes=self.bwd_bytes + other.bwd_bytes)

    def times(self, n: int) -> "OpCount":
        return OpCount(fwd_ops=n * self.fwd_ops, bwd_ops=n * self.bwd_ops, fwd_bytes=n * self.fwd_bytes,
                       bwd_bytes=n * self.bwd_bytes)


def rmsnorm(elements: float) -> OpCount:
    """LlamaRMSNorm on fp32: pow (4+4), mean (4), +eps, rsqrt, x*r (4+4), weight* (4+4): 6 ops, 28 B/element.
    Backward: weight grad mul (4+4+4) and sum (4), g*w (4+4), the two products of x*r (12, 8) and the sum over h
    (4), rsqrt/+eps/mean backward on T values (3 ops), the mean's expand-divide (8), pow's x^1, *2, *g (8, 8, 12)
    and the sum of x's two gradients (12): 14 ops, 96 B/element."""
    return OpCount(fwd_ops=6, bwd_ops=14, fwd_bytes=28 * elements, bwd_bytes=96 * elements)


def layernorm(elements: float) -> OpCount:
    """F.layer_norm on fp32 (autocast's fp32 list): one kernel (4+4); backward one kernel (grad, x, dx: 12)."""
    return OpCount(fwd_ops=1, bwd_ops=1, fwd_bytes=8 * elements, bwd_bytes=12 * elements)


def linear(in_elements: float, out_elements: float, *, fp32_input: bool, bias: bool) -> OpCount:
    """nn.Linear under autocast: weight cast (cached per forward), GEMM, and for an fp32 input its bf16 cast
    (4+2). Backward: two GEMMs, the weight-gradient cast to fp32, for an fp32 input the input-gradient cast back
    (2+4); a bias adds its cast, and in backward the sum of the output gradient (2) and its cast."""
    cast = 6 * in_elements if fp32_input else 0.0
    return OpCount(fwd_ops=2 + fp32_input + bias, bwd_ops=3 + fp32_input + 2 * bias, fwd_bytes=cast,
                   bwd_bytes=cast + (2 * out_elements if bias else 0.0))


def fan_out(elements: float, consumers: int) -> OpCount:
    """An fp32 tensor read by `consumers` operators: autograd sums their gradients, consumers - 1 adds (4+4+4)."""
    return OpCount(bwd_ops=consumers - 1, bwd_bytes=12 * (consumers - 1) * elements)


def residual(elements: float) -> OpCount:
    """fp32 residual + bf16 branch output (4+2+4). Backward: the branch gradient cast to bf16 (4+2) and the sum
    of the skip gradient with the gradient through the following norm (12)."""
    return OpCount(fwd_ops=1, bwd_ops=2, fwd_bytes=10 * elements, bwd_bytes=18 * elements)


def rope(elements: float, tensors: int) -> OpCount:
    """rotate_half RoPE on a bf16 tensor with fp32 cos/sin, per tensor: q*cos (2+4), neg of one half (1+1), cat
    (2+2), *sin (2+4), add (4+4+4): 5 ops, 30 B/element. Backward: *sin (4+4), cast to bf16 (4+2), neg (1+1),
    two slice backwards (1+2 each), their sum (2+2+2), *cos (4+4), cast (4+2), sum (2+2+2), and the copy the
    transposed gradient needs before the projection's view (2+2): 10 ops, 52 B/element."""
    return OpCount(fwd_ops=5 * tensors, bwd_ops=10 * tensors, fwd_bytes=30 * elements, bwd_bytes=52 * elements)


def sdpa(cast_elements: float, casts: int) -> OpCount:
    """scaled_dot_product_attention (one kernel each way, its bytes are in the flash rate) plus autocast's bf16
    cast of its fp32 inputs (q and k after RoPE; 4+2) and the gradient casts back (2+4)."""
    return OpCount(fwd_ops=1 + casts, bwd_ops=1 + casts, fwd_bytes=6 * cast_elements, bwd_bytes=6 * cast_elements)


def activation(elements: float, *, gated: bool) -> OpCount:
    """bf16 MLP activation per f-element. Gated: act(gate) (2+2) and * up (2+2+2); backward: the two products of
    the mul (6 each) and act's backward (6). Plain: act (2+2); backward (2+2+2)."""
    if gated:
        return OpCount(fwd_ops=2, bwd_ops=3, fwd_bytes=10 * elements, bwd_bytes=18 * elements)
    return OpCount(fwd_ops=1, bwd_ops=1, fwd_bytes=4 * elements, bwd_bytes=6 * elements)


def supported(spec: ModelSpec, shape: Shape, *, moe_layer: bool) -> bool:
    """The count covers dense decoder layers with standard (GQA) attention through SDPA's fused kernel; MoE, MLA
    and unfused attention keep the generic model (kernel_bytes.KernelBytes)."""
    return not moe_layer and spec.mla is None and shape.flash_attention


def _norm(spec: ModelSpec, elements: float) -> OpCount:
    return rmsnorm(elements) if spec.norm == "rmsnorm" else layernorm(elements)


def decoder_ops(spec: ModelSpec, shape: Shape) -> OpCount:
    """One dense decoder layer, per GPU (module docstring): pre-norm attention and MLP blocks, each closed by a
    fp32 residual add; q, k, v and the MLP input projections each cast the fp32 norm output."""
    t, tokens = shape.tp, shape.tokens
    region = tokens * spec.hidden_size / shape.sp_div
    q = tokens * spec.num_attention_heads * spec.dim_per_head / t
    kv = tokens * spec.kv_heads * spec.dim_per_head / t
    f = tokens * spec.ffn_hidden_size / t
    qkv_bias, mlp_bias = spec.has_qkv_bias, spec.has_mlp_bias
    roped = spec.position == "rope"
    attention = (_norm(spec, region) + residual(region) + fan_out(region, 3)
                 + linear(region, q, fp32_input=True, bias=qkv_bias) + linear(region, kv, fp32_input=True, bias=qkv_bias).times(2)
                 + (rope(q + kv, tensors=2) if roped else OpCount())
                 + sdpa(q + kv if roped else 0.0, casts=2 if roped else 0) + linear(q, region, fp32_input=False, bias=spec.has_out_bias))
    inputs = 2 if spec.gated else 1
    mlp = (residual(region) + fan_out(region, inputs)
           + linear(region, f, fp32_input=True, bias=mlp_bias).times(inputs) + activation(f, gated=spec.gated)
           + linear(f, region, fp32_input=False, bias=mlp_bias))
    # norms_per_layer beyond the attention norm: Llama's MLP pre-norm (2), Gemma's post-norms too (4), none (1)
    return attention + mlp + _norm(spec, region).times(spec.norms_per_layer - 1)


def recompute_bytes(spec: ModelSpec, shape: Shape, layer: OpCount) -> float:
    """Forward bytes a checkpointed layer reruns: all but the closing residual add (module docstring)."""
    return layer.fwd_bytes - residual(shape.tokens * spec.hidden_size / shape.sp_div).fwd_bytes


def head_ops(spec: ModelSpec, shape: Shape) -> OpCount:
    """Final norm, lm_head (fp32 input) and ForCausalLMLoss over T*V/t logits: logits.float() (2+4), label pad
    and shift (2 ops on ids), log_softmax (4+4), nll_loss; backward: ones_like, nll_loss backward (zero fill 4),
    log_softmax backward (4+4+4), the cast back to bf16 (4+2)."""
    region = shape.tokens * spec.hidden_size / shape.sp_div
    logits = shape.tokens * spec.vocab_size / shape.tp
    loss = OpCount(fwd_ops=5, bwd_ops=4, fwd_bytes=14 * logits, bwd_bytes=22 * logits)
    return _norm(spec, region) + linear(region, logits, fp32_input=True, bias=False) + loss


def embedding_ops(spec: ModelSpec, shape: Shape) -> OpCount:
    """fp32 embedding gather (4+4 per element) plus the model-level setup operators (MODEL_SETUP_OPS); backward:
    embedding_dense_backward zero-fills the fp32 V x h/t gradient and accumulates the rows (4+4+4 per element)."""
    region = shape.tokens * spec.hidden_size / shape.sp_div
    table = 4 * spec.vocab_size * spec.hidden_size / shape.tp
    return OpCount(fwd_ops=1 + MODEL_SETUP_OPS, bwd_ops=1, fwd_bytes=8 * region, bwd_bytes=12 * region + table)


def phase_s(device_s: float, ops: float, *, kernel_s: float, host_op_s: float) -> float:
    """One phase of a module: max(device_s + ops * kernel_s, ops * host_op_s) (module docstring)."""
    return max(device_s + ops * kernel_s, ops * host_op_s)


def step_ops(spec: ModelSpec, shape: Shape, *, recompute: bool) -> tuple[int, int]:
    """(forward, backward) operators of one micro-batch through a dense model on one GPU, the backward with the
    recomputed forwards of checkpointed layers (the optimizer's few multi-tensor kernels not counted)."""
    layer = decoder_ops(spec, shape)
    fwd = embedding_ops(spec, shape).fwd_ops + spec.num_layers * layer.fwd_ops + head_ops(spec, shape).fwd_ops
    bwd = embedding_ops(spec, shape).bwd_ops + spec.num_layers * layer.bwd_ops + head_ops(spec, shape).bwd_ops
    if recompute:
        bwd += spec.num_layers * (layer.fwd_ops - RECOMPUTE_SKIPPED_OPS)
    return fwd, bwd
