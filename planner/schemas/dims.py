"""The parallel degrees of a plan, in one record: `ParallelDims` (dp, tp, pp, cp, ep and HSDP's dp_replicate), the
axis names as the `Axis` enum, the derived group sizes as properties, and the rules every plan obeys checked in one
place (`ParallelDims.check`), as torchtitan's ParallelDims (torchtitan/distributed/parallel_dims.py: dp_replicate,
dp_shard, cp, tp, pp, ep, validated in __post_init__, world_size and the meshes derived) and Megatron-Core's
ModelParallelConfig (megatron/core/model_parallel_config.py) hold them.

What is here and what is not:
- dp_replicate is a degree: it splits the dp ranks into replicas x shards (HSDP, torchtitan's dp_replicate x
  dp_shard), changes the process groups the gradients reduce over and so the links and the memory. It defaults to 1
  (plain DDP/FSDP over all dp ranks); dp_shard is derived.
- vpp (virtual stages per pipeline rank) is not: it changes neither the world size nor any process group, only how a
  pipeline rank's layers are chunked and run, so it belongs with the schedule (Megatron-Core keeps
  virtual_pipeline_model_parallel_size beside the schedule's knobs; torch.distributed.pipelining makes it the
  schedule class's stages per rank).
- The rules that read the model (heads by tp, experts by ep, seq_len by cp) or the stack (which ep spans it runs:
  planner.frameworks) are not here: they need more than the degrees.

The record is a plain frozen dataclass with no checks at construction: the search builds hundreds of thousands of
candidates (subclasses of it: planner.cost.types.Candidate) whose degrees come from divisors of the GPU count, so
the request's degrees are checked once at the boundary (`check`, `resolve`, `FixedDims.of`) and not on every point.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from planner.errors import BadInputError
from planner.schemas import limits as L


class Axis(enum.StrEnum):
    """A parallel axis, spelled as every file and flag spells it (`Axis.TP == "tp"`, f"{Axis.TP}" is "tp")."""

    DP = "dp"
    TP = "tp"
    PP = "pp"
    CP = "cp"
    EP = "ep"


# The axes ranks are laid out over (outermost to innermost by default: tp innermost keeps TP inside a node); ep
# has no ranks of its own (its groups are carved out of dp x cp, or folded over tp: ParallelDims.expert_fold).
NAMES: frozenset[str] = frozenset(axis.value for axis in Axis)
LAYOUT_AXES: tuple[str, ...] = (Axis.PP.value, Axis.DP.value, Axis.CP.value, Axis.TP.value)


@dataclass(frozen=True, kw_only=True)
class ParallelDims:
    """The parallel degrees of one plan. Subclassed by the records that add per-plan choices to them (the cost
    model's Candidate, a stack's rule Config), so each of them is a ParallelDims and reads the same properties."""

    dp: int
    tp: int
    pp: int
    ep: int = 1  # expert parallel (MoE only): carved out of dp x cp, or folded over tp (expert_fold)
    cp: int = 1
    dp_replicate: int = 1  # HSDP: replicas of the ZeRO-2/3 shard group (1: plain DDP/FSDP over all dp ranks)

    # ---- derived sizes ------------------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Ranks of the layout: dp x tp x pp x cp (ep lives inside them)."""
        return self.dp * self.tp * self.pp * self.cp

    @property
    def model_parallel_size(self) -> int:
        """Ranks one data-parallel replica spans: tp x pp x cp (world_size / dp; Megatron-LM's divisor of the world)."""
        return self.tp * self.pp * self.cp

    @property
    def dp_cp(self) -> int:
        """Ranks the dense gradients reduce over: dp x cp (Megatron-Core's data-parallel group with context parallel)."""
        return self.dp * self.cp

    @property
    def dp_shard(self) -> int:
        """Ranks of one HSDP shard group along dp: dp / dp_replicate (torchtitan's dp_shard)."""
        return self.dp // self.dp_replicate

    @property
    def zero_shard(self) -> int:
        """Ranks dense ZeRO state shards over: dp x cp, or under HSDP (dp_replicate > 1; Zhao et al. 2023, PyTorch
        FSDP sec. 3.2.2 hybrid sharding, FSDP2 fully_shard on a (replicate, shard) mesh) the shard group's
        dp x cp / dp_replicate; the dp_replicate replicas each hold the whole sharded state."""
        return self.dp * self.cp // self.dp_replicate

    @property
    def expert_dp(self) -> int:
        """Ranks a routed expert's gradients reduce over: the expert-data-parallel dp x cp / ep ranks (at least 1:
        an ep folded over tp leaves one)."""
        return max(1, self.dp * self.cp // self.ep)

    @property
    def expert_shard(self) -> int:
        """Ranks routed experts' ZeRO state shards over: expert_dp (/ dp_replicate under HSDP)."""
        return max(1, self.dp * self.cp // self.ep // self.dp_replicate)

    @property
    def expert_fold(self) -> int:
        """How many tp ranks an expert group takes (MoE parallel folding, Megatron-Core parallel_state.py): 1 when ep
        divides dp*cp (experts inside the data-parallel ranks), k when ep = dp*cp*k with k dividing tp (the expert
        mesh ep x etp, etp = tp/k, over the same tp*dp*cp ranks). Anything else is refused naming both forms."""
        span = self.dp * self.cp
        if span % self.ep == 0:
            return 1
        if self.ep % span == 0 and self.tp % (self.ep // span) == 0:
            return self.ep // span
        divisors = [d for d in range(1, min(span, L.MAX_DEGREE) + 1) if span % d == 0]
        folded = [span * k for k in range(2, min(self.tp, L.MAX_DEGREE) + 1) if self.tp % k == 0]
        raise BadInputError(f"ep={self.ep} must divide dp*cp={span} or, folded over tp={self.tp}, be dp*cp times a "
                            f"divisor of tp: choose ep in {{{', '.join(map(str, divisors + folded))}}}")

    def degree(self, axis: Axis | str) -> int:
        """The degree of one axis by name."""
        return getattr(self, Axis(axis).value)

    def sizes(self) -> dict[str, int]:
        """{axis name: degree} of every axis (the form planner.topology.placement takes)."""
        return {axis.value: getattr(self, axis.value) for axis in Axis}

    def layout_sizes(self) -> dict[str, int]:
        """{axis name: degree} of the axes ranks are laid out over (LAYOUT_AXES order; ep has no ranks of its own)."""
        return {axis: getattr(self, axis) for axis in LAYOUT_AXES}

    def as_dict(self) -> dict[str, int]:
        """The degrees as keyword arguments (a subclass's other fields dropped): how a record with the same field
        names (the LaunchPlan's Parallelism, a Candidate, a stack's Config) is built from this one."""
        return {"dp": self.dp, "tp": self.tp, "pp": self.pp, "ep": self.ep, "cp": self.cp, "dp_replicate": self.dp_replicate}

    # ---- the one check ------------------------------------------------------------------------------------------
    def check(self, gpus: int | None = None) -> ParallelDims:
        """Self when the degrees are a layout (each a positive integer within the limits, dp_replicate dividing dp,
        and with `gpus` the world size equal to it); else BadInputError naming the field, the value and the fix.

        ep's rule (`expert_fold`) is not checked here: a fixed configuration's ep is judged with the model's rules
        (ep dividing the experts, planner.cost.validity) so that one line names every problem, and the stack's span
        narrows it further (planner.frameworks)."""
        for f in dataclasses.fields(ParallelDims):
            positive(f.name, getattr(self, f.name))
        if self.dp % self.dp_replicate:
            raise BadInputError(f"dp_replicate={self.dp_replicate} must divide dp={self.dp}: choose a divisor of dp, or 1")
        if gpus is not None and self.world_size != gpus:
            raise BadInputError(f"dp*tp*pp*cp={self.dp}*{self.tp}*{self.pp}*{self.cp}={self.world_size} must equal "
                                f"gpus={gpus}: choose degrees whose product is {gpus}")
        return self

    @staticmethod
    def resolve(gpus: int, *, dp: int | None = None, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                dp_replicate: int = 1) -> ParallelDims:
        """The checked degrees of a fixed configuration on `gpus` ranks; dp None: gpus / (tp*pp*cp), which must divide."""
        for name, value in (("tp", tp), ("pp", pp), ("cp", cp)):
            positive(name, value)
        if dp is None:
            model_parallel = tp * pp * cp
            if gpus % model_parallel:
                raise BadInputError(
                    f"tp*pp*cp={tp}*{pp}*{cp}={model_parallel} does not divide gpus={gpus}: choose degrees whose "
                    f"product divides {gpus}, or ask for a multiple of {model_parallel} GPUs")
            dp = gpus // model_parallel
        return ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, dp_replicate=dp_replicate).check(gpus)


def positive(name: str, value: object) -> int:
    """`value` when it is an integer in 1..limits.MAX_DEGREE; else BadInputError naming the field and the fix."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= L.MAX_DEGREE:
        raise BadInputError(f"{name}={value!r} must be an integer from 1 to {L.MAX_DEGREE}: give {name} >= 1")
    return value


def divisors(n: int) -> list[int]:
    """The divisors of n, ascending."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


class FixedDims(Mapping[Axis, int]):
    """The degrees a request fixes (`--tp 8`, SearchLimits.fixed): a read-only mapping Axis -> degree, checked once
    when built (`of`): every key an axis, every value a positive integer, and dp, tp, pp, cp dividing the GPU count
    (ep is carved out of dp x cp: whether it fits is the space's rule, with the stack's span). Keys compare and hash
    as their names, so `fixed.get("tp")` reads it too; items iterate in name order."""

    __slots__ = ("_degrees",)

    def __init__(self, degrees: Mapping[Axis, int] | None = None):
        self._degrees = dict(sorted((degrees or {}).items()))

    @staticmethod
    def of(mapping: Mapping[str, int] | None, gpus: int) -> FixedDims:
        """The checked FixedDims of a name -> degree mapping on `gpus` ranks."""
        known = ", ".join(axis.value for axis in Axis)
        out: dict[Axis, int] = {}
        for name, value in sorted((mapping or {}).items()):
            if name not in NAMES:
                raise BadInputError(f"fixed degree {name}={value}: unknown axis; choose among {known}")
            axis = Axis(name)
            if (isinstance(value, bool) or not isinstance(value, int) or value < 1
                    or (axis is not Axis.EP and gpus % value)):
                choices = ", ".join(map(str, divisors(gpus)))
                raise BadInputError(f"{axis}={value} must divide gpus={gpus}: choose {axis} in {{{choices}}}")
            out[axis] = value
        return FixedDims(out)

    def allows(self, axis: Axis, value: int) -> bool:
        """True when `axis` is free or fixed to `value`."""
        return self._degrees.get(axis, value) == value

    def __getitem__(self, axis: Axis | str) -> int:
        return self._degrees[axis]

    def __iter__(self) -> Iterator[Axis]:
        return iter(self._degrees)

    def __len__(self) -> int:
        return len(self._degrees)

    def __repr__(self) -> str:
        return "FixedDims(" + ", ".join(f"{axis}={value}" for axis, value in self._degrees.items()) + ")"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __hash__(self) -> int:
        return hash(tuple(self._degrees.items()))
