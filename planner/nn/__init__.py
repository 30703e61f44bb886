"""The executor's reference model: a plain-torch decoder (dense and MoE), kept apart from parallelism.

Imports torch: never import this package from planning code (`import planner` stays torch-free).
"""

from planner.nn.model import Attention, AttentionCore, FeedForward, Transformer, TransformerBlock, count_parameters, keep_only
from planner.nn.moe import MoE, shard_experts

__all__ = [
    "Attention", "AttentionCore", "FeedForward", "MoE", "Transformer", "TransformerBlock", "count_parameters", "keep_only", "shard_experts",
]
