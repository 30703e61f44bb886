"""Pipeline schedules: activations in flight per pipeline rank and the step time of m micro-batches.

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
"""

from __future__ import annotations

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")  # two stages per rank in a V (planner.executor.schedules.stage_rank)
CHUNKED = ("interleaved", "zero-bubble", "interleaved-zero-bubble", *V_SCHEDULES)  # p2p per virtual stage
ZERO_BUBBLE = ("zero-bubble", "interleaved-zero-bubble")  # torch's ScheduleInterleavedZeroBubble (ZB1P)
ZB_H1_BUBBLE_FRACTION = 1.0 / 3.0
DUALPIPE_CHUNK_BUBBLE_FRACTION = 1.0 / 3.0  # (F&B + B - 3W) / t with per-chunk F = W = t/6, B = t/3, F&B = F + B


def stage_rank(stage: int, *, pp: int, schedule: str) -> int:
    """Pipeline rank of virtual stage `stage`: looped (s % pp), or V-shaped for zbv/dualpipev (s on rank s for
    s < pp, else 2 pp - 1 - s), as planner.executor.schedules.stage_rank places them."""
    if schedule in V_SCHEDULES:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp


def rank_sums(stage_rows: np.ndarray, *, pp: int, vpp: int, schedule: str) -> np.ndarray:
    """Per pipeline rank sums of rows x (pp * vpp) per-virtual-stage values."""
    if vpp == 1:
        return stage_rows
    if schedule in V_SCHEDULES and vpp == 2:  # rank r: stage r and stage 2 pp - 1 - r
        return stage_rows[:, :pp] + stage_rows[:, 2 * pp - 1:pp - 1:-1]
    return stage_rows.reshape(len(stage_rows), vpp, pp).sum(axis=1)


def loss_rank(*, pp: int, vpp: int, schedule: str) -> int:
    """The pipeline rank holding the head and the loss (the last virtual stage's)."""
    return stage_rank(pp * vpp - 1, pp=pp, schedule=schedule)


def inflight_microbatches(schedule: str, *, pp: int, stage: int, num_microbatches: int, vpp: int = 1) -> float:
    """Micro-batches whose activations (of all of the rank's layers) pipeline rank `stage` holds at its peak."""
    m = num_microbatches
    if schedule == "gpipe":
        return float(m)
    if schedule == "zbv":
        return float(min(pp, m))
    if schedule == "dualpipev":
        return float(min(pp + 1, m))
    if schedule in ("interleaved", *ZERO_BUBBLE) and vpp > 1:  # torch's InterleavedZeroBubble warms up alike
        warmup = (pp - stage - 1) * 2 + (vpp - 1) * pp
        return min(m * vpp, warmup + 1) / vpp
    return float(min(pp - stage, m))


def bubble_s(schedule: str, *, pp: int, vpp: int, rank_time_s: float) -> float:
    """Idle time per step of the bottleneck rank, whose per-micro-batch forward+backward time is rank_time_s."""
    if pp <= 1:
        return 0.0
    if schedule == "2bw":
        return 0.0
    if schedule == "interleaved":
        return (pp - 1) * rank_time_s / vpp
    if schedule in ZERO_BUBBLE:
        return (pp - 1) * rank_time_s * ZB_H1_BUBBLE_FRACTION
    if schedule == "zbv":
        return 0.0
    if schedule == "dualpipev":
        return max(0.0, pp / 2 - 1) * rank_time_s * DUALPIPE_CHUNK_BUBBLE_FRACTION
    return (pp - 1) * rank_time_s


def bubble_fraction(schedule: str, *, pp: int, vpp: int, num_microbatches: int) -> float:
    """Bubble / ideal time: (p - 1)/m for GPipe/1F1B, (p - 1)/(v m) interleaved, (p - 1)/(3m) ZB-H1, 0 2BW and
    ZB-V, (p/2 - 1)/(3m) DualPipeV."""
    return bubble_s(schedule, pp=pp, vpp=vpp, rank_time_s=1.0) / num_microbatches


def p2p_transfers(schedule: str, *, pp: int, vpp: int, num_microbatches: int, overlapped: bool = False) -> int:
    """Sequential boundary transfers on the critical path per direction: each of the m micro-batches crosses
    v chunk boundaries of the bottleneck rank, plus the p - 1 of the fill (none when pp = 1). Where the stack
    overlaps sends with compute (Megatron-Core --overlap-p2p-comm: the steady state posts the next send/receive
    before computing the current micro-batch, schedules.py), only the p - 1 transfers of the fill stay exposed."""
    if pp <= 1:
        return 0
    if overlapped:
        return pp - 1
    chunks = vpp if schedule in ("interleaved", *ZERO_BUBBLE, *V_SCHEDULES) else 1
    return num_microbatches * chunks + pp - 1
