"""What `planner profile` measures: the options, validated before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass

from planner.errors import BadInputError

PROFILE_DTYPES = ("fp32", "bf16", "fp16", "amp-bf16")
LAYER_TYPES = ("embedding", "decoder", "moe_decoder", "head")
TP_RUNTIMES = ("sharded", "dtensor")


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """Shapes and measurement settings. `layer_types` None = every type the model has."""

    device: str = "cpu"
    dtype: str = "fp32"
    seq_len: int
    microbatch_sizes: tuple[int, ...] = (1,)
    tp: tuple[int, ...] = (1,)
    ep: tuple[int, ...] = (1,)
    layer_types: tuple[str, ...] | None = None
    warmup: int = 2
    repeats: int = 5
    op_warmup: int = 1
    op_repeats: int = 3
    ops: bool = True
    threads: int | None = None  # CPU intra-op threads (torch.set_num_threads); None = torch's default
    clock: str = "wall"  # CPU only: "wall" (perf_counter) or "process" (process CPU time, see measure_timing)
    tp_runtime: str = "sharded"  # tp > 1 timed on: "sharded" plain layers at heads/tp, or "dtensor" (measure_dtensor)

    def __post_init__(self) -> None:
        if self.dtype not in PROFILE_DTYPES:
            raise BadInputError(f"dtype={self.dtype!r} is unknown: choose one of {', '.join(PROFILE_DTYPES)}")
        if self.seq_len <= 0:
            raise BadInputError(f"seq_len={self.seq_len} must be positive")
        for name in ("microbatch_sizes", "tp", "ep"):
            values = getattr(self, name)
            if not values or any(v <= 0 for v in values):
                raise BadInputError(f"{name}={list(values)} must be a non-empty list of positive integers")
        if self.layer_types is not None:
            unknown = [k for k in self.layer_types if k not in LAYER_TYPES]
            if unknown:
                raise BadInputError(f"layer_types={unknown} unknown: choose from {', '.join(LAYER_TYPES)}")
        if self.threads is not None and self.threads <= 0:
            raise BadInputError(f"threads={self.threads} must be a positive integer")
        if self.clock not in ("wall", "process"):
            raise BadInputError(f"clock={self.clock!r} is unknown: choose wall or process")
        if self.tp_runtime not in TP_RUNTIMES:
            raise BadInputError(f"tp_runtime={self.tp_runtime!r} is unknown: choose {' or '.join(TP_RUNTIMES)}")
        if self.repeats <= 0 or self.warmup < 0 or self.op_repeats <= 0 or self.op_warmup < 0:
            raise BadInputError("repeats and op_repeats must be positive, warmup and op_warmup non-negative")


def parse_int_list(text: str, *, name: str) -> tuple[int, ...]:
    """'1,2,4' -> (1, 2, 4); anything else is bad input naming the flag."""
    try:
        values = tuple(int(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise BadInputError(f"{name}={text!r} must be comma-separated integers, e.g. 1,2,4") from None
    if not values or any(v <= 0 for v in values):
        raise BadInputError(f"{name}={text!r} must list positive integers, e.g. 1,2,4")
    return tuple(sorted(set(values)))
