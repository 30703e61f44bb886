"""Bytes the memory-bound operators of a layer move and save, per element: fused kernels (one read and one write
per operator) against eager PyTorch op sequences (HuggingFace transformers, torchtitan without compile); read
through compute.Shape.kernels by the layer formulas of planner.cost.compute."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from planner.schemas.model import ModelSpec


@dataclass(frozen=True, kw_only=True)
class KernelBytes:
    """HBM bytes per element (reads + writes, bf16 activations) of the memory-bound operators, and bytes per element
    they save for backward, for fused kernels (Megatron-LM/Transformer Engine/torchtitan: one read and one write
    per operator) and for eager PyTorch as HuggingFace transformers writes them (modeling_llama.py). The amp-bf16
    recipe's dense layers are counted operator by operator in planner.cost.eager instead (fp32 residual stream
    under autocast); EAGER serves the fp32 recipe and amp-bf16 MoE/MLA layers.

    Eager RMSNorm: x.to(fp32) (2 + 4), pow (4 + 4), mean (4), x * rsqrt (4 + 4), .to(bf16) (4 + 2), weight * (2 + 2)
    = 36; it saves the fp32 input and normalised fp32 tensor plus the bf16 cast (4 + 4 + 2 = 10). Eager
    LayerNorm (F.layer_norm under autocast runs in fp32): cast (2 + 4), kernel (4 + 4) = 14, saves the fp32 input
    (4). Eager SwiGLU: silu(gate) (2 + 2) and * up (2 + 2 + 2) = 10 per f-element; saves gate, up, silu(gate)
    and the product (8). Eager RoPE: q*cos (2 + 2), rotate_half slices, negation and cat (2 + 4), *sin (2 + 2),
    add (4 + 2) = 20 per q/k element.
    """

    rmsnorm: float
    layernorm: float
    gated_act: float  # per f-element, reads + writes
    plain_act: float
    rope: float
    saved_rmsnorm: float
    saved_layernorm: float
    saved_gated: float  # per f-element, what the FFN saves between fc1 and fc2
    saved_plain: float


FUSED = KernelBytes(rmsnorm=4, layernorm=4, gated_act=6, plain_act=4, rope=4, saved_rmsnorm=2, saved_layernorm=2,
                    saved_gated=6, saved_plain=4)
EAGER = KernelBytes(rmsnorm=36, layernorm=14, gated_act=10, plain_act=4, rope=20, saved_rmsnorm=10, saved_layernorm=4,
                    saved_gated=8, saved_plain=4)


KERNEL_PARTS = {"norm": ("rmsnorm", "layernorm", "saved_rmsnorm", "saved_layernorm"),
                "activation": ("gated_act", "plain_act", "saved_gated", "saved_plain"), "rope": ("rope",)}


def with_eager_ops(parts: tuple[str, ...]) -> KernelBytes:
    """FUSED with the components `parts` (activation, rope, norm) at EAGER's bytes: a stack whose 16-bit code runs
    those as eager op sequences (torchtitan without compile: F.silu(w1(x)) * w3(x), torchtitan/models/common/
    feed_forward.py; RoPE through view_as_complex(x.float()), models/common/rope.py) and the rest fused."""
    fields = {name: getattr(EAGER, name) for part in parts for name in KERNEL_PARTS[part]}
    return dataclasses.replace(FUSED, **fields)


def norm_bytes(spec: ModelSpec, kernels: KernelBytes) -> float:
    return kernels.rmsnorm if spec.norm == "rmsnorm" else kernels.layernorm
