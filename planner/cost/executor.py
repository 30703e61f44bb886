"""The `planner` stack priced as its own code runs: what the executor's training step saves, holds and launches.

The generic formulas (planner.cost.memory, compute) describe Megatron-style fused layers; the HuggingFace eager
recipe (planner.cost.autocast, eager) describes transformers' modeling code. Our executor is neither: it runs
planner/nn/model.py and planner/nn/moe.py under planner/executor/runtime.py. A stack profile with
`behaviour.executor` (planner/data/frameworks/planner.yaml) is priced here, operator by operator, from that code:

Recipe. `amp` (fp32 parameters, torch.autocast bf16): runtime.parallelize_part sets autocast_dtype for every
non-fp32 precision without FSDP2 and parallelize.mp_policy maps bf16 and amp-bf16 to the same policy (c162dfb:
planner/executor/runtime.py, parallelize.py), so up to that code `bf16` ran as `amp`
(behaviour.executor.bf16_recipe: autocast; ZeRO-2/3 ran FSDP2's bf16 policy with dp > 1, fp32 with dp = 1).
The executor now (bf16-params, planner/executor/precision.py) runs one recipe per precision on every path: bf16
holds bf16 parameters (a bf16 residual stream, no casts) with fp32 masters in MasterWeightOptimizer, amp-bf16 fp32
parameters under autocast (recipe_for; bytes per parameter from behaviour.memory.recipes). Residual-stream bytes r = 4 under amp and fp32, 2 with bf16
parameters; GEMM outputs, attention and MLP intermediates in the compute dtype c (2, or 4 for fp32).

Saved per dense decoder layer (T tokens of this GPU, t = tp), following the forward of TransformerBlock:
- attention_norm / ffn_norm: nn.RMSNorm, on CUDA torch's fused kernel, whose backward takes the input and rstd
  (aten::_fused_rms_norm_backward(grad_out, input, normalized_shape, rstd, weight)): r*T*h each (the block input x
  and h = x + attention), plus 4*T per norm;
- wq, wk, wv, w1, w3: under autocast each nn.Linear casts the fp32 norm output itself and saves its own bf16 copy
  (autocast caches casts of leaf parameters only): 2*T*h each; without autocast they share one saved norm output;
- q after RoPE, and k, v after repeat_interleave to all heads (c162dfb: Attention.attend expanded GQA before SDPA;
  now AttentionCore passes the kv heads with enable_gqa in 16-bit, behaviour.executor.sdpa_gqa native: c*T*kv*d/t
  for k and v, no repeat kernels): c*T*a*d/t each (with qk_norm, the norms' inputs c*T*(a + kv)*d/t too); SDPA (flash/cuDNN/efficient) saves q, k, v, its
  output (also wo's input) and the fp32 log-sum-exp 4*b*a*s/t;
- the MLP: gated keeps w1's output (SiLU's input), SiLU's output, w3's output and their product (w2's input):
  4*c*T*f/t; plain keeps fc1's output and the activation output: 2*c*T*f/t.
For TinyLlama under amp this is 48.06*T*h per layer; the per-token slope of the measured peaks of
validation/h100_executor_runs.json (micro-batch 2 -> 4, 4096 more tokens) is 2,626,228 bytes per token against
2,625,792 counted (22 layers plus the head below): 0.02%.
Selective recompute (parallelize.apply_ac wraps attention.core): the core's inputs are kept as its checkpoint,
only the log-sum-exp is dropped. Full recompute keeps each block's input (r*T*h).

The loss (runtime.accumulate, train.cross_entropy): the model returns bf16 logits (c*T*V/t), which `logits` holds
until the micro-batch's backward ends; F.cross_entropy(logits.float()) makes an fp32 copy and log_softmax saves its
fp32 output (4*T*V/t, a head activation); its backward writes nll_loss's gradient and log_softmax's input
gradient (4 + 4)*T*V/t while the saved output lives: the loss phase holds (c + 12)*T*V/t, the layers' backward c*T*V/t.

MoE blocks (moe_mlp_bytes, moe_router_ops, moe_expert_loop_ops, moe_grouped_layout_ops): as planner/nn/moe.py runs
them (grouped now: one GEMM per stacked weight over a padded layout, priced as compute.mlp_gemms); with
behaviour.executor.moe_expert_impl `loop` each expert is its own GEMMs over weight slices w[e] (per-call GEMM time
from the measured t0), each slice's backward materialises the whole stacked weight's gradient (SelectBackward), and
the block's forward syncs with the host three times. Time: operator counts and bytes per module, each phase
max(device, host) with the stack's eager constants (section below).
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost.compute import Shape
from planner.cost.eager import OpCount
from planner.cost.memory import LayerActivations, Recipe
from planner.schemas.model import ModelSpec

FP32 = 4
RMSNORM_RSTD_BYTES = 4  # fp32 rstd per token per norm (aten::_fused_rms_norm)
CUBLAS_WORKSPACES_BYTES = 2 * 32 * 2**20
"""cuBLAS workspaces torch allocates through its caching allocator, one per (handle, stream)
(aten/src/ATen/cuda/CublasHandlePool.cpp, cublas_handle_stream_to_workspace): handles are per thread, so the forward
(main thread) and the backward (the autograd engine's device thread) each hold one, 32 MiB on Hopper. Measured: the
intercept of the h100_hf_tinyllama.jsonl allocated peaks (2 x micro-batch 1 - micro-batch 2) less 12 + 2 bytes per
parameter is 67.2 MB = 2 x 32 MiB. GPUs only (CostModel.stage_other_bytes)."""


@dataclass(frozen=True, kw_only=True)
class Dtypes:
    """How the executor runs a precision: residual-stream bytes, compute-dtype bytes, autocast casts or not."""

    residual: int
    compute: int
    autocast: bool
    repeat_kv: bool = True  # GQA's k and v repeated to every query head before SDPA (behaviour.executor.sdpa_gqa)


def recipe_for(precision: str, *, bf16_autocast: bool, zero_stage: int = 0, dp: int = 1, sdpa_gqa: str = "repeat") -> Dtypes:
    """The executor's recipe for a plan's precision (module docstring; behaviour.executor.bf16_recipe, sdpa_gqa).

    bf16_autocast (the code of c162dfb): with ZeRO-2/3 that executor enabled no autocast (runtime.parallelize_part:
    autocast_dtype only for zero 0/1) and handed both bf16 recipes to FSDP2's MixedPrecisionPolicy(param_dtype=bf16,
    reduce_dtype=fp32): bf16 compute on bf16 copies of the fp32 parameters, a bf16 residual stream, no per-linear
    casts. With dp = 1 parallelize_part returns the module before apply_dp: no FSDP2 either, so ZeRO-2/3 on one
    data-parallel rank ran in fp32.
    bf16-params (the code now, planner/executor/precision.py): the recipe is the same on every path: amp-bf16 =
    fp32 parameters under autocast (runtime.build_parts sets autocast_dtype for amp-bf16 on every path; mp_policy
    gives FSDP2 no policy), bf16 and fp8 = bf16 parameters, no autocast (prepare_module), fp32 = fp32.
    sdpa_gqa "native": AttentionCore passes k, v with their kv heads (enable_gqa) except fp32 on CUDA, which still
    repeats them (planner/nn/model.py AttentionCore.forward); "repeat" (c162dfb): always repeated."""
    if bf16_autocast and precision in ("bf16", "amp-bf16") and zero_stage >= 2:
        found = Dtypes(residual=2, compute=2, autocast=False) if dp > 1 else Dtypes(residual=FP32, compute=FP32, autocast=False)
    elif precision == "amp-bf16" or (precision == "bf16" and bf16_autocast):
        found = Dtypes(residual=FP32, compute=2, autocast=True)
    elif precision == "fp32":
        found = Dtypes(residual=FP32, compute=FP32, autocast=False)
    else:
        found = Dtypes(residual=2, compute=2, autocast=False)
    if sdpa_gqa == "native" and found.compute != FP32:
        found = Dtypes(residual=found.residual, compute=found.compute, autocast=found.autocast, repeat_kv=False)
    return found


AUTOCAST_BYTES = Recipe(weight_bytes=4 + 2, grad_bytes=4, optimizer_bytes=8, grad_reduce_bytes=4, gather_bytes=2)
"""Bytes per parameter of the c162dfb executor's bf16 recipes (both ran fp32 parameters, behaviour.executor
bf16_recipe autocast): fp32 weights + the bf16 autocast copies (zero 0/1; static_bytes.executor_uncast_bytes takes out the
copies it does not hold), fp32 gradients, AdamW m and v; DDP and FSDP2 reduced in fp32, FSDP2 gathered bf16 (its
parallelize.mp_policy). The executor now prices every precision from behaviour.memory.recipes (its amp-bf16 row is
these bytes but for the gather: FSDP2 without a policy gathers fp32), the copies taken out the same way."""

MASTER_STEP_CHUNK_ELEMENTS = 2**26
"""planner/executor/precision.py MASTER_STEP_CHUNK_NUMEL: MasterWeightOptimizer.step converts the bf16 gradients to
fp32 (master.grad = grad.float()) for at most this many elements at a time, or one parameter if larger, each chunk
freed after its update: the bf16 step's transient is 4 bytes x min(local elements, max(2**26, largest parameter))."""
MASTER_STEP_EXTRA_BYTES_TOUCHED = 2 + 4 + 4 + 2
"""HBM bytes per parameter the bf16 step moves beside the AdamW update on the fp32 master (MasterWeightOptimizer.step):
grad.float() reads 2 and writes 4, then `_local(p).copy_(_local(m))` reads the fp32 master 4 and writes bf16 2."""


def largest_parameter(spec: ModelSpec, *, ep: int = 1) -> int:
    """Elements of the executor's largest nn.Parameter (planner/nn/model.py: separate wq/wk/wv/wo, w1/w2/w3, the
    embedding and output tables; planner/nn/moe.py GroupedExperts: w1, w2, w3 stacked over the E/ep local experts)."""
    h = spec.hidden_size
    largest = max(spec.vocab_size * h, spec.num_attention_heads * spec.dim_per_head * h, spec.ffn_hidden_size * h)
    if spec.moe is not None:
        largest = max(largest, spec.moe.num_experts // ep * spec.moe.expert_ffn_hidden_size * h,
                      spec.moe.shared_ffn_hidden_size * h)
    return largest


def _norm_inputs(recipe: Dtypes, tokens: float, h: int, consumers: int) -> float:
    """Saved inputs of the linears fed by one norm: one bf16 cast each under autocast, else the norm output once."""
    return consumers * 2 * tokens * h if recipe.autocast else recipe.residual * tokens * h


def attention_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> tuple[float, float]:
    """(replicated, sharded) bytes the attention half of a block saves (module docstring)."""
    tokens, h = shape.tokens, spec.hidden_size
    a, d = spec.num_attention_heads, spec.dim_per_head
    kv_saved = a if recipe.repeat_kv else spec.kv_heads  # repeat_interleave to all heads before SDPA, or enable_gqa
    replicated = (recipe.residual + RMSNORM_RSTD_BYTES / h) * tokens * h + _norm_inputs(recipe, tokens, h, 3)
    sharded = recipe.compute * tokens * d * (a + 2 * kv_saved) + recipe.compute * tokens * a * d
    if spec.qk_norm:  # q_norm/k_norm (RMSNorm over head_dim) keep their inputs, the projections' outputs
        sharded += (recipe.compute + RMSNORM_RSTD_BYTES / d) * tokens * d * (a + spec.kv_heads)
    lse = FP32 * shape.microbatch_size * a * shape.seq_len / shape.cp
    return replicated, sharded + lse


def dense_mlp_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> tuple[float, float]:
    """(replicated, sharded) bytes the dense MLP half saves: h = x + attention, the norm's inputs, the MLP tensors."""
    tokens, h, f = shape.tokens, spec.hidden_size, spec.ffn_hidden_size
    inputs = 2 if spec.gated else 1
    replicated = (recipe.residual + RMSNORM_RSTD_BYTES / h) * tokens * h + _norm_inputs(recipe, tokens, h, inputs)
    return replicated, (4 if spec.gated else 2) * recipe.compute * tokens * f


def moe_mlp_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> tuple[float, float]:
    """(replicated, routed) bytes an MoE block's FFN half saves, planner/nn/moe.py as it runs (loop or grouped):
    h and the ffn_norm input, the router (gate input cast 2*T*h, fp32 softmax probabilities 4*T*E), the k*T routed
    rows: their bf16 casts for w1 and w3 (two casts under autocast, 2 * 2*k*T*h; one row copy otherwise), the
    gated expert MLP 4*c*k*T*f_e, each expert's output y (c*k*T*h) saved by the combine product y * weight, and
    that product (r*k*T*h: the combine weights have the residual dtype) saved by index_add as its `source`
    (torch's generated IndexAddBackward0 keeps `SavedVariable source_`); shared experts as a dense gated MLP over
    all T tokens. Without the index_add term the Mixtral row's peak is 2.0% under its measurement, with it 0.3%."""
    tokens, h = shape.tokens, spec.hidden_size
    cfg = spec.moe
    routed = tokens * cfg.top_k * (cfg.capacity_factor or 1.0)
    casts = 2 if spec.gated else 1
    replicated = (recipe.residual + RMSNORM_RSTD_BYTES / h) * tokens * h
    replicated += 2 * tokens * h + FP32 * tokens * cfg.num_experts  # router gate input cast, softmax output
    row_inputs = casts * 2 * routed * h if recipe.autocast else recipe.residual * routed * h
    expert = row_inputs + (4 if spec.gated else 2) * recipe.compute * routed * cfg.expert_ffn_hidden_size
    expert += recipe.compute * routed * h + recipe.residual * routed * h
    shared = 0.0
    if cfg.shared_ffn_hidden_size:
        shared = _norm_inputs(recipe, tokens, h, casts) + (4 if spec.gated else 2) * recipe.compute * tokens * cfg.shared_ffn_hidden_size
    return replicated, expert + shared


def decoder_activation_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes, *, moe_layer: bool,
                             moe_loop: bool = False) -> LayerActivations:
    """Saved bytes of one decoder layer of the executor for one micro-batch on one GPU (module docstring)."""
    t = shape.tp
    attn_rep, attn_shard = attention_bytes(spec, shape, recipe)
    mlp_rep, mlp_shard = (moe_mlp_bytes if moe_layer else dense_mlp_bytes)(spec, shape, recipe)
    none = (attn_rep + mlp_rep) / shape.sp_div + (attn_shard + mlp_shard) / t
    lse = FP32 * shape.microbatch_size * spec.num_attention_heads * shape.seq_len / shape.cp / t
    full = recipe.residual * shape.tokens * spec.hidden_size / shape.sp_div
    return LayerActivations(none=none, selective=none - lse, full=full,
                            transient=backward_transient_bytes(spec, shape, recipe, moe_layer=moe_layer, moe_loop=moe_loop))


def backward_transient_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes, *, moe_layer: bool,
                             moe_loop: bool = False) -> float:
    """Gradients one layer's backward holds beyond what it saved: the MLP's widest pair (output and input
    gradient of the gated product, c*T*f each, plus w1/w3's fp32-cast input gradients r*T*h); in an MoE layer run
    as a per-expert loop, the full-size fp32 gradient of each stacked expert weight that autograd's
    SelectBackward materialises for every `w[e]` slice (zeros of the whole (E, f, h) tensor, accumulated in the
    weight's input buffer): one buffer per weight plus the slice gradient being added."""
    tokens, h, t = shape.tokens, spec.hidden_size, shape.tp
    width = spec.ffn_hidden_size
    if moe_layer:
        width = max(spec.moe.expert_ffn_hidden_size * spec.moe.top_k, spec.moe.shared_ffn_hidden_size)
    pair = 3 * recipe.compute * tokens * width / t + 2 * recipe.residual * tokens * h / shape.sp_div
    if moe_layer and moe_loop:
        weights = 3 if spec.gated else 2
        stacked = spec.moe.num_experts / shape.ep * spec.moe.expert_ffn_hidden_size * h / t
        pair += FP32 * stacked * (weights + 1)
    return pair


def head_activation_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> float:
    """Final norm input (+ rstd), the output linear's saved input, the fp32 log-softmax the loss saves."""
    tokens, h = shape.tokens, spec.hidden_size
    region = (recipe.residual * tokens * h + RMSNORM_RSTD_BYTES * tokens + _norm_inputs(recipe, tokens, h, 1)) / shape.sp_div
    return region + FP32 * tokens * spec.vocab_size / shape.tp


def logits_held_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> float:
    """The model's logits, held by runtime.accumulate's `logits` through the whole micro-batch backward."""
    return recipe.compute * shape.tokens * spec.vocab_size / shape.tp


def loss_transient_bytes(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> float:
    """The loss phase beyond the held logits and the saved log-softmax: in forward the fp32 copy `.float()` makes
    (none when the logits are fp32 already), in backward nll_loss's and log_softmax's fp32 gradients (8*T*V/t);
    then the output layer's backward: its weight gradient in the compute dtype and, under autocast, its fp32 cast
    (the weight cast's ToCopyBackward) before AccumulateGrad adds it to .grad, (c + 4)*V*h/t, beside the logits'
    gradient (c*T*V/t). The largest of the three."""
    logits = shape.tokens * spec.vocab_size / shape.tp
    head = spec.vocab_size * spec.hidden_size / shape.tp
    head_backward = (recipe.compute + (FP32 if recipe.autocast else 0)) * head + recipe.compute * logits
    return max(0.0 if recipe.compute == FP32 else FP32 * logits, 2 * FP32 * logits, head_backward)


# ------------------------------------------------------------------------------------------------ time
# Operators (about one kernel each) and HBM bytes of the memory-bound ones, per micro-batch, counted from the same
# code; GEMMs and attention are timed by compute.gemm_time_s, the weight casts by memory.AUTOCAST_CAST_BYTES. Each
# phase is max(device + kernels x eager_kernel_s, operators x eager_host_op_s) (planner.cost.eager.phase_s), with
# the stack's eager constants (calibration.yaml stack_eager, fitted by benchmarks/gpu_executor.py --derive from the
# executor's own runs; the family's HuggingFace-measured values where it has none).
OPTIMIZER_BYTES_TOUCHED = {"foreach": 76, "fused": 28}
"""HBM bytes per fp32 parameter of one AdamW step (weight decay 0, the executor's build_optimizer). fused: one
kernel reads p, g, m, v and writes p, m, v (28). foreach (torch/optim/adam.py _multi_tensor_adam, capturable
False): lerp_(m, g) 12, mul_(v) 8, addcmul_(v, g, g) 16, sqrt(v) -> tmp 8, div_(tmp) 8, add_(tmp, eps) 8,
addcdiv_(p, m, tmp) 16: 76."""

MOE_HOST_SYNCS = 3
"""Host synchronisations per MoE block forward in planner/nn/moe.py, loop or grouped experts alike: Router's
torch.bincount and MoE._assign's torch.bincount (CUDA bincount reads the input's max to size its output: .item()),
and MoE._run_experts' counts.tolist(). The queue drains at each, so the operator after it starts with the device
idle: each sync adds one operator's host time and one kernel's time to the block's forward
(eager_layers.executor_decoder_cost)."""


def _linear(in_elements: float, out_elements: float, *, input_cast: bool, recipe: Dtypes) -> OpCount:
    """nn.Linear: [input cast (4+2)], [weight cast], GEMM; backward: 2 GEMMs, [weight-gradient cast], AccumulateGrad's
    add into the existing .grad, [input-gradient cast back (2+4)]. Weight-cast bytes are per parameter elsewhere."""
    casts = recipe.autocast
    cast_in = casts and input_cast
    fwd = 1 + casts + cast_in
    bwd = 2 + casts + 1 + cast_in
    moved = 6 * in_elements if cast_in else 0.0
    return OpCount(fwd_ops=fwd, bwd_ops=bwd, fwd_bytes=moved, bwd_bytes=moved)


def _norm(elements: float, recipe: Dtypes) -> OpCount:
    """Fused RMSNorm: one kernel (read x, write y); backward: input gradient, weight gradient, its accumulation."""
    r = recipe.residual
    return OpCount(fwd_ops=1, bwd_ops=3, fwd_bytes=2 * r * elements, bwd_bytes=3 * r * elements)


def _residual(elements: float, recipe: Dtypes) -> OpCount:
    """x + branch (r + c read, r write); backward: the branch gradient cast to its dtype (under autocast) and the
    sum of the two gradients reaching x (3r)."""
    r, c = recipe.residual, recipe.compute
    cast = r != c
    return OpCount(fwd_ops=1, bwd_ops=1 + cast, fwd_bytes=(2 * r + c) * elements,
                   bwd_bytes=3 * r * elements + ((r + c) * elements if cast else 0.0))


def _rope(elements: float, recipe: Dtypes) -> OpCount:
    """apply_rope on one tensor: cos/sin casts, x*cos, neg of a half, cat, *sin, add: 7 kernels, 20 bytes per
    c=2 element; backward: *sin, *cos, neg, two slice backwards (zeros + copy) and the sums: 9 kernels, ~30."""
    c = recipe.compute
    return OpCount(fwd_ops=7, bwd_ops=9, fwd_bytes=10 * c * elements, bwd_bytes=15 * c * elements)


def attention_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """The attention half of a block of planner/nn/model.py, per GPU: kernels and memory-bound bytes (GEMMs and
    SDPA's own time excluded): norm, q/k/v linears, RoPE, GQA's repeat_interleave of k and v (a copy each, a sum
    each in backward), SDPA (1 kernel, 3 in backward), wo, the residual, and the sum of q/k/v's input gradients."""
    t, tokens, c = shape.tp, shape.tokens, recipe.compute
    region = tokens * spec.hidden_size / shape.sp_div
    q = tokens * spec.num_attention_heads * spec.dim_per_head / t
    kv = tokens * spec.kv_heads * spec.dim_per_head / t
    expand = OpCount()
    if spec.num_attention_heads != spec.kv_heads and recipe.repeat_kv:
        expand = OpCount(fwd_ops=2, bwd_ops=2, fwd_bytes=2 * c * (kv + q), bwd_bytes=2 * c * (kv + q))
    fan = OpCount(bwd_ops=2, bwd_bytes=2 * 3 * recipe.residual * region)
    if spec.qk_norm:  # two more norms on the q and k heads (their dtype after autocast: counted at the residual's)
        fan = fan + _norm(q + kv, recipe)
    return (_norm(region, recipe) + _linear(region, q, input_cast=True, recipe=recipe)
            + _linear(region, kv, input_cast=True, recipe=recipe).times(2)
            + (_rope(q, recipe) + _rope(kv, recipe) if spec.position == "rope" else OpCount()) + expand
            + OpCount(fwd_ops=1, bwd_ops=3) + _linear(q, region, input_cast=False, recipe=recipe) + _residual(region, recipe) + fan)


def mlp_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """The dense MLP half: norm, w1 (and w3) with their input casts, SiLU (and the product), w2, the residual."""
    tokens, c = shape.tokens, recipe.compute
    region = tokens * spec.hidden_size / shape.sp_div
    f = tokens * spec.ffn_hidden_size / shape.tp
    inputs = 2 if spec.gated else 1
    act = OpCount(fwd_ops=2, bwd_ops=3, fwd_bytes=5 * c * f, bwd_bytes=9 * c * f) if spec.gated else \
        OpCount(fwd_ops=1, bwd_ops=1, fwd_bytes=2 * c * f, bwd_bytes=3 * c * f)
    fan = OpCount(bwd_ops=inputs - 1, bwd_bytes=3 * recipe.residual * region * (inputs - 1))
    return (_norm(region, recipe) + _linear(region, f, input_cast=True, recipe=recipe).times(inputs) + act
            + _linear(f, region, input_cast=False, recipe=recipe) + _residual(region, recipe) + fan)


def moe_block_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """The MoE half of a block without the experts: norm, router and combine (moe_router_ops), the residual."""
    region = shape.tokens * spec.hidden_size / shape.sp_div
    return _norm(region, recipe) + moe_router_ops(spec, shape, recipe) + _residual(region, recipe)


def moe_router_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """Router, assignment, gather and combine of an MoE block (planner/nn/moe.py), per GPU, without the experts:
    gate linear, softmax/topk/renormalise/bincount/aux loss (12), argsort/index/bincount/counters (7), the fp32 gather
    x2[token_idx] (2r per routed element), cat of the expert outputs (2c), y * w (c + 2r), zeros_like + index_add
    (3r per token element + r per routed); backward: index_select of the gradient, the product's two gradients
    and cast, the split gradients' cat, index's zeros + accumulate (about 12 kernels)."""
    tokens, h, r, c = shape.tokens, spec.hidden_size, recipe.residual, recipe.compute
    routed = tokens * spec.moe.top_k * h
    gate = _linear(tokens * h, tokens * spec.moe.num_experts, input_cast=True, recipe=recipe)
    fwd_bytes = 2 * r * routed + 2 * c * routed + (c + 2 * r) * routed + 3 * r * tokens * h + r * routed
    bwd_bytes = 2 * r * routed + (2 * r + 2 * c) * routed + 2 * r * routed + 3 * r * tokens * h
    return gate + OpCount(fwd_ops=19 + 6, bwd_ops=12, fwd_bytes=fwd_bytes, bwd_bytes=bwd_bytes)


def moe_expert_loop_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """The per-expert Python loop of GroupedExperts.forward over the E local experts (moe_expert_impl: loop), GEMMs
    and weight-cast bytes excluded. Per expert: w1[e], w3[e], w2[e] casts and their row casts under autocast, three
    GEMMs, SiLU and the product (10 kernels; 4 without autocast). Backward per expert: six GEMMs, the weight-gradient
    casts, and for each of the three slices autograd's SelectBackward (torch derivatives.yaml select: select_backward
    = zeros of the whole stacked weight + a copy of the slice) whose full-size fp32 gradient the weight's input
    buffer accumulates (one add of the whole tensor per expert after the first); the two row-gradient casts and
    their sum; SiLU and product backward: about 22 kernels per expert. Bytes of that accumulation grow as E^2."""
    cfg = spec.moe
    local = cfg.num_experts / shape.ep
    rows = shape.tokens * cfg.top_k * (cfg.capacity_factor or 1.0) / local  # per expert
    h, f, c = spec.hidden_size, cfg.expert_ffn_hidden_size / shape.tp, recipe.compute
    weights = 3 if spec.gated else 2
    casts = recipe.autocast
    per_fwd = OpCount(fwd_ops=weights + 2 + casts * (weights + 2), fwd_bytes=(6 * rows * h * 2 if casts else 0.0) + 5 * c * rows * f)
    slice_elems = f * h
    select = weights * (FP32 * local * slice_elems + 8 * slice_elems + 3 * FP32 * local * slice_elems * (local - 1) / local)
    per_bwd = OpCount(bwd_ops=2 * weights + weights * (2 + casts + 1) + 3 + 3 * casts,
                      bwd_bytes=select + 9 * c * rows * f + (3 * 6 * rows * h if casts else 0.0))
    return (per_fwd + per_bwd).times(int(round(local)))


def moe_grouped_layout_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """GroupedExperts.forward's padded layout around its grouped GEMMs (moe_expert_impl grouped, planner/nn/moe.py),
    R = routed rows: the row indices (counts to the device, repeat_interleave, arange, cumsum, the slot and padded
    offsets: ~12 small kernels), x.new_zeros + index_copy into the layout (c write, c read + c write) and the gather
    back (2c); backward: the gather's zeros + index_put accumulate (4c) and index_copy's index_select (2c)."""
    rows = shape.tokens * spec.moe.top_k * (spec.moe.capacity_factor or 1.0) * spec.hidden_size
    c = recipe.compute
    return OpCount(fwd_ops=15, bwd_ops=3, fwd_bytes=5 * c * rows, bwd_bytes=6 * c * rows)


def head_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """Final norm, output linear, and the loss of runtime.accumulate: logits.float() (c + 4), log_softmax (8), nll;
    backward: nll's zero fill and scatter (4), log_softmax backward (12), the cast back (4 + c)."""
    region = shape.tokens * spec.hidden_size / shape.sp_div
    logits = shape.tokens * spec.vocab_size / shape.tp
    to_fp32 = recipe.compute != FP32
    loss = OpCount(fwd_ops=2 + to_fp32 + 2, bwd_ops=3 + to_fp32, fwd_bytes=(8 + (recipe.compute + 4) * to_fp32) * logits,
                   bwd_bytes=(16 + (recipe.compute + 4) * to_fp32) * logits)
    return _norm(region, recipe) + _linear(region, logits, input_cast=True, recipe=recipe) + loss


def embedding_ops(spec: ModelSpec, shape: Shape, recipe: Dtypes) -> OpCount:
    """nn.Embedding gather (2r per element); backward: embedding_dense_backward's zero fill of the V x h/t table,
    the row accumulation, and AccumulateGrad's add (4 + 12 per table element)."""
    region = shape.tokens * spec.hidden_size / shape.sp_div
    table = spec.vocab_size * spec.hidden_size / shape.tp
    r = recipe.residual
    return OpCount(fwd_ops=1, bwd_ops=3, fwd_bytes=2 * r * region, bwd_bytes=3 * r * region + 16 * table)
