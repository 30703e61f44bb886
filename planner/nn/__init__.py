"""The executor's reference model: a plain-torch decoder (dense and MoE), kept apart from parallelism.

Imports torch: never import this package from planning code (`import planner` stays torch-free).
`tensor_parallel` only describes how a block's layers shard (the plan the executor applies and the DTensor
profiler times); applying any parallelism is planner.executor's.
"""

from planner.nn.common import FeedForward
from planner.nn.model import Attention, AttentionCore, Transformer, TransformerBlock, count_parameters, keep_only
from planner.nn.moe import MoE, shard_experts

__all__ = [
    "Attention", "AttentionCore", "FeedForward", "MoE", "Transformer", "TransformerBlock", "count_parameters", "keep_only", "shard_experts",
]
