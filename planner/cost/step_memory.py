"""What the optimizer step adds to a rank's static bytes: the fp32 gradient copies of a ZeRO-3 stack that keeps
16-bit gradient partitions (DeepSpeed), the executor's MasterWeightOptimizer chunks (planner/executor/precision.py)
and foreach AdamW's fp32 sqrt(v) (torch/optim/adam.py). planner.cost.evaluate adds them to the step's peak."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from planner.cost.executor import MASTER_STEP_CHUNK_ELEMENTS, largest_parameter
from planner.cost.memory import reduce_bucket_bytes

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate


def step_extra_bytes(model: "CostModel", cand: "Candidate", row: dict) -> np.ndarray | float:
    """Bytes the optimizer step adds to the static ones when a ZeRO-3 stack keeps 16-bit gradient partitions:
    their fp32 copies, options.zero3_step_fp32_grad_params at a time (DeepSpeed: two sub-groups), beside its
    gradient bucket. 0 otherwise (the step then needs no more than the backward)."""
    o = model.options
    if model.executor_recipe is not None and o.adamw_impl == "foreach":
        return foreach_step_extra_bytes(cand, row)
    if master_step(model):
        return master_step_extra_bytes(model, cand, row)
    if cand.zero_stage < 3 or o.zero3_grads_fp32 or not o.zero3_step_fp32_grad_params:
        return 0.0
    local = row["dense"] / cand.zero_shard + row["expert"] / cand.expert_shard
    return 4 * np.minimum(local, o.zero3_step_fp32_grad_params) + reduce_bucket_bytes(o.zero3_reduce_bucket_params)


def master_step(model: "CostModel") -> bool:
    """The executor's bf16/fp8 step over fp32 masters (planner/executor/precision.py MasterWeightOptimizer): the
    recipe with bf16 parameters (behaviour.executor.bf16_recipe bf16-params)."""
    return (model.executor_recipe is not None and not model.options.bf16_autocast
            and model.request.precision in ("bf16", "fp8"))


def master_step_extra_bytes(model: "CostModel", cand: "Candidate", row: dict) -> np.ndarray:
    """MasterWeightOptimizer.step's fp32 gradient copies (executor.MASTER_STEP_CHUNK_ELEMENTS): 4 bytes x
    min(local elements, max(2**26, the largest local parameter)); the bf16 gradient of a converted parameter is
    dropped (p.grad = None) but stays referenced by DDP's bucket views, so none of it is counted as freed. Local:
    TP shards, FSDP2 (ZeRO-2/3) shards over dp x cp; ZeRO-1 steps whole parameters of its share."""
    edp = cand.expert_shard
    shard = (cand.zero_shard, edp) if cand.zero_stage >= 1 else (1, 1)
    local = row["dense"] / shard[0] + row["expert"] / shard[1]
    largest = largest_parameter(model.spec, ep=cand.ep) / cand.tp / (cand.zero_shard if cand.zero_stage >= 2 else 1)
    return 4 * np.minimum(local, max(MASTER_STEP_CHUNK_ELEMENTS, largest))


def foreach_step_extra_bytes(cand: "Candidate", row: dict) -> np.ndarray:
    """The executor's foreach AdamW step (torch/optim/adam.py _multi_tensor_adam): exp_avg_sq_sqrt =
    torch._foreach_sqrt(exp_avg_sqs) is an fp32 copy of v for every parameter the optimizer steps, alive until the
    final addcdiv_; the autocast bf16 copies counted among the weights are gone by then (freed with the backward)."""
    edp = cand.expert_shard
    held = (cand.zero_shard, edp) if cand.zero_stage >= 3 else (1, 1)
    fp32_weights = 4 * (row["dense"] / held[0] + row["expert"] / held[1])
    return foreach_temp_bytes(cand, row) - np.maximum(0.0, row["weights"] - fp32_weights)


def foreach_temp_bytes(cand: "Candidate", row: dict) -> np.ndarray:
    """foreach AdamW's fp32 sqrt(v): 4 bytes per parameter the optimizer steps on this rank."""
    edp = cand.expert_shard
    shard = (cand.zero_shard, edp) if cand.zero_stage >= 1 else (1, 1)
    return 4 * (row["dense"] / shard[0] + row["expert"] / shard[1])
