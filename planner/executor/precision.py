"""The executor's precision recipes: what each of the `planner` profile's precisions holds and computes in.

- "fp32": fp32 parameters, gradients and Adam state; no autocast. 4 + 4 + 8 = 16 bytes per parameter.
- "amp-bf16": fp32 parameters, gradients and Adam state, forward under torch.autocast(bf16) (matmuls in bf16,
  norms and the residual stream in fp32); autocast's bf16 copies of the weights live from their first use in
  forward until that layer's backward (planner/cost/autocast.py). 4 (+2 cast copies) + 4 + 8. FSDP2 gathers the
  fp32 parameters (no MixedPrecisionPolicy).
- "bf16": bf16 parameters and bf16 gradients, an fp32 master copy of every parameter and fp32 Adam moments held by
  the optimizer (`MasterWeightOptimizer`); no autocast. 2 + 2 + (4 + 8) = 16 bytes per parameter, the 12 of the
  optimizer sharded by ZeRO-1 like the states. This is Megatron-LM's `--bf16 --grad-reduce-in-bf16`: its
  Float16OptimizerWithFloat16Params (NVIDIA/Megatron-LM megatron/core/optimizer/optimizer.py at 71371b4) keeps
  `fp32_from_float16_groups`, fp32 clones of the bf16 model parameters; `_copy_model_grads_to_main_grads` sets
  main_param.grad = model_param.grad.float(); after the inner step `_copy_main_params_to_model_params` writes the
  bf16 parameters back. Megatron's plain `--bf16` instead accumulates and reduces gradients in an fp32 main_grad
  buffer (megatron/training/arguments.py sets accumulate_allreduce_grads_in_fp32 unless --grad-reduce-in-bf16: 4
  bytes per parameter, 18 in all); here gradients stay bf16 and every reduction (DDP buckets, FSDP2 reduce-scatter,
  the explicit all-reduces) runs in bf16. torchtitan's FSDP2 recipe (MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32), torchtitan/models/llama3/infra/parallelize.py apply_fsdp) keeps fp32 sharded parameters as
  the master instead; here FSDP2 shards the bf16 parameters and the master lives in the optimizer, so every path
  (plain, DDP, ZeRO-1/2/3, TP, PP, 2BW, EP) holds the same bytes.
  The step converts the bf16 gradients to fp32 in chunks of at most MASTER_STEP_CHUNK_NUMEL elements (or one
  parameter, if larger), each freed after its update: the step's transient is bounded, not 4 bytes per parameter.
"""

from __future__ import annotations

import torch
from torch import nn

from planner.errors import BadInputError
from planner.executor.zero1 import clear_grads

PRECISIONS = ("fp32", "amp-bf16", "bf16", "fp8")  # fp8: the bf16 recipe with torchao Float8Linear (planner.executor.fp8)
MASTER_RECIPES = ("bf16", "fp8")
MASTER_STEP_CHUNK_NUMEL = 2**26  # 256 MiB of fp32 gradient copies at a time in the bf16 step


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise BadInputError(f"precision={precision!r} is not runnable by the executor: choose fp32, bf16, amp-bf16 or fp8")


def param_dtype(precision: str) -> torch.dtype:
    """The dtype the model's parameters (and gradients) are held in."""
    check_precision(precision)
    return torch.bfloat16 if precision in MASTER_RECIPES else torch.float32


def autocast_dtype(precision: str) -> torch.dtype | None:
    """torch.autocast's dtype for the forward (amp-bf16 only)."""
    check_precision(precision)
    return torch.bfloat16 if precision == "amp-bf16" else None


@torch.no_grad()
def cast_parameters(module: nn.Module, precision: str) -> None:
    """Hold the (fp32-initialised) parameters in the recipe's dtype, in place: the Parameter objects stay (tied
    weights stay tied); buffers (the RoPE table) keep their dtype."""
    dtype = param_dtype(precision)
    for param in {id(p): p for p in module.parameters()}.values():
        if param.dtype != dtype:
            param.data = param.data.to(dtype)


def prepare_module(module: nn.Module, precision: str, device: torch.device) -> None:
    """Before EP/TP/DP: the parameters in the recipe's dtype; for fp8 also torchao's Float8Linear where this rank's
    GPU has fp8 tensor cores (planner.executor.fp8; BadInputError naming the reason elsewhere)."""
    if precision == "fp8":
        from planner.executor.fp8 import apply_fp8, check_fp8

        check_fp8(device)
    cast_parameters(module, precision)
    if precision == "fp8":
        apply_fp8(module)


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


class MasterWeightOptimizer:
    """`optimizer_class` stepping fp32 master copies of low-precision parameters (module docstring).

    `param_groups` and `state` are the inner optimizer's (over the masters), so PipeDream-2BW's state sharing and
    ZeRO-1's wrapper work unchanged; `state_dict` carries the masters (the bf16 parameters alone would lose them)."""

    def __init__(self, params, optimizer_class, **kwargs):
        self.params = list(params)
        with torch.no_grad():
            self.masters = [nn.Parameter(p.detach().float().clone()) for p in self.params]
        self.optim = optimizer_class(self.masters or [nn.Parameter(torch.zeros(0))], **kwargs)

    @property
    def param_groups(self) -> list[dict]:
        return self.optim.param_groups

    @property
    def state(self):
        return self.optim.state

    def share_masters_with(self, other: "MasterWeightOptimizer") -> None:
        """Step `other`'s masters and optimizer from now on (PipeDream-2BW: one logical weight, two bf16 buffers)."""
        if [tuple(m.shape) for m in self.masters] != [tuple(m.shape) for m in other.masters]:
            raise ValueError("2BW versions differ: their master copies have other shapes")
        self.masters, self.optim = other.masters, other.optim

    def zero_grad(self, set_to_none: bool = True) -> None:
        clear_grads(self.params, set_to_none)

    @torch.no_grad()
    def step(self) -> None:
        """master.grad = grad.float() chunk by chunk, the inner step on that chunk, the bf16 parameters rewritten."""
        pending = [(p, m) for p, m in zip(self.params, self.masters) if p.grad is not None]
        while pending:
            chunk, numel = [], 0
            while pending and (not chunk or numel + _local(pending[0][1]).numel() <= MASTER_STEP_CHUNK_NUMEL):
                chunk.append(pending.pop(0))
                numel += _local(chunk[-1][1]).numel()
            for p, m in chunk:
                m.grad, p.grad = p.grad.float(), None
            self.optim.step()
            for p, m in chunk:
                _local(p).copy_(_local(m))
                m.grad = None

    def state_dict(self) -> dict:
        return {"optim": self.optim.state_dict(), "masters": [_local(m).detach().clone() for m in self.masters]}

    @torch.no_grad()
    def load_state_dict(self, state: dict) -> None:
        self.optim.load_state_dict(state["optim"])
        for p, m, saved in zip(self.params, self.masters, state["masters"]):
            _local(m).copy_(saved)
            _local(p).copy_(saved)


def master_weight_class(optimizer_class):
    """An optimizer class whose instances step fp32 masters of the given parameters (for ZeRO-1's wrapper)."""
    def build(params, **kwargs):
        return MasterWeightOptimizer(params, optimizer_class, **kwargs)
    return build


def share_master_weights(first, second) -> None:
    """PipeDream-2BW: the second version's optimizer steps the first's masters (no-op for other optimizers)."""
    if isinstance(first, MasterWeightOptimizer) and isinstance(second, MasterWeightOptimizer):
        second.share_masters_with(first)


def held_bytes(parameters: list[nn.Parameter], optimizer) -> dict[str, int]:
    """Bytes this rank holds for parameters, their gradients and the optimizer (masters and states), counted from
    the tensors (local shards; tied parameters once): what tests compare with the cost model's bytes per parameter."""
    params = list({id(p): p for p in parameters}.values())
    weights = sum(_local(p).numel() * _local(p).element_size() for p in params)
    grads = sum(_local(p.grad).numel() * _local(p.grad).element_size() for p in params if p.grad is not None)
    inner = getattr(optimizer, "optim", optimizer)
    masters = getattr(inner, "masters", None) or getattr(optimizer, "masters", None) or []
    states = getattr(inner, "optim", inner).state
    state_bytes = sum(_local(v).numel() * _local(v).element_size() for s in states.values() for v in s.values()
                      if torch.is_tensor(v) and _local(v).dim() > 0)
    master_bytes = sum(_local(m).numel() * _local(m).element_size() for m in masters)
    return {"weights": weights, "grads": grads, "masters": master_bytes, "optimizer_states": state_bytes}
