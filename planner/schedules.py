"""Pipeline schedules: one `Schedule` object per schedule owns everything about it; everything else asks it.

A schedule owns its name, its bubble and in-flight formulas, the point-to-point transfers on its critical path,
where its virtual stages sit (looped or in a V), its validity rules, the weight versions it holds, whether it
splits the backward, what runs it (a torch.distributed.pipelining class or the executor's own 2BW loop) and how
the stacks spell it. `schedule(name)` finds one (BadInputError for an unknown name), `NAMES` is the tuple the plan
schema's Literal is built from. This module sits at the bottom of the package: it imports only planner.errors (numpy only for type checking).

Sources of the formulas (each object's `source` cites its own):
- GPipe (Huang et al. 2019): all m forwards, then all backwards: every rank holds m micro-batches;
  time (m + p - 1) * t, bubble (p - 1) * t.
- 1F1B / PipeDream-Flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training", Sec. 3.2;
  Narayanan et al. 2021 SC, Sec. 2.2.1): rank r holds min(p - r, m); same time and bubble as GPipe.
- Interleaved 1F1B (Narayanan et al. 2021 SC, Sec. 2.2.2): v model chunks per rank, bubble (p - 1) * t / v where
  t is a rank's whole per-micro-batch time; rank r warms up (p - r - 1) * 2 + (v - 1) * p chunk-micro-batches
  (Megatron-LM schedules.py), so it holds min(m*v, that + 1) / v micro-batches' worth of its layers.
- PipeDream-2BW (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel DNN Training"): 1F1B without a flush;
  the fill/drain bubble is paid once over the whole run, not per step, so per step it amortises to ~0. It keeps
  two weight versions (the extra copy is counted with the weights) and 1F1B's activations.
- Zero bubble ZB-H1 (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", Sec. 3.1): splits backward into input and
  weight gradients and fills the bubble with the latter; same peak activations as 1F1B, bubble about a third
  of 1F1B's: (p - 1) * t / 3. With vpp > 1 (torch's ScheduleInterleavedZeroBubble, which the executor runs) the
  bubble is kept at that third (not divided by v: conservative) and activations follow the interleaved warm-up.
  "interleaved-zero-bubble" is torch's name for that same class (ScheduleInterleavedZeroBubble, "implementing the
  ZB1P schedule in the paper", torch/distributed/pipelining/schedules.py): priced as zero-bubble.
- ZB-V (Qi et al. 2024, "Zero Bubble Pipeline Parallelism", ICLR, sec. 6; torch's ScheduleZBVZeroBubble, exactly
  two stages per rank placed in a V: stage s on rank s and 2p - 1 - s, so rank 0 holds the embedding and the
  head): zero bubble when T_F = T_B = T_W (torch's docstring: "only if time forward == time backward input == time
  backward weights"), with 1F1B's peak activation memory balanced over the ranks (the paper's ZB-V: every rank
  p micro-batches of its 1F1B-stage share; the authors' table: activation 1x 1F1B, bubble 0 at F = B = W,
  pipeline communication 2x). We price it with the F = B = W convention that gives ZB-H1 its third, i.e. bubble
  0 (an approximation: real W is not B, so some bubble stays), inflight min(p, m) on every rank, 2 chunk
  boundaries per micro-batch.
- DualPipeV (torch's ScheduleDualPipeV, "based on the DualPipe schedule introduced by DeepSeek", arXiv
  2412.19437, deepseek-ai/DualPipe; the V placement above, one copy of the parameters: DualPipe's bidirectional
  2x parameters is what the V cut removes): DeepSeek-V3 report Table 2 gives DualPipe's bubble
  (p/2 - 1)(F&B + B - 3W) and activations p + 1 micro-batches; F, B, W per chunk (half a rank's layers) with the
  F = B = W convention (B the whole backward = 2F) and F&B = F + B (no overlap of the two micro-batches' compute
  modelled, as our executor runs it), i.e. (p/2 - 1) * t / 3 for a rank time t; inflight min(p + 1, m) on
  every rank (the table's peak, taken for all: conservative). torch needs m >= 2p for it
  (planner.frameworks.torch_schedule_rule).

The arithmetic of each formula is written exactly as the cost model has always evaluated it (the golden plans are
compared byte for byte), so do not regroup a product or a quotient.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from planner.errors import BadInputError

if TYPE_CHECKING:
    import numpy as np

ZB_H1_BUBBLE_FRACTION = 1.0 / 3.0
DUALPIPE_CHUNK_BUBBLE_FRACTION = 1.0 / 3.0  # (F&B + B - 3W) / t with per-chunk F = W = t/6, B = t/3, F&B = F + B

StagesPerRank = Literal["one", "any", "several", "two"]


@dataclass(frozen=True)
class Schedule:
    """One pipeline schedule and everything the planner knows about it.

    stages_per_rank: "one" (vpp must be 1), "any" (vpp >= 1; vpp > 1 needs pp > 1), "several" (pp > 1 and vpp > 1),
    "two" (exactly vpp = 2 where pp > 1, placed in a V). searched_vpp: which vpp the search proposes (the same
    words; zero-bubble is valid with vpp > 1 but proposed with vpp 1 only). placement: "looped" (stage s on rank
    s % pp) or "v" (s on rank s for s < pp, else 2 pp - 1 - s)."""

    name: str
    title: str  # the literature's name, for messages
    source: str
    stages_per_rank: StagesPerRank
    searched_vpp: StagesPerRank
    placement: Literal["looped", "v"]
    chunked_p2p: bool  # every micro-batch crosses vpp chunk boundaries of a rank (else one)
    splits_backward: bool  # input and weight gradients apart (zero bubble): FSDP2 cannot reshard after forward
    weight_versions: int  # 2: PipeDream-2BW's stale copy, counted with the weights
    executor_class: str | None  # torch.distributed.pipelining class the executor builds; None: its own 2BW loop
    megatron: str | None  # the Megatron-Core function that runs it (megatron/core/pipeline_parallel/schedules.py)
    deepspeed: str | None  # DeepSpeed's pipeline schedule class (deepspeed/runtime/pipe/schedule.py)
    tie_rank: int  # order among equal plans (planner.search.outcome): the simpler schedule first
    searched_by_default: bool  # in SearchLimits.schedules' default
    bubble: Callable[[int, int, float], float] = field(repr=False, compare=False)  # (pp > 1, vpp, rank time) -> s
    inflight: Callable[[int, int, int, int], float] = field(repr=False, compare=False)  # (pp, stage, m, vpp)
    aliases: tuple[str, ...] = ()  # other spellings `schedule()` accepts (torch's class, the paper's name)
    runs_as: str = ""  # the schedule a stack without this one exports it as (same bubble, less activation memory)
    drawing_note: str = ""  # what `explain --plot` says when it draws this schedule in 1F1B order
    min_microbatches_is_pp: bool = False  # the algorithm needs m >= pp (PipeDream-2BW Sec. 3.1)
    min_microbatches_is_stages: bool = False  # torch's constructor needs m >= pp * vpp (ScheduleDualPipeV)

    @property
    def v_placed(self) -> bool:
        return self.placement == "v"

    @property
    def holds_every_microbatch(self) -> bool:
        """All forwards before any backward (GPipe): each micro-batch adds its activations on every rank."""
        return self.inflight is _all_first

    @property
    def multi_stage(self) -> bool:
        """Its torch class takes a rank's list of stages (vpp may exceed 1), not one stage."""
        return self.stages_per_rank != "one"

    @property
    def stale_weights(self) -> bool:
        """Trains on one-step-stale weights (no flush): the user must allow it."""
        return self.weight_versions > 1

    @property
    def torchtitan_name(self) -> str | None:
        """torchtitan's `pipeline_parallel_schedule` value: torch's class without the `Schedule` prefix
        (torch/distributed/pipelining/schedules.py get_schedule_class)."""
        return self.executor_class.removeprefix("Schedule") if self.executor_class else None

    def bubble_s(self, *, pp: int, vpp: int, rank_time_s: float) -> float:
        """Idle time per step of the bottleneck rank, whose per-micro-batch forward+backward time is rank_time_s."""
        return 0.0 if pp <= 1 else self.bubble(pp, vpp, rank_time_s)

    def bubble_fraction(self, *, pp: int, vpp: int, num_microbatches: int) -> float:
        """Bubble / ideal time: (p - 1)/m for GPipe/1F1B, (p - 1)/(v m) interleaved, (p - 1)/(3m) ZB-H1, 0 2BW and
        ZB-V, (p/2 - 1)/(3m) DualPipeV."""
        return self.bubble_s(pp=pp, vpp=vpp, rank_time_s=1.0) / num_microbatches

    def inflight_microbatches(self, *, pp: int, stage: int, num_microbatches: int, vpp: int = 1) -> float:
        """Micro-batches whose activations (of all of the rank's layers) pipeline rank `stage` holds at its peak."""
        return self.inflight(pp, stage, num_microbatches, vpp)

    def p2p_transfers(self, *, pp: int, vpp: int, num_microbatches: int, overlapped: bool = False) -> int:
        """Sequential boundary transfers on the critical path per direction: each of the m micro-batches crosses
        v chunk boundaries of the bottleneck rank (one where the schedule is not chunked), plus the p - 1 of the
        fill (none when pp = 1). Where the stack overlaps sends with compute (Megatron-Core --overlap-p2p-comm:
        the steady state posts the next send/receive before computing the current micro-batch, schedules.py),
        only the p - 1 transfers of the fill stay exposed."""
        if pp <= 1:
            return 0
        if overlapped:
            return pp - 1
        return num_microbatches * (vpp if self.chunked_p2p else 1) + pp - 1

    def stage_rank(self, stage: int, *, pp: int) -> int:
        """Pipeline rank of virtual stage `stage`: looped (s % pp), or in a V (s for s < pp, else 2 pp - 1 - s)."""
        if self.v_placed:
            return stage if stage < pp else 2 * pp - 1 - stage
        return stage % pp

    def loss_rank(self, *, pp: int, vpp: int) -> int:
        """The pipeline rank holding the head and the loss (the last virtual stage's): pp - 1, or 0 in a V."""
        return self.stage_rank(pp * vpp - 1, pp=pp)

    def rank_sums(self, stage_rows: np.ndarray, *, pp: int, vpp: int) -> np.ndarray:
        """Per pipeline rank sums of rows x (pp * vpp) per-virtual-stage values (vectorised over the rows)."""
        if vpp == 1:
            return stage_rows
        if self.v_placed and vpp == 2:  # rank r: stage r and stage 2 pp - 1 - r
            return stage_rows[:, :pp] + stage_rows[:, 2 * pp - 1:pp - 1:-1]
        return stage_rows.reshape(len(stage_rows), vpp, pp).sum(axis=1)

    def searched_vpps(self, most: int) -> range:
        """The vpp values the search proposes for this schedule with pp > 1, where a rank may hold `most` chunks."""
        return {"one": range(1, 2), "any": range(1, most + 1), "several": range(2, most + 1),
                "two": range(2, 3) if most >= 2 else range(0)}[self.searched_vpp]

    def min_microbatches(self, *, pp: int, vpp: int) -> int:
        """The fewest micro-batches per step the schedule runs with (pp > 1): pp for 2BW's two weight versions,
        one per stage for torch's DualPipeV, else 1."""
        if self.min_microbatches_is_pp:
            return pp
        return pp * vpp if self.min_microbatches_is_stages else 1

    def vpp_reasons(self, *, pp: int, vpp: int) -> list[str]:
        """Why (pp, vpp) is not a shape of this schedule (planner.cost.validity), or []."""
        if self.stages_per_rank == "several":
            if pp < 2 or vpp < 2:
                return [f"the {self.name} schedule needs pp>1 and vpp>1 (got pp={pp}, vpp={vpp}): use "
                        f"{DEFAULT.name} or raise vpp"]
            return []
        if self.stages_per_rank == "any" and vpp > 1:
            # torch's ScheduleInterleavedZeroBubble runs vpp stages per rank, as the executor does
            return [] if pp >= 2 else [f"vpp={vpp} with pp={pp}: virtual stages need pp>1; set vpp=1"]
        if self.stages_per_rank == "two" and pp > 1:
            # torch's ScheduleZBVZeroBubble / ScheduleDualPipeV: exactly two stages per rank
            return [] if vpp == 2 else [f"schedule={self.name} places exactly 2 stages per rank in a V (got vpp={vpp}): "
                                        "set vpp=2"]
        if vpp > 1:
            several = [s.name for s in ALL if s.stages_per_rank in ("several", "any")]
            v = ", ".join(s.name for s in ALL if s.stages_per_rank == "two")
            return [f"vpp={vpp} needs schedule={', '.join(several[:-1])} or {several[-1]} ({v}: vpp=2 with pp>1) "
                    f"(got {self.name})"]
        return []


def _all_first(pp: int, stage: int, m: int, vpp: int) -> float:
    return float(m)


def _one_f_one_b(pp: int, stage: int, m: int, vpp: int) -> float:
    return float(min(pp - stage, m))


def _interleaved(pp: int, stage: int, m: int, vpp: int) -> float:
    if vpp > 1:  # torch's InterleavedZeroBubble warms up alike
        warmup = (pp - stage - 1) * 2 + (vpp - 1) * pp
        return min(m * vpp, warmup + 1) / vpp
    return _one_f_one_b(pp, stage, m, vpp)


GPIPE = Schedule(
    name="gpipe", title="GPipe", source="Huang et al. 2019, GPipe", stages_per_rank="one", searched_vpp="one",
    placement="looped", chunked_p2p=False, splits_backward=False, weight_versions=1, executor_class="ScheduleGPipe",
    megatron=None, deepspeed=None, tie_rank=3, searched_by_default=True,
    bubble=lambda pp, vpp, t: (pp - 1) * t, inflight=_all_first,
    runs_as="1f1b")
ONE_F_ONE_B = Schedule(
    name="1f1b", title="1F1B", source="Narayanan et al. 2021, Sec. 3.2 (PipeDream-Flush); SC 2021 Sec. 2.2.1",
    stages_per_rank="one", searched_vpp="one", placement="looped", chunked_p2p=False, splits_backward=False,
    weight_versions=1, executor_class="Schedule1F1B", megatron="forward_backward_pipelining_without_interleaving",
    deepspeed="TrainSchedule", tie_rank=0, searched_by_default=True,
    bubble=lambda pp, vpp, t: (pp - 1) * t, inflight=_one_f_one_b, aliases=("pipedream-flush",))
INTERLEAVED = Schedule(
    name="interleaved", title="interleaved 1F1B", source="Narayanan et al. 2021 SC, Sec. 2.2.2; Megatron-LM schedules.py",
    stages_per_rank="several", searched_vpp="several", placement="looped", chunked_p2p=True, splits_backward=False,
    weight_versions=1, executor_class="ScheduleInterleaved1F1B", megatron="forward_backward_pipelining_with_interleaving",
    deepspeed=None, tie_rank=1, searched_by_default=True,
    bubble=lambda pp, vpp, t: (pp - 1) * t / vpp, inflight=_interleaved, aliases=("interleaved-1f1b",))
TWO_BW = Schedule(
    name="2bw", title="PipeDream-2BW", source="Narayanan et al. 2021, Memory-Efficient Pipeline-Parallel DNN Training",
    stages_per_rank="one", searched_vpp="one", placement="looped", chunked_p2p=False, splits_backward=False,
    weight_versions=2, executor_class=None, megatron=None, deepspeed=None, tie_rank=4, searched_by_default=True,
    bubble=lambda pp, vpp, t: 0.0, inflight=_one_f_one_b, aliases=("pipedream-2bw",),
    drawing_note="2BW has no flush: its bubble is amortised across steps", min_microbatches_is_pp=True)
ZERO_BUBBLE = Schedule(
    name="zero-bubble", title="ZB-H1", source="Qi et al. 2023, Zero Bubble Pipeline Parallelism, Sec. 3.1",
    stages_per_rank="any", searched_vpp="one", placement="looped", chunked_p2p=True, splits_backward=True,
    weight_versions=1, executor_class="ScheduleInterleavedZeroBubble", megatron=None, deepspeed=None, tie_rank=2,
    searched_by_default=True, bubble=lambda pp, vpp, t: (pp - 1) * t * ZB_H1_BUBBLE_FRACTION, inflight=_interleaved,
    aliases=("zb-h1",), drawing_note="ZB-H1 fills bubbles with weight-gradient work, not drawn")
INTERLEAVED_ZERO_BUBBLE = Schedule(
    name="interleaved-zero-bubble", title="interleaved zero bubble (ZB1P)",
    source="torch/distributed/pipelining/schedules.py ScheduleInterleavedZeroBubble; priced as zero-bubble",
    stages_per_rank="any", searched_vpp="any", placement="looped", chunked_p2p=True, splits_backward=True,
    weight_versions=1, executor_class="ScheduleInterleavedZeroBubble", megatron=None, deepspeed=None, tie_rank=5,
    searched_by_default=False, bubble=ZERO_BUBBLE.bubble, inflight=_interleaved, aliases=("zb1p",))
ZBV = Schedule(
    name="zbv", title="ZB-V", source="Qi et al. 2024 ICLR sec. 6; torch ScheduleZBVZeroBubble",
    stages_per_rank="two", searched_vpp="two", placement="v", chunked_p2p=True, splits_backward=True, weight_versions=1,
    executor_class="ScheduleZBVZeroBubble", megatron=None, deepspeed=None, tie_rank=6, searched_by_default=False,
    bubble=lambda pp, vpp, t: 0.0, inflight=lambda pp, stage, m, vpp: float(min(pp, m)), aliases=("zb-v",))
DUALPIPEV = Schedule(
    name="dualpipev", title="DualPipeV",
    source="torch ScheduleDualPipeV; DeepSeek-V3 report (arXiv 2412.19437) Table 2; deepseek-ai/DualPipe",
    stages_per_rank="two", searched_vpp="two", placement="v", chunked_p2p=True, splits_backward=True, weight_versions=1,
    executor_class="ScheduleDualPipeV", megatron=None, deepspeed=None, tie_rank=7, searched_by_default=False,
    bubble=lambda pp, vpp, t: max(0.0, pp / 2 - 1) * t * DUALPIPE_CHUNK_BUBBLE_FRACTION,
    inflight=lambda pp, stage, m, vpp: float(min(pp + 1, m)), aliases=("dualpipe-v",), min_microbatches_is_stages=True)

ALL: tuple[Schedule, ...] = (GPIPE, ONE_F_ONE_B, INTERLEAVED, TWO_BW, ZERO_BUBBLE, INTERLEAVED_ZERO_BUBBLE, ZBV, DUALPIPEV)
NAMES: tuple[str, ...] = tuple(s.name for s in ALL)
EXECUTOR_CLASSES: Mapping[str, str] = MappingProxyType({s.name: s.executor_class for s in ALL if s.executor_class})
SEARCHED_BY_DEFAULT: tuple[str, ...] = tuple(s.name for s in ALL if s.searched_by_default)
V_PLACED: tuple[Schedule, ...] = tuple(s for s in ALL if s.v_placed)
DEFAULT = ONE_F_ONE_B  # what a plan without a pipeline (pp = 1) names, and the request's default
_INDEX: dict[str, Schedule] = {**{a: s for s in ALL for a in s.aliases}, **{s.name: s for s in ALL}}  # never written
BY_NAME: Mapping[str, Schedule] = MappingProxyType(_INDEX)


def schedule(name: str) -> Schedule:
    """The Schedule called `name` (or one of its aliases, any case); BadInputError naming the choices otherwise.
    Called per candidate on the search's hot paths: one dict lookup when the name is exact."""
    try:
        return _INDEX[name]
    except KeyError:
        found = _INDEX.get(str(name).lower())
    if found is None:
        raise BadInputError(f"schedule={name!r} is unknown: choose one of {', '.join(NAMES)}")
    return found
