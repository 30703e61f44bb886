"""Communication compression as a plan dimension: which collectives move fewer bytes, and how.

The methods (each a stack's own feature; `frameworks/*.yaml` capabilities.compression says which stack runs which):
- `qwz`: ZeRO++ quantized weights: the ZeRO-3 parameter all-gather moves int8 blocks with one fp32 scale per
  block instead of 16-bit values (Wang et al. 2023, "ZeRO++: Extremely Efficient Collective Communication for Giant
  Model Training", arXiv:2306.10209, Sec. 3.1; DeepSpeed `zero_quantized_weights`).
- `hpz`: ZeRO++ hierarchical partitioning: a secondary copy of the 16-bit weights partitioned over
  `hpz_partition_size` ranks (a node), so the backward all-gather stays inside the node (Sec. 3.2; DeepSpeed
  `zero_hpz_partition_size`; torch FSDP2 `fully_shard(reshard_after_forward=<int>)` reshards to that smaller world).
- `qgz`: ZeRO++ quantized gradients: the gradient reduce-scatter becomes an int4 hierarchical all-to-all, inside the
  node then across nodes (Sec. 3.3; DeepSpeed `zero_quantized_gradients`).
- `powersgd`: rank-r PowerSGD of each gradient matrix with error feedback (Vogels et al. 2019, "PowerSGD: Practical
  Low-Rank Gradient Compression for Distributed Optimization", Algorithm 1; torch's DDP communication hook
  `torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook`).
- `bf16-grads` / `fp16-grads`: gradients cast to 16 bits for the all-reduce and back (torch's
  `default_hooks.bf16_compress_hook` / `fp16_compress_hook`; Megatron-Core `--grad-reduce-in-bf16`; torchtitan
  `mixed_precision_reduce = "bfloat16"`; DeepSpeed `communication_data_type`).
- `fp8-dispatch`: MoE dispatch in fp8 with one fp32 scale per 128 values, the combine in bf16 (DeepSeek-V3 technical
  report, arXiv:2412.19437, Sec. 3.3.2: "we quantize the activation before MoE up-projections into FP8 and then apply
  dispatch components"; the same for the activation gradient before the down-projection).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from planner.schemas.base import Schema
from planner.schemas import limits as L

CompressionMethod = Literal["qwz", "hpz", "qgz", "powersgd", "bf16-grads", "fp16-grads", "fp8-dispatch"]
METHODS: tuple[str, ...] = ("qwz", "hpz", "qgz", "powersgd", "bf16-grads", "fp16-grads", "fp8-dispatch")
GRADIENT_METHODS = ("qgz", "powersgd", "bf16-grads", "fp16-grads")  # at most one: each replaces the gradient reduction
ZEROPP = ("qwz", "hpz", "qgz")
MAX_POWERSGD_RANK = 1024


class Compression(Schema):
    """The compression of one plan: its methods (sorted, each once) and their parameters. Empty = none."""

    methods: tuple[CompressionMethod, ...] = ()
    powersgd_rank: int = Field(default=0, ge=0, le=MAX_POWERSGD_RANK,
                               description="the rank r of PowerSGD's P (n x r) and Q (m x r) factors; with powersgd only")
    hpz_partition_size: int = Field(default=0, ge=0, le=L.MAX_GPUS_PER_NODE, description=(
        "ranks holding hpZ's secondary weight partition (a node's data-parallel ranks); with hpz only"))

    @model_validator(mode="after")
    def _check(self) -> "Compression":
        if list(self.methods) != sorted(set(self.methods), key=METHODS.index):
            raise ValueError(f"methods={list(self.methods)}: name each method once, in the order {list(METHODS)}")
        grads = [m for m in self.methods if m in GRADIENT_METHODS]
        if len(grads) > 1:
            raise ValueError(f"methods={list(self.methods)}: {' and '.join(grads)} each replace the gradient "
                             f"reduction; choose one")
        if ("powersgd" in self.methods) != (self.powersgd_rank > 0):
            raise ValueError(f"powersgd_rank={self.powersgd_rank}: set a rank > 0 exactly when powersgd is used "
                             f"(e.g. powersgd:4)")
        if ("hpz" in self.methods) != (self.hpz_partition_size > 0):
            raise ValueError(f"hpz_partition_size={self.hpz_partition_size}: set a size > 0 exactly when hpz is "
                             f"used (e.g. hpz:8)")
        return self

    @property
    def label(self) -> str:
        """The CLI spelling: `none`, or the methods joined by `,` with their parameters (`powersgd:4`, `hpz:8`)."""
        if not self.methods:
            return "none"
        params = {"powersgd": self.powersgd_rank, "hpz": self.hpz_partition_size}
        return ",".join(f"{m}:{params[m]}" if m in params else m for m in self.methods)

    def has(self, method: str) -> bool:
        return method in self.methods


NONE = Compression()


def parse_compression(text: str, *, node_ranks: int) -> Compression:
    """`none`, `zeropp` (qwz + hpz + qgz) or a comma list of methods, `hpz` and `powersgd` with an optional
    `:N` (hpz without one: `node_ranks`, the ranks of one node). Raises ValueError naming the bad token."""
    tokens = [t.strip().lower() for t in text.split(",") if t.strip()]
    if not tokens or tokens == ["none"]:
        return NONE
    methods: dict[str, int] = {}
    for token in tokens:
        name, _, value = token.partition(":")
        names = ZEROPP if name == "zeropp" and not value else (name,)
        for each in names:
            if each not in METHODS:
                raise ValueError(f"compression method {token!r} is unknown: choose none, zeropp or a list of "
                                 f"{', '.join(METHODS)} (powersgd:RANK, hpz:SIZE)")
            methods[each] = _parameter(each, value, node_ranks)
    ordered = tuple(sorted(methods, key=METHODS.index))
    return Compression(methods=ordered, powersgd_rank=methods.get("powersgd", 0),
                       hpz_partition_size=methods.get("hpz", 0))


def _parameter(method: str, value: str, node_ranks: int) -> int:
    if method not in ("powersgd", "hpz"):
        if value:
            raise ValueError(f"compression method {method!r} takes no parameter (got {method}:{value})")
        return 0
    if not value:
        if method == "powersgd":
            raise ValueError("powersgd needs its rank: powersgd:RANK, e.g. powersgd:4")
        return node_ranks
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{method}:{value}: the parameter must be a positive integer")
    return int(value)
