"""How a reference decoder block's layers shard under tensor parallelism: the torch.distributed.tensor plan
that the executor applies (planner.executor.parallelize.apply_tp) and the DTensor layer profiler times
(planner.profiling.measure_dtensor).

A module of its own, next to the model it describes, so that both take the one plan from here: profiling sits
above the cost model and must not import the executor. Describing the shards is all it does; applying them,
and every other parallelism, stays in planner.executor.
"""

from __future__ import annotations

from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    RowwiseParallel,
    SequenceParallel,
)

from planner.nn.model import TransformerBlock


def block_tp_plan(block: TransformerBlock, *, sp: bool) -> dict:
    """parallelize_module's plan for one decoder block: Megatron column-parallel wq/wk/wv/w1/w3 and row-parallel
    wo/w2 (Shoeybi et al. 2019, sec. 3), per-head q/k norms on the sharded heads, and with `sp` the norms and
    residual stream sharded along the sequence (Korthikanti et al. 2022, sec. 4.2); MoE stays replicated."""
    seq_layout = Shard(1) if sp else Replicate()
    plan: dict = {
        "attention.wq": ColwiseParallel(),
        "attention.wk": ColwiseParallel(),
        "attention.wv": ColwiseParallel(),
        "attention.wo": RowwiseParallel(output_layouts=seq_layout),
    }
    if block.attention.q_norm is not None:  # per-head norms: heads are the sharded dim (torchtitan, Qwen3)
        plan["attention.q_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
        plan["attention.k_norm"] = SequenceParallel(sequence_dim=2, use_local_output=True)
    # The block's input becomes one Replicate DTensor that wq/wk/wv (w1/w3) share: their input gradients add up
    # as Partial and are reduced once (all-reduce, or reduce-scatter with SP) where the DTensor was made, as in
    # Megatron's fused QKV / gate-up projections; per-linear inputs would all-reduce 3 (2) times.
    plan["attention"] = PrepareModuleInput(input_layouts=(seq_layout, None), desired_input_layouts=(Replicate(), None))
    if sp:
        plan["attention_norm"] = SequenceParallel()
        plan["ffn_norm"] = SequenceParallel()
    if block.feed_forward is not None:
        plan["feed_forward.w1"] = ColwiseParallel()
        plan["feed_forward.w2"] = RowwiseParallel(output_layouts=seq_layout)
        if block.feed_forward.w3 is not None:
            plan["feed_forward.w3"] = ColwiseParallel()
        plan["feed_forward"] = PrepareModuleInput(input_layouts=(seq_layout,), desired_input_layouts=(Replicate(),))
    elif sp:  # MoE replicated over tp: gather the sequence in, keep this rank's slice out
        plan["moe"] = PrepareModuleInputOutput(
            input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),), use_local_input=True,
            output_layouts=(Replicate(),), desired_output_layouts=(Shard(1),), use_local_output=True,
        )
    return plan
