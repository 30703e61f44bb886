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
"""

from __future__ import annotations

SCHEDULES = ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble")
ZB_H1_BUBBLE_FRACTION = 1.0 / 3.0


def inflight_microbatches(schedule: str, *, pp: int, stage: int, num_microbatches: int, vpp: int = 1) -> float:
    """Micro-batches whose activations (of all of the rank's layers) pipeline rank `stage` holds at its peak."""
    m = num_microbatches
    if schedule == "gpipe":
        return float(m)
    if schedule in ("interleaved", "zero-bubble") and vpp > 1:  # torch's InterleavedZeroBubble warms up alike
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
    if schedule == "zero-bubble":
        return (pp - 1) * rank_time_s * ZB_H1_BUBBLE_FRACTION
    return (pp - 1) * rank_time_s


def bubble_fraction(schedule: str, *, pp: int, vpp: int, num_microbatches: int) -> float:
    """Bubble / ideal time: (p - 1)/m for GPipe/1F1B, (p - 1)/(v m) interleaved, (p - 1)/(3m) ZB-H1, 0 2BW."""
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
    chunks = vpp if schedule in ("interleaved", "zero-bubble") else 1
    return num_microbatches * chunks + pp - 1
