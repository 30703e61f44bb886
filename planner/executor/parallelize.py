"""Apply a plan's parallelisms to the plain reference model, one small function each (torchtitan style).

Order that works (see the design notes on torch.distributed on CPU): init the full model, cut the
pipeline stage, `apply_ep`, `apply_tp` (or `apply_domino_tp`), `apply_ac`, `apply_dp`, `build_optimizer`.
The training loop calls `sync_gradients(model)` after the last backward of a step (see `train.train_steps`):
it runs the gradient reductions that no wrapper does (expert parameters under EP, DTensor/manual-TP
parameters under ZeRO-0/1).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel, parallelize_module

from planner.errors import BadInputError
from planner.executor import compression as compressed
from planner.nn.common import check_divisible
from planner.nn.model import Transformer, TransformerBlock
from planner.nn.moe import MoE, shard_experts
from planner.nn.tensor_parallel import block_tp_plan
from planner.schemas.compression import NONE, Compression

GRAD_SYNC_ATTR = "_planner_grad_sync"
COMM_COUNTER_ATTR = "planner_comm_counter"  # the DDP wrapper's CommCounter (planner.executor.compression), or None


def blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(name, block) of the stage's decoder layers, checkpoint-wrapped or not."""
    layers = getattr(model, "layers", None)
    return list(layers.items()) if layers is not None else []


def unwrap_block(block: nn.Module) -> TransformerBlock:
    """The TransformerBlock inside an activation-checkpoint wrapper (apply_ac), or the block itself."""
    return getattr(block, "_checkpoint_wrapped_module", block)


def moe_modules(model: nn.Module) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]


def expert_params(model: nn.Module) -> list[nn.Parameter]:
    """Parameters of EP-sharded experts: different on every ep rank, reduced by `sync_gradients`."""
    return [p for m in moe_modules(model) if m.ep_group is not None for p in m.experts.parameters()]


# --------------------------------------------------------------------------------------------- TP / SP
def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, *, sp: bool, loss_parallel: bool = False) -> None:
    """Megatron-style TP (Shoeybi et al. 2019, sec. 3): wq/wk/wv/w1/w3 column-parallel, wo/w2 row-parallel;
    with `sp` the norms and residual stream are sharded along the sequence (Korthikanti et al. 2022, sec. 4.2).
    Embedding row-parallel (vocab-sharded), LM head column-parallel (logits replicated, or vocab-sharded
    DTensor with `loss_parallel`; then compute the loss under `torch.distributed.tensor.parallel.loss_parallel`).
    MoE layers stay replicated over tp ranks (no expert TP). Heads per rank follow from the sharded weights."""
    tp = tp_mesh.size()
    spec = _spec_of(model)
    if spec is not None:
        check_divisible("num_attention_heads", spec.num_attention_heads, "tp", tp)
        check_divisible("num_kv_heads", spec.kv_heads, "tp", tp)
        check_divisible("ffn_hidden_size", spec.ffn_hidden_size, "tp", tp)
    seq_layout = Shard(1) if sp else Replicate()
    root_plan: dict = {}
    if getattr(model, "tok_embeddings", None) is not None:
        root_plan["tok_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq_layout)
        if getattr(model, "pos_embeddings", None) is not None:
            root_plan["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=seq_layout)
        if getattr(model, "embedding_norm", None) is not None and sp:
            root_plan["embedding_norm"] = SequenceParallel(use_local_output=True)
    if getattr(model, "norm", None) is not None and sp:
        root_plan["norm"] = SequenceParallel()
    if getattr(model, "output", None) is not None:
        root_plan["output"] = ColwiseParallel(
            input_layouts=seq_layout,
            output_layouts=Shard(-1) if loss_parallel else Replicate(),
            use_local_output=not loss_parallel,
        )
    tied = spec is not None and spec.tied_embeddings and root_plan.keys() >= {"tok_embeddings", "output"}
    if root_plan:
        parallelize_module(model, tp_mesh, root_plan)
    if tied:  # both are vocab-sharded (Shard(0)) on the same mesh: share one DTensor again
        model.output.weight = model.tok_embeddings.weight
    for _, block in blocks(model):
        parallelize_module(unwrap_block(block), tp_mesh, block_tp_plan(unwrap_block(block), sp=sp))


def _spec_of(model: nn.Module):
    return model.spec if isinstance(model, Transformer) else None


# ------------------------------------------------------------------------------------------------- EP
def apply_ep(model: nn.Module, ep_group: dist.ProcessGroup) -> None:
    """Shard every MoE layer's experts over `ep_group` (experts/ep per rank) and switch on all-to-all
    dispatch/combine. Call on the fully initialised model, before TP/DP."""
    for moe in moe_modules(model):
        shard_experts(moe, ep_group)


def dropped_tokens(model: nn.Module) -> tuple[int, int]:
    """(dropped, routed) token-expert assignments counted on this rank since the last reset."""
    mods = moe_modules(model)
    return sum(int(m.dropped_tokens) for m in mods), sum(int(m.routed_tokens) for m in mods)


def routing_load(model: nn.Module) -> tuple[float, float]:
    """(sum over counted EP calls of the slowest EP rank's received tokens, sum of the EP ranks' mean), over this
    rank's MoE layers: (slowest / mean - 1) is the routing skew the run saw, the quantity MoESpec.routing_skew
    prices (planner.cost.moe_comm: the slowest EP rank gates every dispatch). One all_gather per MoE layer of each
    EP group, at the end of a run; (0.0, 0.0) without EP. Every member of an EP group returns the group's sums."""
    slowest = mean = 0.0
    for module in moe_modules(model):
        if module.ep_group is None or not len(module.received_tokens):
            continue
        mine = module.received_tokens.values()
        every = [torch.empty_like(mine) for _ in range(dist.get_world_size(module.ep_group))]
        dist.all_gather(every, mine, group=module.ep_group)
        loads = torch.stack(every)  # [ep rank, call]
        slowest += float(loads.max(0).values.sum())
        mean += float(loads.sum()) / loads.shape[0]
    return slowest, mean


# ------------------------------------------------------------------------------------------------- AC
def apply_ac(model: nn.Module, mode: str, full_layers: int = 0) -> None:
    """Activation checkpointing per block (Chen et al. 2016; Korthikanti et al. 2022 sec. 5 for selective):
    "full" wraps each block in checkpoint_wrapper; "selective" recomputes only the attention core
    (`attention.core`, the s^2 part); the first `full_layers` blocks of the stage are fully
    checkpointed on top of the base mode."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if mode not in ("none", "selective", "full"):
        raise BadInputError(f"recompute mode={mode!r} is unknown: choose none, selective or full")
    for position, (name, block) in enumerate(blocks(model)):
        if mode == "full" or position < full_layers:
            model.layers[name] = checkpoint_wrapper(block)
        elif mode == "selective":
            block.attention.core = checkpoint_wrapper(block.attention.core)


# ------------------------------------------------------------------------------------------------- DP
def hsdp_mesh(plan, mesh, device_type: str):
    """HSDP's 2-D dp mesh (Zhao et al. 2023, PyTorch FSDP, sec. 3.2.2 hybrid sharding): the plan's dp coordinate d
    splits into (d // dp_shard, d % dp_shard), shard groups being consecutive dp coordinates. A second DeviceMesh
    over all ranks (collective: every rank builds it) with dp split in two; returns its (dp_replicate, dp_shard) slice."""
    par = plan.parallelism
    dims = list(par.axis_order)
    layout = mesh.mesh.movedim(dims.index("dp"), -1)
    layout = layout.reshape(*layout.shape[:-1], par.dp_replicate, par.dims.dp_shard)
    names = tuple(d for d in dims if d != "dp") + ("dp_replicate", "dp_shard")
    return DeviceMesh(device_type, layout, mesh_dim_names=names)["dp_replicate", "dp_shard"]


def mp_policy(precision: str):
    """The plan's precision recipe as an FSDP2 MixedPrecisionPolicy (planner.executor.precision): None for fp32 and
    amp-bf16 (fp32 parameters gathered as they are; amp-bf16 computes under torch.autocast), bf16 compute and
    reduction for bf16 (a no-op on the executor's bf16 parameters; on fp32 parameters it computes in bf16)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from planner.executor.precision import MASTER_RECIPES, check_precision

    check_precision(precision)
    if precision in MASTER_RECIPES:
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)
    return None


def apply_dp(model: nn.Module, dp_mesh: DeviceMesh, *, zero_stage: int, precision: str = "fp32",
             expert_dp_group: dist.ProcessGroup | None = None, use_ddp: bool = True,
             compression: Compression = NONE) -> nn.Module:
    """Data parallelism: ZeRO-3 = FSDP2 fully_shard per block then root; ZeRO-2 = the same without
    resharding after forward (Rajbhandari et al. 2020, sec. 5); a 2-D dp_mesh gives HSDP. ZeRO-0/1 = DDP
    (plain tensors, Domino's manual TP shards included) or, when TP DTensors are present, an explicit gradient
    all-reduce in `sync_gradients`. EP experts never join the dp wrapper: their gradients are summed over
    `expert_dp_group` (the dp ranks that hold the same experts; None = none) and divided by the dp size.
    `use_ddp=False` takes the explicit all-reduce for ZeRO-0/1 even where DDP would work (pipeline stages:
    DDP's reducer does not follow torch.distributed.pipelining's per-micro-batch backwards).
    `compression` (planner.executor.compression): hpZ as FSDP2's reshard_after_forward=<int>, PowerSGD and 16-bit
    gradient all-reduces as DDP communication hooks (their byte counter on the wrapper's COMM_COUNTER_ATTR).
    Returns the module to train (the DDP wrapper or `model` itself)."""
    dp_size = dp_mesh.size()
    experts = expert_params(model)
    if experts:
        add_grad_sync(model, _expert_sync(experts, expert_dp_group, dp_size))
    if zero_stage in (2, 3):
        from torch.distributed.fsdp import fully_shard

        ignored = set(experts)
        reshard = compressed.reshard_after_forward(zero_stage, compression, dp_mesh.size(-1))
        kwargs = {"mesh": dp_mesh, "reshard_after_forward": reshard}
        if (policy := mp_policy(precision)) is not None:
            kwargs["mp_policy"] = policy
        for _, block in blocks(model):
            fully_shard(block, ignored_params=ignored & set(block.parameters()) or None, **kwargs)
        fully_shard(model, ignored_params=ignored or None, **kwargs)
        return model
    if zero_stage not in (0, 1):
        raise BadInputError(f"zero_stage={zero_stage} is unknown: choose 0, 1, 2 or 3")
    if dp_size == 1:
        return model
    if not use_ddp or dp_mesh.ndim > 1 or any(isinstance(p, DTensor) for p in model.parameters()):
        dense = [p for p in _unique_params(model) if all(p is not e for e in experts)]
        add_grad_sync(model, _all_reduce_mean(dense, _flat_group(dp_mesh), dp_size))
        return model
    from torch.nn.parallel import DistributedDataParallel

    if experts:
        names = [n for n, p in model.named_parameters() if any(p is e for e in experts)]
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, names)
    ddp = DistributedDataParallel(model, process_group=dp_mesh.get_group())
    setattr(ddp, GRAD_SYNC_ATTR, getattr(model, GRAD_SYNC_ATTR, []))
    setattr(ddp, COMM_COUNTER_ATTR, compressed.register_ddp_hooks(ddp, compression, dp_mesh.get_group()))
    return ddp


def _flat_group(mesh: DeviceMesh) -> dist.ProcessGroup:
    return mesh.get_group() if mesh.ndim == 1 else mesh._flatten().get_group()


def _unique_params(model: nn.Module) -> list[nn.Parameter]:
    return list({id(p): p for p in model.parameters() if p.requires_grad}.values())


def _expert_sync(params: list[nn.Parameter], group, dp_size: int) -> Callable[[nn.Module], None]:
    """Expert grads: every ep rank's tokens already reached them through the all-to-all backward; sum over
    the replicas of the same experts, then divide by dp so the step uses the mean loss over dp ranks."""
    def sync(_model: nn.Module) -> None:
        for p in params:
            if p.grad is None:
                continue
            if group is not None and dist.get_world_size(group) > 1:
                dist.all_reduce(p.grad, group=group)
            p.grad.div_(dp_size)
    return sync


def _all_reduce_mean(params: list[nn.Parameter], group, dp_size: int) -> Callable[[nn.Module], None]:
    def sync(_model: nn.Module) -> None:
        for p in params:
            if p.grad is None:
                continue
            grad = p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad
            dist.all_reduce(grad, group=group)
            grad.div_(dp_size)
    return sync


def add_grad_sync(model: nn.Module, fn: Callable[[nn.Module], None]) -> None:
    """Register `fn(model)` to run in `sync_gradients` (after the step's last backward); used by apply_dp, apply_ep
    and domino's manual TP for the reductions no wrapper does."""
    hooks = getattr(model, GRAD_SYNC_ATTR, None)
    if hooks is None:
        hooks = []
        setattr(model, GRAD_SYNC_ATTR, hooks)
    hooks.append(fn)


def sync_gradients(model: nn.Module) -> None:
    """Run the gradient reductions registered by apply_dp/apply_ep (once per step, after the last backward)."""
    for fn in getattr(model, GRAD_SYNC_ATTR, []):
        fn(model)


# ------------------------------------------------------------------------------------------ optimizer
class CombinedOptimizer:
    """Several optimizers stepped together (ZeRO-1 over dense params + plain AdamW over EP experts)."""

    def __init__(self, optimizers: list[torch.optim.Optimizer]):
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict]:
        return [g for opt in self.optimizers for g in opt.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()


def adamw_impl(params: list[nn.Parameter], *, on_cuda: bool) -> dict:
    """torch.optim.AdamW's implementation kwargs: fused=True on CUDA (one kernel for the whole step), unless the
    parameters mix DTensors and plain tensors (TP without FSDP2 leaves the norms plain): DTensor's dispatcher refuses
    a multi-tensor op over such a list ("aten._fused_adamw_.default got mixed torch.Tensor and DTensor", and the same
    for foreach's aten._foreach_mul_; measured with torch 2.13 on CPU tensors, the dispatch is device-independent),
    so those run torch's per-tensor loop (foreach=False). On CPU: torch's default. planner.executor.memtrace asks
    the same question for its CUDA stand-in."""
    if not on_cuda:
        return {}
    if len({isinstance(p, DTensor) for p in params}) > 1:
        return {"foreach": False}
    return {"fused": True}


def build_optimizer(model: nn.Module, *, zero_stage: int, dp_group: dist.ProcessGroup | None = None,
                    lr: float = 1e-3, optimizer: str = "adamw", betas: tuple[float, float] = (0.9, 0.95),
                    weight_decay: float = 0.0, eps: float = 1e-8, precision: str = "fp32"):
    """AdamW (Loshchilov & Hutter 2019), or plain SGD (`optimizer="sgd"`: its update is proportional to the
    gradient, so tests catch gradient-scale errors that Adam's normalisation hides). ZeRO-1 shards the
    optimizer state over `dp_group` with ZeroRedundancyOptimizer, or with planner.executor.zero1 when TP made the
    parameters DTensors or the recipe keeps fp32 masters (EP experts, different on each rank, keep a local
    optimizer). precision "bf16" (and "fp8"): the optimizer steps fp32 master copies (planner.executor.precision)."""
    from planner.executor.precision import MASTER_RECIPES, check_precision, master_weight_class

    check_precision(precision)
    if optimizer == "adamw":
        cls, kwargs = torch.optim.AdamW, {"lr": lr, "betas": betas, "weight_decay": weight_decay, "eps": eps}
        kwargs.update(adamw_impl(list(model.parameters()), on_cuda=any(p.is_cuda for p in model.parameters())))
    elif optimizer == "sgd":
        cls, kwargs = torch.optim.SGD, {"lr": lr, "weight_decay": weight_decay}
    else:
        raise BadInputError(f"optimizer={optimizer!r} is unknown: choose adamw or sgd")
    masters = precision in MASTER_RECIPES
    if masters:
        cls = master_weight_class(cls)
    params = _unique_params(model)
    if zero_stage != 1 or dp_group is None or dist.get_world_size(dp_group) == 1:
        return cls(params, **kwargs)
    from torch.distributed.optim import ZeroRedundancyOptimizer

    experts = expert_params(model)
    dense = [p for p in params if all(p is not e for e in experts)]
    if masters or any(isinstance(p, DTensor) for p in dense):  # ZeroRedundancyOptimizer: plain tensors, its own state
        from planner.executor.zero1 import ShardedStateOptimizer

        zero = ShardedStateOptimizer(dense, cls, process_group=dp_group, **kwargs)
    else:
        zero = ZeroRedundancyOptimizer(dense, optimizer_class=cls, process_group=dp_group, **kwargs)
    return CombinedOptimizer([zero, cls(experts, **kwargs)]) if experts else zero
