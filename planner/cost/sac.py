"""torchtitan's op-level selective activation checkpointing as it runs: what its recompute repeats and what it keeps.

torchtitan 0.3.0 torchtitan/distributed/activation_checkpoint.py (SelectiveAC._wrap_block, _get_default_save_ops):
each transformer block runs under create_selective_checkpoint_contexts with a policy that
- saves (MUST_SAVE) the outputs of the compute-intensive ops (torch._functorch.partitioners.get_default_op_list:
  aten.mm, addmm, bmm, _scaled_mm, the SDPA flash / efficient kernels), the SDPA variants, aten.linear, topk, and
  the communication ops _c10d_functional.reduce_scatter_tensor and all_to_all_single;
- except every second mm / linear of the block (a per-block counter, `meta[mm_count_key] % 2 == 0` ->
  PREFER_RECOMPUTE) and the mms whose weight shape matches force_recompute_mm_shapes_by_fqns (default
  ["moe.router.gate"]: the router is recomputed and not counted);
- recomputes everything else: norms, RoPE, activation functions, residual adds, the TP all-gathers and
  all-reduces (not in the list), the context-parallel K/V exchange, and the routed experts' torch._grouped_mm
  (not a compute-intensive op of that list).
The block issues its mms in module order: the fused wqkv projection (torchtitan/models/common/attention.py
FusedQKVLinear; every llama3 config sets fuse_qkv=True), wo; feed_forward.py `w2(silu(w1(x)) * w3(x))`: w1, w3,
w2; moe.py MoE.forward: router gate, routed experts, then the shared experts (w1, w3, w2); MLA
(models/deepseek_v3): wq (or wq_a, wq_b), wkv_a, wkv_b, wo. So a Llama block saves wqkv, w1 and w2 outputs and
recomputes wo and w3 (1/3 of the FFN GEMMs) with all pointwise work. (torchtitan before fuse_qkv, e.g. the
2024 runs of docs/performance.md at 613bfd0, torchtitan/parallelisms/parallelize_llama.py no_recompute_list: mm, SDPA
flash/efficient, reduce_scatter_tensor, ran wq, wk, wv as three mms: wk, the second, was recomputed
too, a kv/(a+2kv) share of the QKV projection more; that version is not modelled separately.)
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from planner.cost import moe_comm
from planner.cost.compute import Shape
from planner.schemas.model import ModelSpec


@dataclass(frozen=True)
class Mm:
    """One mm of the block: the planner Gemm it belongs to (compute.attention_gemms / mlp_gemms), its share of
    that Gemm's FLOPs, its output width in elements per token on this GPU, and whether the every-second rule
    counts it (False: recomputed whatever the count: the router gate, the grouped-mm experts)."""

    gemm: str
    share: float
    width: float
    counted: bool = True


def _ffn(name: str, spec: ModelSpec, width: int, t: int) -> list[Mm]:
    """w1, (w3,) w2 of one FFN in call order; w2 is row-parallel, its output h wide before the reduction."""
    h = spec.hidden_size
    if spec.gated:
        return [Mm(name, 1 / 3, width / t), Mm(name, 1 / 3, width / t), Mm(name, 1 / 3, h)]
    return [Mm(name, 1 / 2, width / t), Mm(name, 1 / 2, h)]


def block_mms(spec: ModelSpec, shape: Shape, *, moe_layer: bool) -> list[Mm]:
    """The block's mms in the order torchtitan's modules call them."""
    t, h, a = shape.tp, spec.hidden_size, spec.num_attention_heads
    if spec.mla is None:
        d = spec.dim_per_head
        mms = [Mm("qkv", 1.0, (a + 2 * spec.kv_heads) * d / t)]
    else:
        mla = spec.mla
        qk = mla.qk_nope_head_dim + mla.qk_rope_head_dim
        q = [Mm("q", 1.0, a * qk / t)] if mla.q_lora_rank is None else \
            [Mm("q_down", 1.0, mla.q_lora_rank), Mm("q_up", 1.0, a * qk / t)]
        mms = q + [Mm("kv_down", 1.0, mla.kv_lora_rank + mla.qk_rope_head_dim),
                   Mm("kv_up", 1.0, a * (mla.qk_nope_head_dim + mla.v_head_dim) / t)]
    mms.append(Mm("attn_out", 1.0, h))
    if not moe_layer:
        return mms + _ffn("mlp", spec, spec.ffn_hidden_size, t)
    cfg = spec.moe
    mms += [Mm("router", 1.0, cfg.num_experts, counted=False), Mm("experts", 1.0, 0.0, counted=False)]
    return mms + (_ffn("shared_experts", spec, cfg.shared_ffn_hidden_size, t) if cfg.shared_ffn_hidden_size else [])


def recompute_shares(mms: list[Mm]) -> dict[str, float]:
    """Per Gemm name, the share of its forward FLOPs the recompute repeats (every second counted mm, and the
    uncounted ones)."""
    shares: dict[str, float] = defaultdict(float)
    count = 0
    for mm in mms:
        if mm.counted:
            count += 1
        if not mm.counted or count % 2 == 0:
            shares[mm.gemm] += mm.share
    return dict(shares)


def saved_bytes(spec: ModelSpec, shape: Shape, *, moe_layer: bool) -> float:
    """Bytes one block keeps for one micro-batch: its input (sequence-sharded with SP), the saved mm outputs, the
    SDPA output and its fp32 log-sum-exp, the reduce-scatter outputs (SP: after wo and after the FFN) and the MoE
    all-to-all outputs (dispatch and combine, with EP), all 16-bit."""
    t, h, a = shape.tp, spec.hidden_size, spec.num_attention_heads
    count, elements = 0, h / shape.sp_div
    for mm in block_mms(spec, shape, moe_layer=moe_layer):
        if mm.counted:
            count += 1
            elements += mm.width if count % 2 else 0.0
    v_dim = spec.dim_per_head if spec.mla is None else spec.mla.v_head_dim
    elements += a * v_dim / t + 2 * a / t  # SDPA output + fp32 log-sum-exp (4 bytes = 2 elements per head)
    if shape.sp and t > 1:
        elements += 2 * h / t
    if moe_layer and shape.ep > 1:
        elements += 2 * spec.moe.top_k * moe_comm.load_factor(spec.moe) * h
    return 2 * elements * shape.microbatch_size * shape.seq_len / shape.cp


def recompute_s(spec: ModelSpec, shape: Shape, *, moe_layer: bool, gemm_fwd_s: dict[str, float],
                elementwise_s: float, tp_fwd_s: float, cp_fwd_s: float) -> float:
    """Seconds the recompute adds: the recomputed share of each Gemm's forward (`gemm_fwd_s` by Gemm name), all
    memory-bound elementwise work, the TP collectives that are not reduce-scatters (with SP the all-gathers, half
    of them; without SP every all-reduce) and the context-parallel exchange; the SDPA kernel and the MoE
    all-to-alls are saved, not rerun."""
    shares = recompute_shares(block_mms(spec, shape, moe_layer=moe_layer))
    gemms = sum(share * gemm_fwd_s.get(name, 0.0) for name, share in shares.items())
    tp = tp_fwd_s / 2 if shape.sp and shape.tp > 1 else tp_fwd_s
    return gemms + elementwise_s + tp + cp_fwd_s
