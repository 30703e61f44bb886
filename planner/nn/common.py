"""What the dense decoder block (model.py) and the MoE layer (moe.py) share: the divisibility check of a sharded
dimension, the MLP activations and the dense MLP (MoE's shared experts are one).

A module of its own so that the dependency runs one way: model.py builds MoE layers (it imports moe.py), and
moe.py imports these pieces from here, not from model.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from planner.errors import BadInputError


def activation_fn(name: str):
    """The elementwise part of the MLP: gelu/relu, or the gate nonlinearity of swiglu (SiLU) / geglu (GELU)."""
    return {"gelu": F.gelu, "geglu": F.gelu, "relu": F.relu, "swiglu": F.silu}[name]


class FeedForward(nn.Module):
    """Dense MLP: w2(act(w1 x)) or, gated (Shazeer 2020, GLU variants), w2(act(w1 x) * w3 x)."""

    def __init__(self, dim: int, hidden: int, *, activation: str, bias: bool, dtype: torch.dtype | None = None):
        super().__init__()
        self.activation = activation
        self.w1 = nn.Linear(dim, hidden, bias=bias, dtype=dtype)
        self.w2 = nn.Linear(hidden, dim, bias=bias, dtype=dtype)
        self.w3 = nn.Linear(dim, hidden, bias=bias, dtype=dtype) if activation in ("swiglu", "geglu") else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(self.hidden(x))

    def hidden(self, x: torch.Tensor) -> torch.Tensor:
        h = activation_fn(self.activation)(self.w1(x))
        return h * self.w3(x) if self.w3 is not None else h


def check_divisible(name: str, value: int, by_name: str, by: int) -> None:
    """BadInputError unless the parallel degree `by_name`=`by` divides the dimension it shards (`name`=`value`),
    naming the degrees that would."""
    if value % by:
        choices = [d for d in range(1, value + 1) if value % d == 0]
        raise BadInputError(f"{by_name}={by} must divide {name}={value}: choose {by_name} in {choices}")

