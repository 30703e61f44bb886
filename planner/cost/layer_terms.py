"""The terms every layer's cost is built from: the links a layer's collectives see (Links), everything a layer's
cost depends on besides its type (Env), one module's costs (ModuleCost), and the times of its matmuls, its
exposed TP, CP and EP communication and its weight casts. planner.cost.layers (the analytic decoder, embedding and
head), planner.cost.eager_layers (the eager recipe and the planner's executor) and planner.cost.mixer_layers
(Gated DeltaNet, Mamba) assemble modules from them.
"""

from __future__ import annotations

from dataclasses import dataclass

from planner.cost import comm, compute, context_parallel, memory, moe_comm
from planner.cost import executor as executor_cost
from planner.cost.calibration import DeviceCalibration
from planner.cost.compression import FP8_DISPATCH_BYTES
from planner.cost.compute import Shape
from planner.models import counting
from planner.schemas.model import ModelSpec
from planner.schemas.topology import DeviceSpec
from planner.topology.groups import GroupLink


@dataclass(frozen=True, kw_only=True)
class Links:
    """The link each parallel axis's process groups see (planner.topology.placement.axis_link)."""

    tp: GroupLink
    cp: GroupLink
    ep: GroupLink
    dp: GroupLink  # gradient reduction of dense parameters: the dp x cp ranks
    expert_dp: GroupLink  # gradient reduction of routed experts: dp x cp / ep ranks
    pp: GroupLink
    dp_replicate: GroupLink | None = None  # HSDP: the all-reduce of the gradient shard across replicas (dp, expert_dp
    # are then the shard groups); None without HSDP

@dataclass(frozen=True, kw_only=True)
class Env:
    """Everything a layer's cost depends on besides its type."""

    spec: ModelSpec
    device: DeviceSpec
    cal: DeviceCalibration
    precision: str
    shape: Shape
    links: Links
    tp_overlap: str
    stack_tp_overlap: bool = False  # the stack overlaps TP collectives with GEMMs (behaviour.overlap.tp_comm)
    moe_overlap: bool = False  # the stack overlaps MoE all-to-all with compute (behaviour.overlap.moe_all_to_all)
    selective_mode: str = "attention_core"  # what the stack's selective recompute reruns (behaviour.memory)
    selective_modules: tuple[str, ...] = ()  # the candidate's own --recompute-modules (planner.cost.selective); () = the mode's
    moe_hierarchical: bool = False  # MoE dispatch sends a token once per destination node (behaviour.overlap)
    executor: executor_cost.Dtypes | None = None  # the planner's executor, priced from its code (planner.cost.executor)
    moe_loop: bool = False  # routed experts as a per-expert Python loop (behaviour.executor.moe_expert_impl)
    moe_dispatch_fp8: bool = False  # dispatch-direction all-to-alls in fp8 (compression fp8-dispatch)
    moe_allgather: bool = False  # the stack's all-gather dispatcher is among its choices (moe_comm)
    moe_dispatchers: tuple[str, ...] | None = None  # the dispatchers priced; None = all the stack runs (CostOptions)
    moe_deepep: bool = False  # flex is DeepEP's Buffer: only at the group sizes it has a configuration for
    moe_shared_overlap: bool = False  # shared experts compute during the dispatch (moe_comm)
    moe_count_exchange: str = "none"  # the tokens-per-expert exchange before each dispatch (moe_layer.count_exchange_s)
    cp_flavours: tuple[str, ...] = ("p2p",)  # the stack's context-parallel flavours (context_parallel)
    fp8_casts: bool = True  # the fp8 recipe's casts are priced (CostOptions.fp8_casts)
    fp8_16bit_gemms: bool = True  # the head, router and delta rule at the bf16 rate under fp8 (CostOptions)

@dataclass(frozen=True, kw_only=True)
class ModuleCost:
    """One module, one micro-batch, this GPU. Times in seconds, bytes of activations."""

    compute_fwd_s: float
    compute_bwd_s: float
    tp_fwd_s: float = 0.0
    tp_bwd_s: float = 0.0
    ep_fwd_s: float = 0.0
    ep_bwd_s: float = 0.0
    cp_fwd_s: float = 0.0
    cp_bwd_s: float = 0.0
    selective_s: float = 0.0  # attention core forward again (selective recompute)
    act_none: float = 0.0
    act_selective: float = 0.0
    act_full: float = 0.0
    act_transient: float = 0.0  # gradients in flight during this module's backward (memory.backward_transient_bytes)
    recompute_compute_s: float | None = None  # compute a full recompute adds, when it is not one more forward
    moe_dispatcher: str | None = None  # the token dispatcher an MoE layer is priced with (moe_comm.choose)
    cp_flavour: str | None = None  # the context-parallel flavour a decoder layer is priced with (cp_choice)

    @property
    def full_recompute_s(self) -> float:
        """A second forward, communication included (Megatron's full recompute reruns the TP collectives); the
        eager recipe's recompute is costed inside its host-bound backward (planner.cost.eager)."""
        compute_s = self.compute_fwd_s if self.recompute_compute_s is None else self.recompute_compute_s
        return compute_s + self.tp_fwd_s + self.ep_fwd_s + self.cp_fwd_s

def gemm_times(env: Env, gemms: list[compute.Gemm]) -> tuple[float, float, float]:
    """(forward, backward, attention-core forward) seconds of a list of matmuls."""
    peak = compute.gemm_peak_tflops(env.device, env.precision, env.cal)
    attn_peak = env.device.peak_bf16_tflops if env.precision == "fp8" else peak
    flash = env.shape.flash_attention
    fwd = bwd = core = 0.0
    for gemm in gemms:
        sixteen = gemm.attention_core or (not gemm.fp8 and env.fp8_16bit_gemms)  # 16-bit under fp8: fp8_recipe
        t = compute.gemm_time_s(gemm, peak_tflops=attn_peak if sixteen else peak, cal=env.cal, flash=flash)
        fwd += t
        bwd += t * (compute.FLASH_BACKWARD_FACTOR if gemm.attention_core and flash else gemm.backward_factor)
        if gemm.attention_core:
            core += t
    return fwd, bwd, core

def tp_times(env: Env, fwd_compute_s: float, bwd_compute_s: float, collectives: int,
              gemm_s: tuple[float, float] = (0.0, 0.0)) -> tuple[float, float]:
    """`collectives` all-reduces (or all-gather + reduce-scatter pairs with SP: the same bytes) of T*h bf16 in each
    direction; exposed unless Domino overlaps them (comm.domino_exposed_s) or the stack overlaps them with the
    adjacent GEMMs (`gemm_s`: forward and backward GEMM seconds of the module, attention core excluded;
    comm.chunked_overlap_exposed_s)."""
    if env.shape.tp <= 1:
        return 0.0, 0.0
    size = env.shape.tokens * env.spec.hidden_size * compute.ACT_BYTES
    one = comm.ring_all_reduce_s(size, group=env.links.tp)
    fwd, bwd = collectives * one, collectives * one
    if env.tp_overlap == "domino":
        return comm.domino_exposed_s(fwd, fwd_compute_s), comm.domino_exposed_s(bwd, bwd_compute_s)
    if env.stack_tp_overlap and env.shape.sp:
        return (comm.chunked_overlap_exposed_s(fwd, gemm_s[0], chunks=env.shape.tp),
                comm.chunked_overlap_exposed_s(bwd, gemm_s[1], chunks=env.shape.tp))
    return fwd, bwd

def cp_times(env: Env, core_fwd_s: float) -> tuple[float, float]:
    """Exposed context-parallel communication of one layer: this rank's K and V (2*b*(s/cp)*kv*d/t bf16) and Q
    (b*(s/cp)*a*d/t) moved by the fastest flavour the stack runs (planner.cost.context_parallel: ring p2p beside
    the blockwise attention, all-gather of K/V, all-to-all by heads)."""
    return cp_choice(env, core_fwd_s)[1:]

def cp_choice(env: Env, core_fwd_s: float) -> tuple[str | None, float, float]:
    """(flavour by the profile's spelling, exposed forward s, exposed backward s) of cp_times
    (context_parallel.choose); (None, 0, 0) for cp 1."""
    shape, spec = env.shape, env.spec
    if shape.cp <= 1:
        return None, 0.0, 0.0
    kv_bytes = 2 * shape.tokens * spec.kv_heads * spec.dim_per_head * compute.ACT_BYTES / shape.tp
    q_bytes = shape.tokens * spec.num_attention_heads * spec.dim_per_head * compute.ACT_BYTES / shape.tp
    core_bwd = core_fwd_s * (compute.FLASH_BACKWARD_FACTOR if shape.flash_attention else 2.0)
    return context_parallel.choose(env.cp_flavours, q_bytes=q_bytes, kv_bytes=kv_bytes, cp=shape.cp,
                                   heads=spec.num_attention_heads, kv_heads=spec.kv_heads, group=env.links.cp,
                                   core_fwd_s=core_fwd_s, core_bwd_s=core_bwd)

def ep_times(env: Env) -> tuple[float, float]:
    """Two collectives each way per MoE layer (dispatch and combine; Lepikhin et al. 2021, GShard Sec. 2.2), the
    fastest dispatcher the stack runs for the slowest EP rank's load (moe_comm.dispatch_s). With fp8 dispatch one of
    the two each way moves fp8 values and their scales (planner.cost.compression.FP8_DISPATCH_BYTES per element:
    DeepSeek-V3 Sec. 3.3.2)."""
    return min(ep_options(env).values(), key=sum, default=(0.0, 0.0))

def ep_options(env: Env) -> dict[str, tuple[float, float]]:
    """(forward, backward) seconds of a layer's dispatch + combine by each dispatcher the stack runs (ep_times), for
    the tokens this GPU routes (compute.Shape.moe_tokens); Megatron-Core's all-gather dispatcher gathers over the
    expert-TP x EP ranks (MoEAllGatherTokenDispatcher: tp_ep_group), `gather_ranks` = etp of them per EP rank."""
    cfg = env.spec.moe
    if env.shape.ep <= 1 or cfg is None:
        return {}
    tokens = env.shape.moe_tokens  # this GPU's sequence shard under a sequence-parallel dispatch (moe_layer)
    kwargs = dict(group=env.links.ep, hierarchical=env.moe_hierarchical, allgather=env.moe_allgather,
                  gather_ranks=env.shape.etp if env.shape.moe_sp_dispatch else 1)
    bf16 = moe_comm.dispatch_options(tokens, cfg, env.spec.hidden_size, **kwargs)
    dispatch = (moe_comm.dispatch_options(tokens, cfg, env.spec.hidden_size, value_bytes=FP8_DISPATCH_BYTES,
                                          **kwargs) if env.moe_dispatch_fp8 else bf16)
    deepep_refuses = env.moe_deepep and not moe_comm.deepep_runs(env.shape.tp_ep)
    return {name: (bf16[name] + dispatch[name],) * 2 for name in bf16
            if (env.moe_dispatchers is None or name in env.moe_dispatchers) and not (name == "flex" and deepep_refuses)}

def layer_params_per_gpu(spec: ModelSpec, shape: Shape, moe_layer: bool) -> float:
    """Parameters of one decoder layer of the type held by one GPU (matrices split by tp, routed experts by ep too)."""
    base = counting.layer_norm_params(spec) + counting.attention_params(spec) / shape.tp
    if not moe_layer:
        return base + counting.mlp_params(spec, spec.ffn_hidden_size) / shape.tp
    moe = counting.moe_params(spec)
    return base + moe.router + moe.shared / shape.tp + moe.num_experts * moe.per_expert / (shape.ep * shape.tp)

def autocast_cast_s(env: Env, params: float) -> tuple[float, float]:
    """Weight casts torch.autocast adds per micro-batch (memory.AUTOCAST_CAST_BYTES), as HBM streaming time."""
    precision = "amp-bf16" if env.executor is not None and env.executor.autocast else env.precision
    fwd_bytes, bwd_bytes = memory.AUTOCAST_CAST_BYTES.get(precision, (0.0, 0.0))
    return (compute.memory_bound_time_s(params * fwd_bytes, device=env.device, cal=env.cal),
            compute.memory_bound_time_s(params * bwd_bytes, device=env.device, cal=env.cal))
