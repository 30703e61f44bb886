"""Compute cost of one layer on one GPU for one micro-batch: FLOPs per matmul, time from a GEMM efficiency
curve, and memory-bound operators as bytes over HBM bandwidth.

FLOPs. For a GPT layer the forward matmuls sum to 24*b*s*h^2 + 4*b*s^2*h, and the whole model, forward and
backward, to 72*b*s*l*h^2 * (1 + s/(6h) + V/(12*l*h)) (Narayanan et al. 2021, "Efficient Large-Scale Language
Model Training on GPU Clusters", eq. 3 without the recompute factor). We count per matmul so that GQA, gated
FFNs, MoE and MLA follow: a (m x k) @ (k x n) product is 2*m*k*n FLOPs; backward is 2x forward (grad of input
and grad of weight). Attention scores and A@V are counted for the full s x s matrix (non-causal), the
convention of eq. 3 and of MFU (PaLM, Chowdhery et al. 2022, App. B); the *time* of fused (flash) attention
uses half of it, because FlashAttention skips the masked blocks of a causal mask.

Time. A GEMM of g FLOPs takes g / (peak * ceiling) + t0: efficiency(g) = ceiling * g / (g + ceiling*peak*t0),
a saturating curve of achieved matmul efficiency vs per-GPU GEMM size, with `t0` per device family (measured on
Hopper: benchmarks/gpu_kernels.py) and `ceiling` per family and software stack (derived from published runs:
planner/cost/calibration.yaml). Fused attention runs at the measured rate of the stack's kernel (FlashAttention
v1/v2 or cuDNN) for the model's head dim; its backward is 2.5x its forward (FlashAttention-2, Dao 2023, Sec.
3.1.2: five matmuls against two, recomputing the scores). Norms, activations, residual adds, RoPE and
softmax are memory-bound: bytes moved / (HBM bandwidth * achieved fraction); their backward moves twice.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import moe_comm
from planner.cost.calibration import DeviceCalibration
from planner.cost.kernel_bytes import EAGER, FUSED, KernelBytes, norm_bytes, with_eager_ops
from planner.models.counting import MoEParams
from planner.schemas.model import ModelSpec
from planner.schemas.topology import DeviceSpec

ACT_BYTES = 2  # bf16/fp16 activations
FLASH_BACKWARD_FACTOR = 2.5  # FlashAttention-2 backward / forward FLOPs (Dao 2023, Sec. 3.1.2)
CAUSAL_SKIP = 0.5  # fraction of the s x s blocks a causal flash kernel computes


@dataclass(frozen=True, kw_only=True)
class Shape:
    """The per-GPU shape of one micro-batch: b sequences of s tokens, split by tp (heads/ffn), cp (sequence),
    ep (experts); sp shards the norm/dropout/residual regions by tp (Korthikanti et al. 2022)."""

    microbatch_size: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    ep: int = 1
    sp: bool = False
    flash_attention: bool = True
    dropout: bool = False
    fused_kernels: bool = True
    eager_ops: tuple[str, ...] = ()  # components run as eager op sequences although fused_kernels (CostOptions.eager_ops)
    fp8_inputs: bool = False  # fp8 recipe: GEMMs save their fp8-cast inputs for backward (1 byte per element)
    softmax_in_place: bool = False  # unfused attention: the softmax backward overwrites its output gradient
    expert_tp: int = 0  # routed experts' tensor parallelism (Megatron-Core expert_tensor_parallel_size): tp over the
    # MoE fold (ParallelDims.expert_fold); 0 = tp
    moe_sp_dispatch: bool = False  # each TP rank dispatches its sequence shard (behaviour.moe.sequence_parallel_dispatch)
    moe_expert_launches: str = "per_expert"  # behaviour.moe.expert_gemm_launches
    moe_expert_sort: str = "never"  # behaviour.moe.expert_sort
    moe_combine_scores: str = "in_activation"  # behaviour.moe.combine_scores

    @property
    def kernels(self) -> "KernelBytes":
        if not self.fused_kernels:
            return EAGER
        return with_eager_ops(self.eager_ops) if self.eager_ops else FUSED

    @property
    def etp(self) -> int:
        """The routed experts' tensor-parallel degree (tp unless the MoE fold takes tp ranks for EP)."""
        return self.expert_tp or self.tp

    @property
    def moe_tokens(self) -> float:
        """Tokens this GPU routes: its sequence shard (tokens / tp with sp) where the stack dispatches per shard
        (Megatron-Core: the MoE layer's input is the sequence-parallel region, moe_layer.py MoELayer.forward), else
        all b * s / cp tokens (replicated over tp)."""
        return self.tokens / self.sp_div if self.moe_sp_dispatch else self.tokens

    @property
    def expert_parallel(self) -> int:
        """The EP degree the routed experts are spread over: the expert shard ep times the MoE fold (tp / etp)."""
        return self.ep * self.tp // self.etp

    @property
    def tp_ep(self) -> int:
        """Ranks of the expert tensor- x expert-parallel group (Megatron-Core's tp_ep group, over which its flex
        dispatcher runs DeepEP: token_dispatcher.py _DeepepManager(group=self.tp_ep_group))."""
        return self.expert_parallel * self.etp

    @property
    def tokens(self) -> float:
        """Tokens of this GPU's sequence shard: b * s / cp."""
        return self.microbatch_size * self.seq_len / self.cp

    @property
    def sp_div(self) -> int:
        return self.tp if self.sp else 1


@dataclass(frozen=True)
class Gemm:
    """Forward FLOPs of one matmul on this GPU and the number of kernel calls it takes."""

    name: str
    flops: float
    calls: int = 1
    attention_core: bool = False
    block_seq: float = 0.0  # attention core: the sequence length one kernel call sees (s / cp)
    attended_fraction: float = 1.0  # attention core: share of full causal work a windowed/chunked model does
    backward_factor: float = 2.0  # backward / forward FLOPs (grad of input and of weight); more where the backward
    # recomputes part of the forward (the chunked delta rule: planner.cost.mixers)
    io_elements: tuple[float, float] = (0.0, 0.0)  # (input, output) elements of a linear layer's matmul on this GPU:
    # what an fp8 recipe casts (fp8_recipe.cast_bytes); 0 where the stack keeps the matmul in 16 bits (router, LM head)
    fp8: bool = True  # runs in fp8 under an fp8 recipe; False where every stack keeps it in 16 bits (fp8_recipe)


def _linear(name: str, tokens: float, k: float, n: float, **kwargs) -> Gemm:
    """A linear layer's forward matmul: `tokens` rows, `k` input and `n` output features on this GPU."""
    return Gemm(name, 2 * tokens * k * n, io_elements=(tokens * k, tokens * n), **kwargs)


def attention_gemms(spec: ModelSpec, shape: Shape, *, full: bool = False) -> list[Gemm]:
    """Self-attention matmuls (standard/GQA or DeepSeek MLA), forward, per GPU. `full`: whole model, no split."""
    t, cp = (1, 1) if full else (shape.tp, shape.cp)
    tokens = shape.microbatch_size * shape.seq_len / cp
    h, a, s = spec.hidden_size, spec.num_attention_heads, shape.seq_len
    core = shape.microbatch_size * (s / cp) * s * a / t
    if spec.mla is None:
        d, kv = spec.dim_per_head, spec.kv_heads
        q_out = 2 * a if spec.attention_output_gate else a  # Qwen3-Next: q_proj also emits the output gate
        proj = [_linear("qkv", tokens, h, (q_out + 2 * kv) * d / t), _linear("attn_out", tokens, a * d / t, h)]
        qk_dim, v_dim = d, d
    else:
        mla = spec.mla
        qk_dim, v_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim, mla.v_head_dim
        proj = [
            _linear("kv_down", tokens, h, mla.kv_lora_rank + mla.qk_rope_head_dim),
            _linear("kv_up", tokens, mla.kv_lora_rank, a * (mla.qk_nope_head_dim + v_dim) / t),
            _linear("attn_out", tokens, a * v_dim / t, h),
        ]
        if mla.q_lora_rank is None:
            proj.append(_linear("q", tokens, h, a * qk_dim / t))
        else:
            proj += [_linear("q_down", tokens, h, mla.q_lora_rank), _linear("q_up", tokens, mla.q_lora_rank, a * qk_dim / t)]
    share = spec.attention_fraction(s)
    return proj + [
        Gemm("attn_scores", 2 * core * qk_dim, attention_core=True, block_seq=s / cp, attended_fraction=share),
        Gemm("attn_values", 2 * core * v_dim, attention_core=True, block_seq=s / cp, attended_fraction=share),
    ]


def ffn_flops(spec: ModelSpec, tokens: float, width: int) -> float:
    """One FFN of width f over `tokens`: gated 3 matmuls (2*3*T*h*f), plain 2 (2*2*T*h*f)."""
    return 2 * tokens * spec.hidden_size * width * (3 if spec.gated else 2)


def _ffn(name: str, spec: ModelSpec, tokens: float, width: float, t: int, calls: int) -> Gemm:
    """An FFN's two linear layers as one entry: fc1 (h -> width/t, doubled when gated) and fc2 (width/t -> h)."""
    h, up = spec.hidden_size, (2 if spec.gated else 1) * width / t
    return Gemm(name, ffn_flops(spec, tokens, width) / t, calls=calls,
                io_elements=(tokens * (h + width / t), tokens * (up + h)))


def mlp_gemms(spec: ModelSpec, shape: Shape, *, moe: MoEParams | None, full: bool = False, hardware: bool = True) -> list[Gemm]:
    """FFN matmuls, forward, per GPU. MoE: router (over the tokens this GPU routes: Shape.moe_tokens), routed
    experts (each GPU computes its share of tokens * top_k, padded to capacity_factor when `hardware`; kernel
    launches by expert_launches), shared experts."""
    t = 1 if full else shape.tp
    tokens = shape.microbatch_size * shape.seq_len / (1 if full else shape.cp)
    if moe is None:
        return [_ffn("mlp", spec, tokens, spec.ffn_hidden_size, t, calls=2)]
    cfg = spec.moe
    assert cfg is not None
    padding = moe_comm.load_factor(cfg) if hardware else 1.0  # the slowest EP rank's load
    local_experts = max(1, cfg.num_experts // (1 if full else shape.expert_parallel))
    routed = tokens if full else shape.moe_tokens
    gemms = [
        Gemm("router", 2 * routed * spec.hidden_size * (cfg.num_experts + int(cfg.shared_expert_gate)), fp8=False),
        _ffn("experts", spec, tokens * cfg.top_k * padding, cfg.expert_ffn_hidden_size, t,
             calls=expert_launches(spec, shape.moe_expert_launches, local_experts)),
    ]
    if cfg.shared_ffn_hidden_size:
        gemms.append(_ffn("shared_experts", spec, tokens, cfg.shared_ffn_hidden_size, t, calls=2))
    return gemms


def expert_launches(spec: ModelSpec, launches: str, local_experts: int) -> int:
    """GEMM kernels the routed experts of one GPU launch in a forward (the backward twice as many):
    - "per_expert" (Megatron-Core TEGroupedMLP: Transformer Engine's GroupedLinear runs one cuBLAS GEMM per local
      expert, round-robin on 4 streams: transformer_engine/common/gemm/cublaslt_gemm.cpp
      nvte_multi_stream_cublas_gemm, num_streams = 4 in transformer_engine/gemm.h; Megatron-Core's legacy
      GroupedMLP calls grouped_gemm's gmm, whose default build "launches one GEMM kernel per batch element"
      (tgale96/grouped_gemm README, unless built with GROUPED_GEMM_CUTLASS=1); DeepSpeed-MoE loops over its local
      experts, deepspeed/moe/experts.py Experts.forward): fc1 (gate and up fused) and fc2 per expert;
    - "per_matmul" (torchtitan GroupedExperts.forward, torchtitan/models/common/moe.py: one torch._grouped_mm
      for all local experts per weight, w1, w3 and w2 separately; one CUTLASS grouped kernel on sm90,
      aten/src/ATen/native/cuda/GroupMM.cu): 3 gated, 2 plain."""
    if launches == "per_matmul":
        return 3 if spec.gated else 2
    return 2 * local_experts


def moe_rows(spec: ModelSpec, shape: Shape) -> tuple[float, float]:
    """(dispatch-side, expert-side) routed rows of h on this GPU, at the slowest EP rank's load: the tokens it
    routes (Shape.moe_tokens) x top_k, and what its experts take in: tokens x top_k over the MoE fold (tp /
    etp; the expert-TP all-gather of Megatron-Core's dispatcher brings etp shards together,
    token_dispatcher.py MoEAlltoAllTokenDispatcher.dispatch_postprocess)."""
    cfg = spec.moe
    load = cfg.top_k * moe_comm.load_factor(cfg)
    return shape.moe_tokens * load, shape.tokens * load * shape.etp / shape.tp


def head_gemms(spec: ModelSpec, shape: Shape, *, full: bool = False) -> list[Gemm]:
    """LM head: 2 * T * h * V, vocabulary split by tp."""
    t, cp = (1, 1) if full else (shape.tp, shape.cp)
    tokens = shape.microbatch_size * shape.seq_len / cp
    return [Gemm("lm_head", 2 * tokens * spec.hidden_size * spec.vocab_size / t, fp8=False)]


def gemm_time_s(gemm: Gemm, *, peak_tflops: float, cal: DeviceCalibration, flash: bool) -> float:
    """Forward time of one matmul: flops / (peak * ceiling) + calls * t0 (the efficiency curve, module docstring).
    A fused attention core runs over the causal half of the blocks at its kernel's measured rate for the block
    length s: fraction * s / (s + s_half) (calibration.attention_rate_for). Sliding-window and chunked layers
    (ModelSpec.attended_keys) skip the blocks outside the window as a causal kernel skips the masked half
    (FlashAttention-2 window_size, Dao 2023; Transformer Engine/cuDNN sliding window): their share of the work,
    gemm.attended_fraction, scales the time. An unfused softmax masks the same s x s scores it always computes."""
    if gemm.attention_core and flash:
        rate = cal.attention_fraction * attention_seq_factor(gemm.block_seq, cal.attention_seq_half)
        return gemm.flops * gemm.attended_fraction * CAUSAL_SKIP / (peak_tflops * 1e12 * rate) + cal.gemm_fixed_s
    return gemm.flops / (peak_tflops * 1e12 * cal.matmul_ceiling_fraction) + gemm.calls * cal.gemm_fixed_s


def attention_seq_factor(block_seq: float, seq_half: float) -> float:
    """Fraction of its long-sequence rate a fused attention kernel reaches on blocks of `block_seq` tokens:
    s / (s + s_half). Time = quadratic work at the long-sequence rate plus work linear in s (loading q, writing o,
    the softmax rescaling per row and block), which is s_half / s of it; fitted per kernel and head dim from
    measurements (benchmarks/kernel_constants.py). 1 where no s_half is measured or no length is known."""
    if seq_half <= 0 or block_seq <= 0:
        return 1.0
    return block_seq / (block_seq + seq_half)


def gemm_efficiency(flops: float, *, peak_tflops: float, cal: DeviceCalibration) -> float:
    """Achieved fraction of peak for one GEMM of `flops`: ceiling * g / (g + ceiling * peak * t0)."""
    knee = cal.matmul_ceiling_fraction * peak_tflops * 1e12 * cal.gemm_fixed_s
    return cal.matmul_ceiling_fraction * flops / (flops + knee)


def layer_elementwise_bytes(spec: ModelSpec, shape: Shape, *, moe: MoEParams | None) -> tuple[float, float]:
    """Forward HBM bytes of a decoder layer's memory-bound operators, split (attention core, rest).

    Per GPU, bf16 (2 bytes), bytes per element from KernelBytes (fused: one read and one write per operator;
    eager: HuggingFace's unfused fp32 norms, SwiGLU and RoPE): spec.norms_per_layer norms, two residual adds (2 reads + 1 write),
    RoPE on q and k, the FFN activation (fused plain: read f, write f; fused gated: read 2f, write f) on
    tokens * top_k * capacity for MoE experts (plus the permutations of the routed tokens: moe_permutation_rows),
    dropout when enabled (read, write, 1-byte mask) after attention
    and FFN. Without flash attention: scale-mask-softmax reads and writes the b*a*s^2/t scores (plus the
    dropout of the probabilities when enabled); that part is the attention core (recomputed by selective).
    With sequence parallelism the norm/residual/dropout regions are split by tp (Korthikanti et al. 2022).
    """
    h, t, tokens, k = spec.hidden_size, shape.tp, shape.tokens, shape.kernels
    region = tokens * h / shape.sp_div  # elements of one norm/residual region
    rest = spec.norms_per_layer * norm_bytes(spec, k) * region + 2 * 3 * ACT_BYTES * region
    if shape.dropout:
        rest += 2 * 2.5 * ACT_BYTES * region
    if spec.position == "rope" or spec.mla is not None:
        rest += k.rope * tokens * (spec.num_attention_heads + spec.kv_heads) * spec.dim_per_head / t
    rest += sum(ffn_elementwise_bytes(spec, shape, moe=moe).values())
    core = 0.0
    if not shape.flash_attention:
        scores = shape.microbatch_size * spec.num_attention_heads * (shape.seq_len / shape.cp) * shape.seq_len / t
        core = scores * ACT_BYTES * (2 + (2.5 if shape.dropout else 0))
    return core, rest


def ffn_elementwise_bytes(spec: ModelSpec, shape: Shape, *, moe: MoEParams | None) -> dict[str, float]:
    """The FFN's share of layer_elementwise_bytes, by part: the activation function of the dense MLP ("mlp"), of
    the routed experts ("routed") and of the shared experts ("shared"), and the MoE layer's permutations and
    fp32 score multiply ("dispatch"). A selective recompute of one module reruns its part (planner.cost.selective)."""
    k, t, tokens = shape.kernels, shape.tp, shape.tokens
    act_io = (k.gated_act if spec.gated else k.plain_act) / ACT_BYTES
    if moe is None:
        return {"mlp": act_io * tokens * spec.ffn_hidden_size * ACT_BYTES / t}
    cfg = spec.moe
    routed = tokens * cfg.top_k * moe_comm.load_factor(cfg)
    dispatch = 2 * moe_permutation_rows(spec, shape) * spec.hidden_size * ACT_BYTES  # each permutation reads and writes its rows
    if shape.moe_combine_scores == "fp32_multiply":
        dispatch += FP32_SCORE_MULTIPLY_BYTES * moe_rows(spec, shape)[0] * spec.hidden_size
    return {"routed": act_io * routed * cfg.expert_ffn_hidden_size * ACT_BYTES / t,
            "shared": act_io * tokens * cfg.shared_ffn_hidden_size * ACT_BYTES / t, "dispatch": dispatch}


FP32_SCORE_MULTIPLY_BYTES = 20
"""HBM bytes per element of the combined rows where the stack weights them by the routing scores eagerly in fp32
(torchtitan, torchtitan/models/common/token_dispatcher.py LocalTokenDispatcher.combine and
AllToAllTokenDispatcher.combine: `(routed_output.to(torch.float32) * scores).to(routed_output.dtype)`, three
kernels when not compiled, CompileConfig.enable defaulting to False): cast to fp32 (read 2, write 4), multiply
(read 4, write 4), cast back (read 4, write 2). The multiply keeps the fp32 copy for the scores' gradient
(memory.decoder_activation_bytes)."""


def moe_permutation_rows(spec: ModelSpec, shape: Shape) -> float:
    """Rows of h one MoE layer's forward permutes (each read and written once): the routed tokens into expert
    order before the dispatch and back after it (Megatron-Core moe_utils.permute / unpermute, torchtitan
    _local_reorder and its scatter_add), over the dispatch-side rows; where the stack sorts the received tokens
    again by local expert (behaviour.moe.expert_sort), that sort and its inverse over the expert-side rows
    (Megatron-Core MoEAlltoAllTokenDispatcher sort_chunks_by_idxs in dispatch_postprocess and combine_preprocess
    when num_local_experts > 1, token_dispatcher.py; torchtitan AllToAllTokenDispatcher._permute / _unpermute with
    ep > 1, torchtitan/models/common/token_dispatcher.py)."""
    local, expert = moe_rows(spec, shape)
    local_experts = spec.moe.num_experts // max(1, shape.expert_parallel)
    sorts = ((shape.moe_expert_sort == "several_local_experts" and local_experts > 1)
             or (shape.moe_expert_sort == "expert_parallel" and shape.expert_parallel > 1))
    return 2 * local + (2 * expert if sorts else 0.0)


def head_elementwise_bytes(spec: ModelSpec, shape: Shape) -> float:
    """Forward bytes of the final norm (read + write) and the fp32 cross-entropy over T*V/t logits
    (read bf16 logits, write fp32, softmax read + write: ~14 bytes per logit)."""
    norm = norm_bytes(spec, shape.kernels) * shape.tokens * spec.hidden_size / shape.sp_div
    return norm + 14 * shape.tokens * spec.vocab_size / shape.tp


def embedding_elementwise_bytes(spec: ModelSpec, shape: Shape) -> float:
    """Forward bytes of the embedding gather: read and write T*h (split by tp with sp)."""
    return 2 * shape.tokens * spec.hidden_size * ACT_BYTES / shape.sp_div


def memory_bound_time_s(num_bytes: float, *, device: DeviceSpec, cal: DeviceCalibration) -> float:
    """Streaming time: bytes / (HBM bandwidth * achieved fraction)."""
    return num_bytes / (device.hbm_bandwidth_GBps * 1e9 * cal.hbm_efficiency)


def peak_tflops(device: DeviceSpec, precision: str) -> float:
    """Datasheet dense peak for the precision's matmuls: bf16 (amp-bf16 too), fp32 (no tensor cores),
    fp8 (falls back to bf16 when the device has no fp8 tensor cores)."""
    if precision == "fp32":
        return device.peak_fp32_tflops
    if precision == "fp8" and device.peak_fp8_tflops is not None:
        return device.peak_fp8_tflops
    return device.peak_bf16_tflops


def gemm_peak_tflops(device: DeviceSpec, precision: str, cal: DeviceCalibration) -> float:
    """The peak a GEMM's ceiling fraction applies to: the datasheet peak of the precision, and for fp8 GEMMs that
    peak times the family's measured fp8/bf16 ceiling ratio (cuBLASLt fp8 GEMMs reach a smaller fraction of their
    doubled peak than bf16 GEMMs of theirs: benchmarks/gpu_kernels.py, calibration.yaml fp8_matmul_relative)."""
    peak = peak_tflops(device, precision)
    if precision == "fp8" and device.peak_fp8_tflops is not None:
        return peak * cal.fp8_matmul_relative
    return peak


def gemms_flops(gemms: list[Gemm], *, attention_only: bool = False) -> float:
    """Sum of forward FLOPs, optionally of the attention core only."""
    return sum(g.flops for g in gemms if g.attention_core or not attention_only)
