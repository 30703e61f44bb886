"""Time a layer the way the executor runs TP: torch.distributed.tensor (DTensor) parallel styles on a
single-process "fake" process group, so that the timing carries DTensor's per-operator host work (sharding
propagation, redistributions, wrapping and unwrapping) while collectives are no-ops (they are priced from
`planner profile comm`).

`planner profile --tp-runtime dtensor` uses it for every shape with tp > 1: the entry's forward, backward and
recompute times come from this build; FLOPs, parameter and saved bytes, and the per-operator split come from
the plain build at the rank's shape (build_case), whose operators then sum to less than the layer and the
DTensor overhead lands in the `other` operator. The parallel plan is the executor's own (the block plan from
planner.nn.tensor_parallel, which planner.executor.parallelize applies: Megatron column/row-parallel blocks;
vocab-parallel embedding, column-parallel LM head with replicated logits and the loss on the whole
vocabulary, as apply_tp does), without sequence parallelism.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from planner.profiling.measure_layers import LayerCase, build_case
from planner.schemas.model import ModelSpec


def fake_tp_mesh(tp: int):
    """A 1-D DeviceMesh of size `tp` on the fake backend, this process being rank 0 (re-initialised when a
    different size is asked for)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized() and dist.get_world_size() != tp:
        dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=tp)
    return init_device_mesh("cpu", (tp,), mesh_dim_names=("tp",))


def tp_plan(case: LayerCase) -> dict:
    """The executor's TP plan for one profiled layer (non-SP layouts)."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from planner.nn.tensor_parallel import block_tp_plan

    module = case.module
    if case.layer_type == "embedding":
        plan = {"tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())}
        if module.pos_embeddings is not None:
            plan["pos_embeddings"] = RowwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
        return plan
    if case.layer_type == "head":
        return {"output": ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate(), use_local_output=True)}
    return block_tp_plan(module, sp=False)


def dtensor_case(spec: ModelSpec, layer_type: str, *, tp: int, ep: int, microbatch_size: int, seq_len: int,
                 device: torch.device, param_dtype: torch.dtype) -> LayerCase:
    """The whole layer (tp = 1 shapes) parallelised over a fake mesh of `tp` ranks: runs rank 0's share."""
    from torch.distributed.tensor.parallel import parallelize_module

    case = build_case(spec, layer_type, tp=1, ep=ep, microbatch_size=microbatch_size, seq_len=seq_len,
                      device=device, param_dtype=param_dtype)
    parallelize_module(case.module, fake_tp_mesh(tp), tp_plan(case))
    return case
