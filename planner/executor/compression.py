"""The plan's communication compression, executed (planner.schemas.compression; priced by planner.cost.compression).

- PowerSGD and 16-bit gradient all-reduces: torch's DDP communication hooks on the DDP module of ZeRO-0/1 with
  pp = 1 (`torch.distributed.algorithms.ddp_comm_hooks`: powerSGD_hook with a PowerSGDState, bf16_compress_hook,
  fp16_compress_hook). Pipeline stages reduce gradients without DDP (parallelize.apply_dp), so there the framework
  profile refuses them.
- hpZ: FSDP2's `fully_shard(reshard_after_forward=<int>)` reshards the parameters after forward to that smaller
  world (torch/distributed/fsdp/_fully_shard/_fully_shard.py), so the backward all-gather stays within it: ZeRO++'s
  secondary partition (Wang et al. 2023, Sec. 3.2).
- qwZ, qgZ and fp8 dispatch have no torch implementation the executor could call: the `planner` profile does not
  list them, so plans for it never carry them (planner.frameworks.compression_refusal, which `planner run` asks
  before it starts).

Every hook is wrapped by `counting_hook`, which adds up the bytes each step hands to the all-reduce (PowerSGD: the
elements torch's own powerSGD_hook decides to send, PowerSGDState.total_numel_after_compression; 16-bit hooks: the
bucket in 2 bytes), so a run measures what the cost model predicts it sends.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

from planner.errors import BadInputError
from planner.schemas.compression import Compression

# torch's PowerSGDState needs start_powerSGD_iter > 1 with error feedback (it counts iterations from 0): the first
# iterations all-reduce uncompressed, as Vogels et al. warm up; the executor starts compressing at the second.
POWERSGD_START_ITER = 2


@dataclass
class CommCounter:
    """Bytes handed to the gradient all-reduce, per DDP iteration (one entry per optimizer step's backward)."""

    per_iteration: list[float] = field(default_factory=list)
    current: float = 0.0

    def add(self, num_bytes: float, last_bucket: bool) -> None:
        self.current += num_bytes
        if last_bucket:
            self.per_iteration.append(self.current)
            self.current = 0.0


def counting_hook(compression: Compression, group: dist.ProcessGroup, counter: CommCounter):
    """A DDP communication hook (a plain function: DDP logs its __name__ and rejects string annotations) that runs
    the plan's compression on each bucket and adds the bytes it hands to the all-reduce to `counter`."""
    state = None
    if compression.has("powersgd"):
        state = powerSGD_hook.PowerSGDState(
            process_group=group, matrix_approximation_rank=compression.powersgd_rank,
            start_powerSGD_iter=POWERSGD_START_ITER, use_error_feedback=True, warm_start=True)
    inner = default_hooks.bf16_compress_hook if compression.has("bf16-grads") else default_hooks.fp16_compress_hook

    def planner_compression_hook(_state, bucket):
        if state is None:
            counter.add(bucket.buffer().numel() * 2, bucket.is_last())
            return inner(group, bucket)
        before, started = state.total_numel_after_compression, state.iter >= state.start_powerSGD_iter
        future = powerSGD_hook.powerSGD_hook(state, bucket)
        sent = state.total_numel_after_compression - before if started else bucket.buffer().numel()
        counter.add(sent * bucket.buffer().element_size(), bucket.is_last())
        return future

    return planner_compression_hook


def register_ddp_hooks(ddp, compression: Compression, group: dist.ProcessGroup) -> CommCounter | None:
    """Register the plan's gradient compression on a DDP module; the counter of its bytes (None: no hook)."""
    if not any(compression.has(m) for m in ("powersgd", "bf16-grads", "fp16-grads")):
        return None
    counter = CommCounter()
    ddp.register_comm_hook(None, counting_hook(compression, group, counter))
    return counter


def reshard_after_forward(zero_stage: int, compression: Compression, dp_shard: int) -> bool | int:
    """FSDP2's reshard_after_forward: ZeRO-3 True, ZeRO-2 False, ZeRO-3 with hpZ the secondary partition's size
    (FSDP2 takes a non-trivial divisor of the shard group; a partition of the whole group is plain ZeRO-3, one of a
    single rank keeps the whole gathered copy, ZeRO-2's False)."""
    if zero_stage != 3 or not compression.has("hpz"):
        return zero_stage == 3
    size = min(compression.hpz_partition_size, dp_shard)
    if dp_shard % size:
        raise BadInputError(f"hpz_partition_size={compression.hpz_partition_size} must divide the data-parallel shard "
                            f"group of {dp_shard} ranks: choose hpz:{dp_shard} or a divisor of it")
    if size == dp_shard:
        return True
    return False if size == 1 else size

