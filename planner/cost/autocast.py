"""Memory of the "amp-bf16" recipe: plain PyTorch training under torch.autocast (fp32 parameters, bf16 matmuls,
unfused eager operators), as HuggingFace Transformers and this project's executor run it.

Activations saved per dense decoder layer (Llama-style: RMSNorm, RoPE, SDPA/flash attention, gated MLP), per
micro-batch, counted operator by operator from what autograd saves (the profiler's saved_tensors_hooks count
gives the same list; `planner profile --dtype amp-bf16`). T = tokens of this GPU (b*s/cp), t = tp:
- residual stream and norms stay fp32 under autocast: each norm keeps its fp32 input and its fp32 normalised
  output, 2 x 4*T*h per norm, spec.norms_per_layer norms (two for Llama; eager RMSNorm, Zhang & Sennrich 2019);
- autocast casts the fp32 input of every linear separately and the linear keeps its bf16 copy: 2*T*h for each
  of q, k, v and the MLP input projections (gate and up for gated MLPs, one otherwise);
- attention: q, k, v after RoPE (2*T*d*(a + 2kv)/t), the SDPA output (2*T*a*d/t) and its fp32 log-sum-exp
  (4*b*a*s/t), the contiguous output-projection input (2*T*a*d/t);
- MLP, unfused: gated keeps gate, act(gate), up and their product (4 x 2*T*f/t), plain keeps fc1 output and
  activation output (2 x 2*T*f/t).
For TinyLlama (h=2048, a=32, kv=4, f=5632) this is 54.5*T*h bytes per layer against 56.4 measured on an H100
(h100_hf_tinyllama.jsonl: per-sequence slope of peak memory with and without checkpointing); Megatron's fused
bf16 layer keeps ~29*T*h. Full recompute keeps the fp32 layer input, 4*T*h.

Head: final norm (2 x 4*T*h), the lm_head input cast (2*T*h) and the fp32 log-softmax the loss keeps for
backward (4*T*V/t); the fp32 logits themselves are the last stage's logits buffer (memory.logits_buffer_bytes).

Peak timeline (torch zero_grad(set_to_none=True), the default since PyTorch 2.0): gradients are freed after
each optimizer step and allocated during backward, while autocast's bf16 weight copies live from the first
use in forward until the layer's backward. With one micro-batch per step, no data parallelism and no ZeRO, the
allocated peak is therefore the larger of (a) the start of backward: weights + bf16 copies + optimizer states
+ activations + logits, no gradients, and (b) the optimizer step: fp32 weights + gradients + optimizer
states (16 bytes/parameter), no copies, no activations. Otherwise gradients persist across micro-batches (or
in DDP buckets) and the usual sum applies. On the 8 H100 rows this puts every peak within a few percent.
"""

from __future__ import annotations

from planner.cost.compute import Shape
from planner.cost.memory import LayerActivations, backward_transient_bytes
from planner.schemas.model import ModelSpec

RECIPE = "amp-bf16"
FP32, BF16 = 4, 2
CAST_COPY_FRACTION = 2 / 6  # of amp-bf16's 6 weight bytes per parameter, the bf16 autocast copies


def decoder_activation_bytes(spec: ModelSpec, shape: Shape) -> LayerActivations:
    """Saved bytes of one dense decoder layer under torch.autocast (module docstring)."""
    b, s, t = shape.microbatch_size, shape.seq_len / shape.cp, shape.tp
    tokens, h, f = b * s, spec.hidden_size, spec.ffn_hidden_size
    a, kv, d = spec.num_attention_heads, spec.kv_heads, spec.dim_per_head
    linear_inputs = 3 + (2 if spec.gated else 1)
    replicated = spec.norms_per_layer * 2 * FP32 * tokens * h + linear_inputs * BF16 * tokens * h
    attention = BF16 * tokens * d * (a + 2 * kv) + 2 * BF16 * tokens * a * d
    mlp = (4 if spec.gated else 2) * BF16 * tokens * f
    lse = FP32 * b * a * s
    base = replicated / shape.sp_div + (attention + mlp + lse) / t
    return LayerActivations(none=base, selective=base, full=FP32 * tokens * h / shape.sp_div,
                            transient=backward_transient_bytes(spec, shape, moe_layer=False))


def head_activation_bytes(spec: ModelSpec, shape: Shape) -> float:
    """Final norm (fp32 in and out), the lm_head's bf16 input copy, the fp32 log-softmax (module docstring)."""
    region = shape.tokens * spec.hidden_size / shape.sp_div
    return 2 * FP32 * region + BF16 * region + FP32 * shape.tokens * spec.vocab_size / shape.tp


def grads_absent_at_activation_peak(*, dp: int, cp: int, zero_stage: int, num_microbatches: int) -> bool:
    """One micro-batch, one replica, no ZeRO: gradients do not exist yet when backward starts (docstring)."""
    return num_microbatches == 1 and dp * cp == 1 and zero_stage == 0


def peak_rows(weights, grads, optimizer, activations, other, step_extra=0.0):
    """(weights, grads, optimizer, activations, allocated) held at the allocated peak, the larger of the start of
    backward and the optimizer step (module docstring), the step with `step_extra` bytes of the optimizer's own
    temporaries (a foreach AdamW's sqrt(v) copy); numpy arrays, one entry per pipeline rank."""
    import numpy as np

    backward_start = weights + optimizer + activations + other
    masters = weights * (1 - CAST_COPY_FRACTION)
    optimizer_step = masters + grads + optimizer + step_extra
    first = backward_start >= optimizer_step
    return (np.where(first, weights, masters), np.where(first, 0.0, grads), optimizer,
            np.where(first, activations, 0.0), np.maximum(backward_start, optimizer_step))
