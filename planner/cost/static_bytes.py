"""A module's static bytes on one GPU: its weights, gradients and optimizer state as the candidate's ZeRO stage,
schedule and the stack's recipe hold them (read by planner.cost.arrays and the search's bounds)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import grad_accumulation, memory
from planner.schedules import schedule as schedule_of

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import Candidate


def static_parts(model: "CostModel", cand: "Candidate", dense: np.ndarray, expert: np.ndarray) -> tuple[np.ndarray, ...]:
    """(weights, grads, optimizer) bytes per module: dense parameters shard over dp*cp ranks under ZeRO (HSDP: the
    dp*cp/dp_replicate ranks of a shard group, Candidate.zero_shard), routed experts over their dp*cp/ep
    expert-data-parallel ranks. PipeDream-2BW keeps a second weight version.
    FSDP2 with more than one micro-batch (options.fsdp_grads_unsharded_across_microbatches, ZeRO-2/3) reduce-scatters
    only after the step's last micro-batch, so the rank holds its unsharded gradients (FSDP2's param dtype, the
    recipe's gather bytes) beside the sharded ones: torch 2.13 torch/distributed/pipelining/stage.py lines 844-847
    (set_requires_gradient_sync(False) for every backward, set back by perform_reduce_grad, lines 1164-1177) with
    pp > 1, planner/executor/runtime.py _set_grad_sync (the executor's own micro-batch loop) with pp = 1. The gathered
    parameters stage.py keeps (set_reshard_after_backward(False)) are not priced: the trace of the executor's step
    shows no such term (benchmarks/results/executor_memory_vs_trace.txt).
    A stack whose ZeRO-3 gradient partition is 16-bit (options.zero3_grads_fp32 False) holds 2 bytes per
    parameter there; its optimizer step's fp32 copies are checked by evaluate (the step peak). A 16-bit gradient
    method whose stack keeps its gradient buffer in that dtype (options.grad16_buffer_bytes: Megatron's
    --grad-reduce-in-bf16) holds that many bytes per parameter. At ZeRO-0/1 the stack's gradient accumulation path
    (behaviour.grad_accumulation) says what its optimizer holds (grad_accumulation.held_bytes): DeepSpeed's
    BF16_Optimizer 2 + 4 (and its fp32 states partitioned over dp even at ZeRO-0), its ZeRO optimizer and
    FP16_Optimizer the 16-bit .grad only."""
    recipe, zero = model.recipe, cand.zero_stage
    if zero >= 3 and not model.options.zero3_grads_fp32:  # the 16-bit gradient partition (DeepSpeed stage 3)
        recipe = dataclasses.replace(recipe, grad_bytes=min(recipe.grad_bytes, recipe.gather_bytes))
    held = grad_accumulation.held_bytes(model, cand)
    if held.grad_bytes is not None and zero < 2:  # the accumulation path's own gradient copies
        recipe = dataclasses.replace(recipe, grad_bytes=held.grad_bytes)
    buffer16 = model.options.grad16_buffer_bytes
    if buffer16 and (cand.compression.has("bf16-grads") or cand.compression.has("fp16-grads")):
        recipe = dataclasses.replace(recipe, grad_bytes=min(recipe.grad_bytes, buffer16))  # --grad-reduce-in-bf16
    split_zero = max(zero, 1) if held.shards_optimizer else zero  # ZeRO-0 and 1 differ only in the optimizer's share
    d = memory.static_split(dense, recipe, zero_stage=split_zero, dp=cand.zero_shard)
    e = memory.static_split(expert, recipe, zero_stage=split_zero, dp=cand.expert_shard)
    weights, grads, optim = (d[i] + e[i] for i in range(3))
    if model.executor_recipe is not None and model.executor_recipe.autocast:
        weights = weights - executor_uncast_bytes(dense, expert, recompute=cand.recompute, zero_stage=zero, dp=cand.zero_shard,
                                                  expert_dp=cand.expert_shard, autocast_under_fsdp=not model.options.bf16_autocast)
    if model.options.fsdp_grads_unsharded_across_microbatches and zero >= 2 and cand.num_microbatches > 1:
        grads = grads + recipe.gather_bytes * (dense + expert)  # FSDP2's unsharded gradients, reduced at the step's end
    versions = schedule_of(cand.schedule).weight_versions
    if versions > 1:
        weights = weights * versions
    return weights, grads, optim


def executor_uncast_bytes(dense: np.ndarray, expert: np.ndarray, *, recompute: str, zero_stage: int, dp: int,
                          expert_dp: int = 1, autocast_under_fsdp: bool = False) -> np.ndarray:
    """Bytes of the 2-byte autocast copies counted among the weights (the recipe's 4 + 2, sharded with them under
    ZeRO-3) less those the executor holds at its peak (planner.cost.executor), per module. Held: one bf16 copy of
    every matmul weight used under autocast, whole (autocast casts the gathered parameter), saved by its linear
    until that layer's backward; not the embedding table (autocast casts matmul inputs only), nor the weights of a
    fully recomputed layer (torch clears the cast cache when the forward leaves autocast and the checkpoint saves
    none of them). autocast_under_fsdp (the executor now: amp-bf16 autocasts on every path, FSDP2 without a
    policy) holds them under ZeRO-2/3 too, whole, so there the held copies can exceed the sharded ones counted
    (a negative result adds them); at c162dfb ZeRO-2/3 ran no autocast at all (FSDP2's bf16 copies are its gathered
    working set, counted by zero3_working_bytes), so none is held."""
    shard = (dp, expert_dp) if zero_stage >= 3 else (1, 1)
    counted = 2 * (dense / shard[0] + expert / shard[1])
    if zero_stage >= 2 and not autocast_under_fsdp:
        return counted
    held = 2 * (dense + expert)
    held[0] = 2 * expert[0]
    if recompute == "full":
        held[1:-1] = 0.0
    return counted - held
