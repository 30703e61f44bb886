"""Per-operator records: each operator run alone on the inputs it received inside the layer.

One instrumented forward of the layer captures, with forward pre-hooks, the arguments each operator's
submodules were called with. Each operator is then re-run in isolation on detached copies of those inputs
(leaves that require grad exactly where the originals did; inputs shared between submodules stay shared,
e.g. the normed hidden state read by wq, wk and wv), and measured like a layer: forward/backward time,
FLOPs in separate forward and backward counters, saved and output bytes. Running operators alone gives
clean attribution, which module hooks during a whole-layer backward do not (autograd interleaves sibling
GEMMs, and FlopCounterMode then credits backward FLOPs to siblings).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from planner.profiling.measure_layers import LayerCase, OpSpec
from planner.profiling.measure_timing import (
    SavedTensorLog,
    autocast_context,
    constant_keys,
    count_flops,
    tensor_bytes,
    time_forward_backward,
)
from planner.schemas.profile import OpRecord

Captured = dict[str, tuple[tuple[Any, ...], dict[str, Any]]]


def capture_op_inputs(case: LayerCase, *, amp_dtype: torch.dtype | None) -> Captured:
    """Arguments of every operator submodule, from one forward of the whole layer (first call of each)."""
    paths = {path for op in case.ops for path in op.modules}
    captured: Captured = {}
    handles = []
    for path in paths:
        def grab(_mod, args, kwargs, *, _path=path):
            captured.setdefault(_path, (args, kwargs))
        handles.append(case.module.get_submodule(path).register_forward_pre_hook(grab, with_kwargs=True))
    try:
        with autocast_context(next(iter(case.module.parameters())).device, amp_dtype):
            case.apply(case.make_inputs())
    finally:
        for handle in handles:
            handle.remove()
    return captured


def _leaf_copies(value: Any, memo: dict[int, torch.Tensor]) -> Any:
    """Detached copies of every tensor in `value` (shared tensors stay shared), grad where the original had it."""
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            copy = value.detach().clone()
            memo[id(value)] = copy.requires_grad_(value.requires_grad and value.is_floating_point())
        return memo[id(value)]
    if isinstance(value, (tuple, list)):
        return type(value)(_leaf_copies(v, memo) for v in value)
    if isinstance(value, dict):
        return {k: _leaf_copies(v, memo) for k, v in value.items()}
    return value


def _tensors(value: Any) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors(v)]
    return []


def _op_step(case: LayerCase, op: OpSpec, captured: Captured, amp_dtype: torch.dtype | None, memo: dict):
    modules = [case.module.get_submodule(path) for path in op.modules]
    calls = [(m, _leaf_copies(captured[path], memo)) for m, path in zip(modules, op.modules) if path in captured]
    device = next(iter(case.module.parameters())).device

    def step() -> Sequence[torch.Tensor]:
        outputs: list[torch.Tensor] = []
        with autocast_context(device, amp_dtype):
            for module, (args, kwargs) in calls:
                outputs += [t for t in _tensors(module(*args, **kwargs)) if t.is_floating_point()]
        return outputs

    return step, calls, modules


def _saved_and_output_bytes(step, exclude) -> tuple[int, int]:
    log = SavedTensorLog(exclude)
    with log.recording():
        outputs = step()
    return log.total_bytes(), tensor_bytes(outputs)


def measure_op(case: LayerCase, op: OpSpec, captured: Captured, *, amp_dtype: torch.dtype | None,
               warmup: int, repeats: int, clock: str = "wall") -> OpRecord | None:
    """One operator alone; None when none of its submodules ran in the layer's forward."""
    memo: dict[int, torch.Tensor] = {}
    step, calls, modules = _op_step(case, op, captured, amp_dtype, memo)
    if not calls:
        return None
    device = next(iter(case.module.parameters())).device
    timing = time_forward_backward(step, device=device, warmup=warmup, repeats=repeats, clock=clock)
    forward_flops, backward_flops = count_flops(step)
    saved, output = _saved_and_output_bytes(step, constant_keys(modules, case.constants))
    params = {id(p): p for m in modules for p in m.parameters()}
    return OpRecord(
        name=op.name, forward_s=timing.forward_s, backward_s=timing.backward_s,
        forward_flops=forward_flops, backward_flops=backward_flops,
        params_bytes=sum(p.numel() * p.element_size() for p in params.values()),
        saved_bytes=saved, output_bytes=output,
    )


def other_record(layer_forward_s: float, layer_backward_s: float, layer_flops: tuple[float, float],
                 ops: Sequence[OpRecord]) -> OpRecord:
    """What the layer spends outside its operator modules (RoPE, residuals, activations, reshapes)."""
    return OpRecord(
        name="other",
        forward_s=max(0.0, layer_forward_s - sum(o.forward_s for o in ops)),
        backward_s=max(0.0, layer_backward_s - sum(o.backward_s for o in ops)),
        forward_flops=max(0.0, layer_flops[0] - sum(o.forward_flops for o in ops)),
        backward_flops=max(0.0, layer_flops[1] - sum(o.backward_flops for o in ops)),
        params_bytes=0, saved_bytes=0, output_bytes=0,
    )


def measure_ops(case: LayerCase, *, amp_dtype: torch.dtype | None, warmup: int, repeats: int, clock: str = "wall",
                layer_times: tuple[float, float], layer_flops: tuple[float, float]) -> tuple[OpRecord, ...]:
    """Every operator of the layer, then `other` (layer minus operators)."""
    captured = capture_op_inputs(case, amp_dtype=amp_dtype)
    records = []
    for op in case.ops:
        record = measure_op(case, op, captured, amp_dtype=amp_dtype, warmup=warmup, repeats=repeats, clock=clock)
        if record is not None:
            records.append(record)
    case.module.zero_grad(set_to_none=True)
    return (*records, other_record(*layer_times, layer_flops, records))


def params_bytes(module: nn.Module) -> int:
    """Bytes of the module's distinct parameters."""
    unique = {id(p): p for p in module.parameters()}
    return sum(p.numel() * p.element_size() for p in unique.values())
