"""Single-device accuracy: predicted vs measured step time and peak memory of HF TinyLlama-1.1B training.

Measured: validation/h100_hf_tinyllama.jsonl (one H100 80GB HBM3; HF LlamaForCausalLM at the
TinyLlama-1.1B shape, seq 2048, fp32 parameters + bf16 autocast + fused AdamW + SDPA, micro-batch 1-8, with
and without gradient checkpointing; median step of 6 after 3 warm-up; peak allocated CUDA memory).

Predicted: `planner.api.estimate` on the tinyllama-1.1b preset, 1 GPU of the dgx-h100 topology, precision
amp-bf16, global batch = micro-batch (one micro-batch per step), recompute "full" for gradient checkpointing.
Without --profile the cost model is analytic with the H100's measured ceilings (the first row of the file:
bf16 matmul TFLOP/s and copy GB/s, which planner/cost/calibration.yaml's hopper entry is derived from; the
header prints both so a mismatch shows). With --profile FILE (an H100 profile from
`planner profile --device cuda --dtype amp-bf16 --seq-len 2048 --microbatch-size 1,2,4,8`), compute comes
from the measurement.

    python benchmarks/tinyllama_accuracy.py [--profile profiles/h100-tinyllama.json] [--check]

Time (planner.cost.eager): the recipe's aten operators are counted per layer from HF's modeling code (48
forward, 87 backward, 46 recomputed per TinyLlama layer), their bytes move at the measured copy bandwidth, and
each phase takes max(device + operators x eager_kernel_s, operators x eager_host_op_s). The two constants are
derived from these rows (calibration.yaml, hopper); the run prints them re-derived and, for each row, the
prediction with the constants derived from the other seven rows (leave-one-row-out).

Memory: the cost model's peak_bytes is the allocated peak plus the allocator allowance of
planner/cost/calibration.yaml (fixed + fraction x allocated, an envelope of reserved memory). The file's
peak_alloc_gib is allocated memory, so the table compares the allocated prediction, (peak - fixed) / (1 +
fraction), with it, and the full peak with peak_reserved_gib.

--check exits 1 when any row misses the 10% tolerance on time or allocated memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from planner import api
from planner.cost.calibration import device_calibration
from planner.cost.derivation import implied_value
from planner.cost.model import CostModel
from planner.cost.stack import hf_eager_options
from planner.schemas.plan import Configuration, Parallelism
from planner.units import GiB

VALIDATION = Path(__file__).resolve().parents[1] / "validation" / "h100_hf_tinyllama.jsonl"
TOLERANCE = 0.10
H100_PEAK_BF16_TFLOPS = 989.0  # dense, SXM5 datasheet
DEVICE_BOUND_MBS = 4  # rows from this micro-batch up derive eager_kernel_s; micro-batch 1 rows derive eager_host_op_s


def load_rows(path: Path) -> tuple[dict, list[dict]]:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    ceilings = next(r for r in rows if r.get("probe") == "ceilings")
    return ceilings, [r for r in rows if r.get("status") == "ok"]


def request_of(row: dict, *, profile: str | None = None):
    return api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=row["micro_batch"],
                             seq_len=row["seq"], precision="amp-bf16", profile=profile)


def config_of(row: dict) -> Configuration:
    return Configuration(parallelism=Parallelism(dp=1, tp=1, pp=1), microbatch_size=row["micro_batch"],
                         recompute="full" if row["checkpointing"] else "none")


def predict(row: dict, *, profile: str | None):
    """The row's estimate as HuggingFace's recipe (planner.cost.stack.hf_eager_options: the planner stack's options
    without its executor facts, since these rows ran transformers' modeling code, not planner/nn)."""
    from types import SimpleNamespace

    from planner.cost.notes import candidate_of

    request = request_of(row, profile=profile)
    ev = CostModel(request, options=hf_eager_options("amp-bf16")).evaluate(candidate_of(request, config_of(row)))
    return SimpleNamespace(prediction=SimpleNamespace(step_time_s=ev.step_time_s), memory=SimpleNamespace(peak_bytes=ev.peak_bytes))


def step_with(row: dict, **constants: float) -> float:
    """Predicted step time of `row` with the hopper calibration's eager constants replaced by `constants`."""
    from planner.cost.notes import candidate_of

    request = request_of(row)
    cal = dataclasses.replace(device_calibration(request.topology.device, "planner", eager=True), **constants)
    return CostModel(request, calibration=cal, options=hf_eager_options("amp-bf16")).evaluate(
        candidate_of(request, config_of(row))).step_time_s


def derive_eager_constants(rows: list[dict]) -> dict[str, float]:
    """The eager constants of calibration.yaml (hopper) from `rows`: eager_kernel_s, the median over the device-bound
    rows (micro-batch >= 4) of the per-kernel device time at which the model with no host cost reproduces each row;
    then eager_host_op_s, the median over the host-bound rows (micro-batch 1) of the per-operator host time at
    which the model with that kernel time reproduces each row."""
    device_rows = [r for r in rows if r["micro_batch"] >= DEVICE_BOUND_MBS]
    host_rows = [r for r in rows if r["micro_batch"] == 1]
    kernel = statistics.median(implied_value(lambda x, r=r: step_with(r, eager_kernel_s=x, eager_host_op_s=0.0), r["step_s"])
                               for r in device_rows)
    host = statistics.median(implied_value(lambda x, r=r: step_with(r, eager_kernel_s=kernel, eager_host_op_s=x), r["step_s"])
                             for r in host_rows)
    return {"eager_kernel_s": kernel, "eager_host_op_s": host}


def leave_one_out(rows: list[dict]) -> list[str]:
    """Each row predicted with the eager constants derived from the other seven."""
    lines = [f"{'mbs':>3} {'ckpt':>5} | {'kernel us':>9} {'host us':>7} | {'step s':>7} {'pred s':>7} {'err':>7}"]
    worst = 0.0
    for index, row in enumerate(rows):
        constants = derive_eager_constants(rows[:index] + rows[index + 1:])
        step = step_with(row, **constants)
        worst = max(worst, abs(step / row["step_s"] - 1))
        lines.append(f"{row['micro_batch']:>3} {str(row['checkpointing']):>5} | {constants['eager_kernel_s'] * 1e6:9.2f} "
                     f"{constants['eager_host_op_s'] * 1e6:7.2f} | {row['step_s']:7.4f} {step:7.4f} {step / row['step_s'] - 1:+7.1%}")
    lines.append(f"worst |error| leave-one-row-out: {worst:.1%}")
    return lines


def header(ceilings: dict, profile: str | None) -> str:
    from planner.cost.calibration import device_calibration

    topology = api.load_topology("dgx-h100")
    cal = device_calibration(topology.device, "planner", eager=True)
    source = (f"compute from profile {profile}" if profile else
              "analytic cost model with the H100's measured ceilings (no H100 profile: no GPU in this session)")
    return (f"TinyLlama-1.1B on {ceilings['device']} (torch {ceilings['torch']}): {source}\n"
            f"ceilings row: bf16 matmul {ceilings['bf16_matmul_tflops']:.1f} TFLOP/s = "
            f"{ceilings['bf16_matmul_tflops'] / H100_PEAK_BF16_TFLOPS:.3f} of {H100_PEAK_BF16_TFLOPS:.0f}, copy "
            f"{ceilings['copy_gbps']:.0f} GB/s = {ceilings['copy_gbps'] / topology.device.hbm_bandwidth_GBps:.3f} of "
            f"{topology.device.hbm_bandwidth_GBps:.0f}; cost model uses {cal.matmul_ceiling_fraction:.3f} and {cal.hbm_efficiency:.3f} "
            f"({cal.family}); eager recipe: {cal.eager_kernel_s * 1e6:.2f} us device per kernel, {cal.eager_host_op_s * 1e6:.2f} us "
            f"host per operator")


def table(rows: list[dict], *, profile: str | None) -> tuple[list[str], float, float]:
    from planner.cost.calibration import memory_calibration

    cal = memory_calibration()
    lines = [f"{'mbs':>3} {'ckpt':>5} | {'step s':>7} {'min-max of 6':>13} {'pred s':>7} {'err':>7} | {'alloc GiB':>9} {'pred':>6} {'err':>7} | "
             f"{'reserved':>8} {'pred':>6} {'err':>7}"]
    worst_time = worst_mem = 0.0
    for row in rows:
        plan = predict(row, profile=profile)
        step, peak = plan.prediction.step_time_s, plan.memory.peak_bytes
        allocated = (peak - cal.fragmentation_fixed_bytes) / (1 + cal.fragmentation_fraction) / GiB
        time_err, mem_err = step / row["step_s"] - 1, allocated / row["peak_alloc_gib"] - 1
        reserved_err = peak / GiB / row["peak_reserved_gib"] - 1
        worst_time, worst_mem = max(worst_time, abs(time_err)), max(worst_mem, abs(mem_err))
        lines.append(f"{row['micro_batch']:>3} {str(row['checkpointing']):>5} | {row['step_s']:7.4f} "
                     f"{row['step_s_min']:6.4f}-{row['step_s_max']:6.4f} {step:7.4f} {time_err:+7.1%} | "
                     f"{row['peak_alloc_gib']:9.2f} {allocated:6.2f} {mem_err:+7.1%} | {row['peak_reserved_gib']:8.2f} "
                     f"{peak / GiB:6.2f} {reserved_err:+7.1%}")
    return lines, worst_time, worst_mem


def diagnosis(rows: list[dict], *, profile: str | None) -> list[str]:
    """Where the time goes: the per-sequence slope between the two largest micro-batches (device-bound), and at
    micro-batch 1 the host time (aten operators x eager_host_op_s, planner.cost.eager) against the device time."""
    from planner.cost import eager
    from planner.cost.compute import Shape
    from planner.models import load_model

    spec, cal = load_model("tinyllama-1.1b"), device_calibration(api.load_topology("dgx-h100").device, "planner", eager=True)
    lines = []
    for ckpt in (False, True):
        sub = sorted((r for r in rows if r["checkpointing"] == ckpt), key=lambda r: r["micro_batch"])
        small, large, first = sub[-2], sub[-1], sub[0]
        span = large["micro_batch"] - small["micro_batch"]
        measured = (large["step_s"] - small["step_s"]) / span
        predicted = (predict(large, profile=profile).prediction.step_time_s
                     - predict(small, profile=profile).prediction.step_time_s) / span
        fwd, bwd = eager.step_ops(spec, Shape(microbatch_size=first["micro_batch"], seq_len=first["seq"]), recompute=ckpt)
        lines.append(f"checkpointing={ckpt}: per-sequence time {measured * 1e3:.1f} ms measured vs {predicted * 1e3:.1f} ms predicted "
                     f"(mbs {small['micro_batch']}->{large['micro_batch']}); mbs {first['micro_batch']}: {fwd} + {bwd} operators x "
                     f"{cal.eager_host_op_s * 1e6:.1f} us = {(fwd + bwd) * cal.eager_host_op_s:.3f} s host against "
                     f"{step_with(first, eager_host_op_s=0.0):.3f} s device (step {first['step_s']:.3f} s measured)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default=None, help="an H100 profile of tinyllama-1.1b (amp-bf16, seq 2048)")
    parser.add_argument("--validation", type=Path, default=VALIDATION)
    parser.add_argument("--check", action="store_true", help=f"exit 1 if any row is off by more than {TOLERANCE * 100:.0f}%%")
    args = parser.parse_args(argv)
    ceilings, rows = load_rows(args.validation)
    lines, worst_time, worst_mem = table(rows, profile=args.profile)
    print(header(ceilings, args.profile))
    print("\n".join(lines))
    print(f"worst |error|: time {worst_time:.1%}, allocated peak memory {worst_mem:.1%} (tolerance {TOLERANCE:.0%})")
    print("\n".join(diagnosis(rows, profile=args.profile)))
    if args.profile is None:
        shipped = device_calibration(api.load_topology("dgx-h100").device, "planner", eager=True)
        derived = derive_eager_constants(rows)
        print("eager constants derived from these rows (calibration.yaml hopper ships): "
              + ", ".join(f"{k} {v * 1e6:.2f} us ({getattr(shipped, k) * 1e6:.2f})" for k, v in derived.items()))
        print("\n".join(leave_one_out(rows)))
    return 1 if args.check and max(worst_time, worst_mem) > TOLERANCE else 0


if __name__ == "__main__":
    sys.exit(main())
