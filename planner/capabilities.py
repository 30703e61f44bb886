"""What our executor can run, as rules over a configuration's plain fields (no torch, no plan objects).

One source for two users: the search's `--runnable` filter (planner.search.space) prunes exactly what these
rules refuse, and the executor's pre-launch check (planner.executor.runnable) refuses a plan with the same
words. Each rule says why torch cannot do it here, so the message can name the fix.
"""

from __future__ import annotations

RUNNABLE_SCHEDULES = ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble")
# torch.distributed.pipelining schedules the executor also runs by torch's name (plan files, `planner run`):
# ScheduleInterleavedZeroBubble (= zero-bubble), ScheduleZBVZeroBubble and ScheduleDualPipeV (V placement:
# pipeline rank r holds virtual stages r and 2*pp-1-r, so vpp must be 2).
TORCH_SCHEDULES = ("interleaved-zero-bubble", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
ZERO_BUBBLE_SCHEDULES = ("zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev")


def stage_rank(stage: int, *, pp: int, schedule: str) -> int:
    """Pipeline rank of virtual stage `stage`: looped (s % pp), or V-shaped for zbv/dualpipev."""
    if schedule in V_SCHEDULES:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp
RUNNABLE_PRECISIONS = ("fp32", "bf16", "amp-bf16")


FP8_REASON = ("fp8 training needs fp8 tensor cores (NVIDIA sm89+: L4/L40, H100) through torchao float8 or Transformer "
              "Engine; a CPU has no fp8 matmul, and the executor does not wire torchao's float8 training in yet")
CP_REASON = ("torch 2.13's context_parallel (ring attention) has no CPU attention kernel: "
             "aten._scaled_dot_product_flash_attention_for_cpu has no sharding rule, and the MATH backend mixes Tensor "
             "and DTensor (measured on gloo); its CUDA path (flash/efficient SDPA) is not wired into the executor yet")


def precision_refusal(precision: str) -> str | None:
    """fp8: see FP8_REASON."""
    if precision not in RUNNABLE_PRECISIONS:
        reason = f" ({FP8_REASON})" if precision == "fp8" else ""
        return f"precision={precision!r} is not runnable by the executor{reason}: choose one of {list(RUNNABLE_PRECISIONS)}"
    return None


def refusal(*, cp: int, ep: int, dp: int, tp: int, pp: int, sp: bool, zero_stage: int, schedule: str,
            recompute: str, tp_overlap: str, is_moe: bool, dp_replicate: int = 1) -> tuple[str, str] | None:
    """(pruned key, message) of the first rule a configuration breaks; None when the executor can run it."""
    if dp_replicate > 1 and zero_stage not in (2, 3):
        return "hsdp_without_fsdp", f"dp_replicate={dp_replicate} (HSDP) shards with FSDP2: use zero_stage 2 or 3, or dp_replicate=1"
    if dp_replicate > 1 and ep > 1:
        return "hsdp_with_ep_not_runnable", f"dp_replicate={dp_replicate} (HSDP) with ep={ep}: experts shard inside the flat dp axis; use dp_replicate=1"
    if dp_replicate > 1 and schedule == "2bw" and pp > 1:
        return "hsdp_with_2bw_not_runnable", f"dp_replicate={dp_replicate} (HSDP) with schedule=2bw: 2BW runs with zero_stage 0; use dp_replicate=1"
    if cp > 1:
        return "cp_not_runnable", f"cp={cp}: context parallelism is not runnable by the executor ({CP_REASON}): re-plan with cp=1 (plan --runnable)"
    if ep > 1 and dp % ep:
        return "ep_not_dividing_dp", f"ep={ep} must divide dp={dp} (experts are sharded inside the dp group): choose ep in a divisor of dp"
    if tp_overlap == "domino" and is_moe:
        return "domino_moe_not_runnable", "tp_overlap=domino is not runnable on an MoE model (no expert TP in the executor): use tp_overlap=none"
    if tp_overlap == "domino" and sp:
        return "domino_sp_not_runnable", "tp_overlap=domino runs without sequence parallelism: set sp=false or tp_overlap=none"
    if schedule not in RUNNABLE_SCHEDULES + TORCH_SCHEDULES:
        return "schedule_not_runnable", (
            f"schedule={schedule!r} is not runnable by the executor: choose one of {list(RUNNABLE_SCHEDULES)} (plan --runnable)"
        )
    if schedule == "2bw" and pp > 1 and zero_stage > 0:
        return "2bw_with_zero_not_runnable", (
            f"schedule=2bw with zero_stage={zero_stage} is not runnable by the executor (its two weight versions are "
            f"full per-rank copies of the stage, updated by one optimizer state): use zero_stage=0 with 2bw, or 1f1b"
        )
    return None
