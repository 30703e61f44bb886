"""Token mixers other than softmax attention: Gated DeltaNet linear attention and Mamba-1 selective scan, per layer,
per GPU, per micro-batch. planner.cost.layers.decoder_cost puts these terms where attention's would be for a layer
whose ModelSpec.mixer is "linear" or "mamba"; the FFN/MoE half of the layer is costed as for any layer.

Gated DeltaNet (Yang, Kautz, Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2 with Delta Rule", ICLR 2025,
Sec. 3.3; chunkwise form of Yang et al. 2024, "Parallelizing Linear Transformers with the Delta Rule over Sequence
Length", NeurIPS 2024, Sec. 3.2-3.3, WY representation). As flash-linear-attention runs it
(fla/ops/gated_delta_rule/chunk.py chunk_gated_delta_rule_fwd: chunk_scaled_dot_kkt_fwd, solve_tril,
recompute_w_u_fwd, chunk_gated_delta_rule_fwd_h, chunk_fwd_o), per value head of key dim dk and value dim dv, with
chunks of C tokens, the forward FLOPs per token are
    A = beta K K^T within the chunk        2*C*dk
    (I + A)^-1 (forward substitution)      C^2 (C^3/3 multiply-adds per chunk)
    W = A K, U = A V                       2*C*dk + 2*C*dv
    V' = U - W S, S <- g S + K^T V'        2*dk*dv + 2*dk*dv   (the d_k x d_v state, once per chunk per token row)
    O = Q S + (Q K^T masked) V'            2*dk*dv + 2*C*dk + 2*C*dv
  = 6*dk*dv + 2*C*(3*dk + 2*dv) + C^2: linear in the sequence length (no s^2 term, no KV that grows with s). q and k
are shared by Hv/Hk value heads (Qwen3-Next repeats them). The kernels are tensor-core tl.dot blocks: priced on the
GEMM curve. Backward: 2x forward plus the recomputation of W, U and the chunk states S that FLA's backward runs
(chunk_gated_delta_rule_bwd calls recompute_w_u_fwd and chunk_gated_delta_rule_fwd_h again), Gemm.backward_factor.
Projections: in_proj_qkvz h -> 2*Hk*dk + 2*Hv*dv, in_proj_ba h -> 2*Hv, out_proj Hv*dv -> h; the depthwise conv1d
(kernel k over 2*Hk*dk + Hv*dv channels: 2*k FLOPs per channel) is memory-bound.

Mamba-1 (Gu & Dao 2023, "Mamba: Linear-Time Sequence Modeling with Selective State Spaces", Sec. 3.3.2: the fused
selective scan reads Delta, A, B, C, u from HBM, discretises and scans in SRAM and writes y: memory-bound). GEMMs:
in_proj h -> 2*di, x_proj di -> dt_rank + 2N, dt_proj dt_rank -> di, out_proj di -> h. The scan's FLOPs are
9*di*N per token (state-spaces/mamba issue #110, the flop count of selective_scan_fn), the conv1d's 2*d_conv*di:
counted in the model FLOPs (non_gemm_flops), timed as HBM bytes (mixer_bytes).

Tensor parallelism: Gated DeltaNet splits its key and value heads over tp (Megatron-Core ssm/gated_delta_net.py;
transformer_config.py asserts linear_num_key_heads and linear_num_value_heads % tp == 0): column-parallel in_proj,
row-parallel out_proj, two T*h collectives per layer as attention. Mamba splits d_inner over tp as Megatron-Core's
MambaMixer does (ssm/mamba_mixer.py: in_proj column-parallel, out_proj row-parallel, d_inner_local = d_inner / tp);
Mamba-1's x_proj reads all of d_inner, so its (dt_rank + 2N)-wide output is all-reduced as well (one more, small,
collective: tp_collectives). Context parallelism is not modelled for these mixers (a scan passes its state along
the sequence; Megatron-Core 0.16 has no GatedDeltaNetContextParallel): validity refuses cp > 1 (cp_tp_reasons).

Not measured on a GPU: the delta-rule kernel's rate is assumed to be the GEMM curve's and the scan's the HBM
streaming rate; no kernel benchmark exists in this repository yet.
"""

from __future__ import annotations

from planner.cost.compute import ACT_BYTES, Gemm, Shape
from planner.schemas.model import ModelSpec

MAMBA_SCAN_FLOPS = 9  # per token, channel and state element (state-spaces/mamba #110, selective_scan_fn)
MAMBA_SCAN_CHUNK = 2048  # selective_scan_cuda saves the state every 2048 tokens (csrc/selective_scan kChunkSize)


def delta_rule_flops_per_token(spec: ModelSpec) -> tuple[float, float]:
    """(forward, recomputed in backward) FLOPs of the chunked gated delta rule per token, all value heads."""
    gdn = spec.linear_attention
    assert gdn is not None
    dk, dv, c = gdn.key_head_dim, gdn.value_head_dim, gdn.chunk_size
    forward = 6 * dk * dv + 2 * c * (3 * dk + 2 * dv) + c * c
    recompute = 2 * c * (dk + dv) + 4 * dk * dv  # W, U and the chunk states again (FLA backward)
    return gdn.num_value_heads * forward, gdn.num_value_heads * recompute


def mixer_gemms(spec: ModelSpec, shape: Shape, mixer: str, *, full: bool = False) -> list[Gemm]:
    """Tensor-core work of a Gated DeltaNet ("linear") or Mamba ("mamba") mixer, forward, per GPU. `full`: no split."""
    t, cp = (1, 1) if full else (shape.tp, shape.cp)
    tokens, h = shape.microbatch_size * shape.seq_len / cp, spec.hidden_size
    if mixer == "linear":
        gdn = spec.linear_attention
        key, value = gdn.num_key_heads * gdn.key_head_dim, gdn.num_value_heads * gdn.value_head_dim
        forward, recompute = delta_rule_flops_per_token(spec)
        return [Gemm("in_proj", 2 * tokens * h * (2 * key + 2 * value + 2 * gdn.num_value_heads) / t),
                Gemm("delta_rule", tokens * forward / t, calls=5, backward_factor=2.0 + recompute / forward,
                     fp8=False),
                Gemm("out_proj", 2 * tokens * value * h / t)]
    m = spec.mamba
    return [Gemm("in_proj", 2 * tokens * h * 2 * m.d_inner / t),
            Gemm("x_proj", 2 * tokens * m.d_inner * (m.dt_rank + 2 * m.d_state) / t),
            Gemm("dt_proj", 2 * tokens * m.dt_rank * m.d_inner / t),
            Gemm("out_proj", 2 * tokens * m.d_inner * h / t)]


def non_gemm_flops(spec: ModelSpec, tokens: float, mixer: str) -> float:
    """FLOPs outside the GEMMs, whole model (no split): the depthwise conv1d (2 * kernel per channel and token) and,
    for Mamba, the selective scan (MAMBA_SCAN_FLOPS * d_inner * d_state per token)."""
    if mixer == "linear":
        gdn = spec.linear_attention
        channels = 2 * gdn.num_key_heads * gdn.key_head_dim + gdn.num_value_heads * gdn.value_head_dim
        return tokens * 2 * gdn.conv_kernel * channels
    if mixer == "mamba":
        m = spec.mamba
        return tokens * m.d_inner * (2 * m.d_conv + MAMBA_SCAN_FLOPS * m.d_state)
    return 0.0


def mixer_bytes(spec: ModelSpec, shape: Shape, mixer: str) -> float:
    """Forward HBM bytes of the mixer's memory-bound work per GPU (bf16, fused kernels: one read and one write each).

    Gated DeltaNet: conv1d + SiLU over the q, k, v channels (read, write), the L2 norms of q and k, the delta-rule
    kernels' inputs (q, k, v, g, beta) and output, the chunk states S (Hv*dk*dv per chunk: written by the state
    kernel, read by the output kernel), the gated RMSNorm (read o and z, write). Mamba: conv1d + SiLU over d_inner,
    the scan (read u, Delta, z, B, C; write y; Sec. 3.3.2: softplus(Delta + bias) and the z gate are fused in it),
    the dt/B/C RMSNorms (replicated over tp: x_proj's output is all-reduced)."""
    t, tokens = shape.tp, shape.tokens
    if mixer == "linear":
        gdn = spec.linear_attention
        key, value, hv = gdn.num_key_heads * gdn.key_head_dim, gdn.num_value_heads * gdn.value_head_dim, gdn.num_value_heads
        per_token = (2 * (2 * key + value) + 2 * 2 * key + (2 * key + value + 2 * hv) + value + 3 * value) * ACT_BYTES
        per_token += 2 * hv * gdn.key_head_dim * gdn.value_head_dim * ACT_BYTES / gdn.chunk_size
        return tokens * per_token / t
    m = spec.mamba
    narrow = m.dt_rank + 2 * m.d_state
    conv, scan = 2 * m.d_inner, 4 * m.d_inner + 2 * m.d_state  # read x, write u; read u, Delta, z, B, C, write y
    return tokens * ((conv + scan) * ACT_BYTES / t + 2 * narrow * ACT_BYTES)  # the dt/B/C norms: read, write


def mixer_activation_bytes(spec: ModelSpec, shape: Shape, mixer: str, *, gemm_input_bytes: int = 2) -> float:
    """Bytes the mixer saves for backward per GPU (beyond the norm and mixer input the layer counts), all linear in s.

    Gated DeltaNet (HF Qwen3NextGatedDeltaNet around fla chunk_gated_delta_rule, which saves q, k, v, g, beta and
    the C x C chunk matrix A): the conv input and output over 2*Hk*dk + Hv*dv channels, z (Hv*dv), a and b (2*Hv)
    and the fp32 g and beta, A (C per token and value head), the kernel output (the gated norm's input) and the
    out_proj input. Mamba (mamba_ssm selective_scan_fn saves u, Delta, B, C, z and the fp32 state every
    MAMBA_SCAN_CHUNK tokens): in_proj output x and z, conv output u, x_proj output (dt, B, C) and the norms' inputs,
    Delta, the out_proj input, the chunk states. Split by tp (heads / d_inner), except Mamba's x_proj output."""
    t, tokens, g = shape.tp, shape.tokens, gemm_input_bytes
    if mixer == "linear":
        gdn = spec.linear_attention
        key, value, hv = gdn.num_key_heads * gdn.key_head_dim, gdn.num_value_heads * gdn.value_head_dim, gdn.num_value_heads
        per_token = 4 * (2 * key + value) + 2 * value + 2 * 2 * hv + 4 * 2 * hv + 2 * hv * gdn.chunk_size + 2 * value + g * value
        return tokens * per_token / t
    m = spec.mamba
    di, narrow = m.d_inner, m.dt_rank + 2 * m.d_state
    sharded = 2 * 2 * di + 2 * di + 2 * di + g * di + 4 * di * 2 * m.d_state / MAMBA_SCAN_CHUNK
    return tokens * (sharded / t + 2 * 2 * narrow)


def tp_collectives(spec: ModelSpec, mixer: str) -> float:
    """T*h-sized collectives per direction of a mixer layer under tp: 2 (in and out of the mixer, as attention);
    Mamba-1 adds the all-reduce of x_proj's (dt_rank + 2N)-wide output, as a fraction of T*h."""
    if mixer == "mamba":
        return 2.0 + (spec.mamba.dt_rank + 2 * spec.mamba.d_state) / spec.hidden_size
    return 2.0


def tp_cp_reasons(spec: ModelSpec, *, tp: int, cp: int) -> list[str]:
    """Why tp or cp cannot split this model's mixers: GDN heads and Mamba's d_inner divisible by tp; no cp."""
    out = []
    mixers = spec.mixers
    if "linear" in mixers:
        gdn = spec.linear_attention
        for field, heads in (("num_key_heads", gdn.num_key_heads), ("num_value_heads", gdn.num_value_heads)):
            if heads % tp:
                out.append(f"tp={tp} must divide linear_attention.{field}={heads} (Gated DeltaNet heads are split by tp)")
    if "mamba" in mixers and spec.mamba.d_inner % tp:
        out.append(f"tp={tp} must divide mamba.d_inner={spec.mamba.d_inner} (Mamba channels are split by tp)")
    if cp > 1 and set(mixers) - {"attention"}:
        out.append(f"cp={cp} with {'/'.join(m for m in mixers if m != 'attention')} layers: context parallelism of a "
                   "scan is not modelled (Megatron-Core 0.16 has none for Gated DeltaNet): use cp=1")
    return out
