"""Gradient accumulation over the micro-batches of a step, where the stack does it outside the weight-gradient GEMM.

A step of m micro-batches sums m weight gradients per parameter. How a stack sums them is a fact of its code
(behaviour.grad_accumulation in its profile), priced here as HBM traffic on every pipeline rank, serial with the
backward on the compute stream:
- fused (0 bytes): Megatron-Core and Megatron-LM since 83b1e42f30 (2022-02-13, "gradient accumulation fusion"):
  the weight-gradient GEMM accumulates into the fp32 main_grad (beta = 1; megatron/core/tensor_parallel/layers.py
  LinearWithGradAccumulationAndAsyncCommunication, Transformer Engine fuse_wgrad_accumulation); fp16 since
  07916bf245 (2022-09-27).
- autograd (2 + 2 + 2 = 6 bytes, micro-batches after the first): torch's AccumulateGrad stores the first gradient
  as .grad and adds each later one in place (read .grad, read the new gradient, write .grad) in the 16-bit dtype:
  DeepSpeed's FP16_Optimizer and ZeRO-1 before BF16_Optimizer, Megatron-LM 2021 in fp16 (no contiguous buffers).
- an fp32 buffer fed by a hook (2 + 4 + 4 = 10 bytes, every micro-batch): Megatron-LM b4bc51b1e7 (2021-03-08,
  "Bfloat with fp32 grad acc") megatron/model/distributed.py param_hook: param.main_grad.add_(param.grad.data),
  then param.grad = None, so the first micro-batch adds into the zeroed buffer too.
- DeepSpeed's BF16_Optimizer (2 + 4 + 4 + 4 + 4 = 18 bytes, every micro-batch): 56c522386 (2022-04-19)
  bf16_optimizer.py update_hp_grads, called after every micro-batch's backward (pipe/engine.py
  _exec_backward_pass; engine.backward via BF16_Optimizer.backward): hp_grad.add_(lp.grad.to(fp32)) reads the
  bf16 gradient (2) and writes its fp32 copy (4), then reads that copy and the fp32 accumulator (4 + 4) and writes
  the accumulator (4); clear_lp_grads sets lp.grad = None before the next backward (56c522386; DeepSpeed HEAD
  zeroes it in place instead, which adds a 2-byte zeroing and autograd's in-place add per micro-batch: not priced).
Which path a DeepSpeed job takes is its engine's choice (deepspeed/runtime/engine.py _do_optimizer_sanity_check):
BF16_Optimizer for bf16 with pipeline stages and no ZeRO, or with ZeRO-1 where grad_accum_dtype is fp32; the ZeRO
optimizer for ZeRO-1 otherwise (gradients reduced at the accumulation boundary only, zero/stage_1_and_2.py), plain
.grad for bf16 without both. The planner's own executor is not priced here: planner.cost.executor counts its
AccumulateGrad adds from its code (validation/h100_executor_runs.json measures it).
Memory (held_bytes): each path also says which gradient copies its optimizer keeps through the backward, in place of
the recipe's 4-byte main gradients at ZeRO-0/1 (BF16_Optimizer: its full-size fp32 accumulator and the bf16 lp
grads, 6; DeepSpeed's ZeRO and FP16 optimizers and Megatron-LM's fp16 optimizer: the 16-bit .grad, 2, the fp32 ones
made in the step), the contiguous gradient bucket its optimizer allocates for each backward (DeepSpeed ZeRO-1:
reduce_bucket_size 16-bit elements), counted with the rank's other bytes, and whether it partitions the fp32 master
weights and moments over the data-parallel ranks even at ZeRO-0 (BF16_Optimizer: fp32_groups_flat_partition).
The gradients summed are the parameters a rank holds whole: its stage's dense and expert parameters (ZeRO-0/1 keep
the gradients unsharded); ZeRO-2/3 stacks reduce-scatter every micro-batch instead (priced as communication), so
the paths name the ZeRO stages (and pipelines) they run at.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from planner.cost import memory

if TYPE_CHECKING:
    from planner.cost.model import CostModel
    from planner.cost.types import AccumulationEntry, Candidate


def path_for(paths: tuple["AccumulationEntry", ...], cand: "Candidate") -> "AccumulationEntry | None":
    """The first of the stack's paths (CostOptions.grad_accum_paths) that runs at the candidate's ZeRO stage and
    pipeline, or None."""
    for path in paths:
        if cand.zero_stage in path.zero_stages and (path.pipeline is None or path.pipeline == (cand.pp > 1)):
            return path
    return None


@dataclass(frozen=True)
class Held:
    """What the candidate's path's optimizer holds (held_bytes)."""

    grad_bytes: float | None = None  # gradient bytes per parameter in place of the recipe's; None: the recipe's
    bucket_bytes: float = 0.0  # its contiguous 16-bit gradient bucket(s), memory.reduce_bucket_bytes
    shards_optimizer: bool = False  # fp32 master weights and moments over the dp ranks even at ZeRO-0


def held_bytes(model: "CostModel", cand: "Candidate") -> Held:
    """What the candidate's accumulation path holds through the backward (Held); Held() where no path runs or with
    options.grad_accum_memory off."""
    found = path_for(model.options.grad_accum_paths, cand) if model.options.grad_accum_memory else None
    if found is None:
        return Held()
    return Held(grad_bytes=found.grad_bytes, bucket_bytes=memory.reduce_bucket_bytes(found.bucket_params),
                shards_optimizer=found.shards_optimizer)


def per_microbatch_s(model: "CostModel", cand: "Candidate", row: dict) -> np.ndarray:
    """Seconds each pipeline rank spends per micro-batch (averaged over the step's m) summing its gradients outside
    the GEMMs: bytes per element x the rank's parameters / achieved HBM bandwidth, x (m - 1) / m where the first
    micro-batch's gradient is stored; zeros where the stack fuses it or shards the gradients."""
    params = row["dense"] + row["expert"]
    found = path_for(model.options.grad_accum_paths, cand)
    if found is None or not found.bytes_per_element:
        return np.zeros_like(params)
    m = cand.num_microbatches
    share = 1.0 if found.every_microbatch else (m - 1) / m
    return share * found.bytes_per_element * params / model.hbm_rate_Bps
