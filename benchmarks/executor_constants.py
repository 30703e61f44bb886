"""The `planner` stack's own constants on a device family, fitted from our executor's measured runs (no GPU needed):
`python benchmarks/gpu_executor.py --derive FILE...` (files written by gpu_executor.py, or
validation/h100_executor_runs.json, whose rows have the same format).

What it fits, and how (the planner.cost.executor model with everything else fixed: the measured GEMM ceiling and
per-call time, the attention rates, HBM efficiency, the operator counts of the executor's code):
- eager_kernel_s: device time per kernel beyond its bytes and FLOPs; the median, over the device-bound rows, of the
  value at which the model without host cost reproduces the row;
- eager_host_op_s: host time per operator; the median, over the host-bound rows, of the value at which the model with
  that kernel time reproduces the row. A row is device-bound when the family's shipped host time moves its
  prediction by no more than HOST_SENSITIVITY; host-bound when it does and the device alone (host time 0) would run
  more than HOST_SENSITIVITY faster than measured. Without host-bound rows the family's value is kept (the rows
  say nothing about the host).
Each is the stack's entry of calibration.yaml's `stack_eager` for the family (read by
planner.cost.calibration.device_calibration for the eager recipe). It prints each row's prediction with the constants
derived from the other rows (leave-one-row-out) before writing. Rows that ran bf16 as autocast are priced as amp-bf16
(benchmarks/executor_h100_accuracy.precision_as_run). Memory needs no fitted constant here: the allocated peak is
counted from the code (planner.cost.executor); the allocator's reserved allowance would need max_memory_reserved,
which the executor's run report does not record.
"""

from __future__ import annotations

import dataclasses
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION_FILE = ROOT / "planner" / "cost" / "calibration.yaml"
STACK = "planner"
HOST_SENSITIVITY = 0.02


def _accuracy():
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import executor_h100_accuracy

    return executor_h100_accuracy


def load(paths: list[Path]) -> list[dict]:
    """The ok rows of every file that ran on a GPU (a CPU smoke report has nothing to fit)."""
    bench = _accuracy()
    rows = [row for path in paths for row in bench.load_rows(path)]
    return [r for r in rows if r["status"] == "ok" and "cpu" not in r.get("device", "cpu").lower()]


def step_with(row: dict, **constants: float) -> float:
    """The row's predicted step time with the family's eager constants for the stack replaced by `constants`."""
    from planner.cost.calibration import device_calibration
    from planner.cost.model import CostModel
    from planner.cost.notes import candidate_of
    from planner.schemas.plan import Configuration, Parallelism

    request = _accuracy().request_of(row)
    cal = dataclasses.replace(device_calibration(request.topology.device, STACK, eager=True), **constants)
    config = Configuration(parallelism=Parallelism(dp=1, tp=1, pp=1, zero_stage=row.get("zero", 0)),
                           microbatch_size=row["microbatch_size"], recompute=row["recompute"])
    options = _accuracy().options_as_run(row, request)
    return CostModel(request, calibration=cal, options=options).evaluate(candidate_of(request, config)).step_time_s


def host_bound(row: dict, host_op_s: float) -> bool:
    return step_with(row, eager_host_op_s=host_op_s) > (1 + HOST_SENSITIVITY) * step_with(row, eager_host_op_s=0.0)


def derive(rows: list[dict], prior_host_op_s: float) -> dict[str, float]:
    """eager_kernel_s and eager_host_op_s of the stack from `rows` (module docstring)."""
    from planner.cost.derivation import implied_value

    sensitive = [r for r in rows if host_bound(r, prior_host_op_s)]
    devices = [r for r in rows if r not in sensitive] or rows
    kernel = statistics.median(implied_value(lambda x, r=r: step_with(r, eager_kernel_s=x, eager_host_op_s=0.0),
                                             r["step_time_s"], high=1e-4) for r in devices)
    # a row measures the host only where the device alone would be faster than it ran
    hosts = [r for r in sensitive
             if step_with(r, eager_kernel_s=kernel, eager_host_op_s=0.0) < (1 - HOST_SENSITIVITY) * r["step_time_s"]]
    host = prior_host_op_s
    if hosts:
        host = statistics.median(implied_value(lambda x, r=r: step_with(r, eager_kernel_s=kernel, eager_host_op_s=x),
                                               r["step_time_s"], high=1e-3) for r in hosts)
    return {"eager_kernel_s": kernel, "eager_host_op_s": host}


def leave_one_out(rows: list[dict], prior_host_op_s: float) -> list[float]:
    """Each row's error predicted with the constants derived from the other rows."""
    errors = []
    for index, row in enumerate(rows):
        others = rows[:index] + rows[index + 1:]
        constants = derive(others, prior_host_op_s) if others else {}
        errors.append(step_with(row, **constants) / row["step_time_s"] - 1)
    return errors


def write(constants: dict[str, float], path: Path = CALIBRATION_FILE, family_match: str = "H100") -> None:
    """Rewrite the `stack_eager:` line of the family whose match list names `family_match` (added after its
    eager_host_op_s line when absent)."""
    text = path.read_text(encoding="utf-8")
    line = (f"    stack_eager: {{{STACK}: {{eager_kernel_s: {constants['eager_kernel_s']:.3e}, "
            f"eager_host_op_s: {constants['eager_host_op_s']:.3e}}}}}  # derived by benchmarks/gpu_executor.py --derive")
    start = text.index(f'"{family_match}"')
    end = text.find("\n  - family:", start)
    stop = end if end >= 0 else len(text)
    block = text[start:stop]
    if re.search(r"^    stack_eager:.*$", block, flags=re.M):
        block = re.sub(r"^    stack_eager:.*$", line, block, count=1, flags=re.M)
    else:
        block = re.sub(r"^(    eager_host_op_s:.*)$", lambda m: m.group(1) + "\n" + line, block, count=1, flags=re.M)
    path.write_text(text[:start] + block + text[stop:], encoding="utf-8")


def derive_and_write(paths: list[Path], *, write_file: bool = True) -> int:
    from planner.cost import calibration

    rows = load(paths)
    if not rows:
        print("no ok GPU rows in " + ", ".join(map(str, paths)) + ": nothing to fit (a --smoke report runs on the CPU)")
        return 1
    request = _accuracy().request_of(rows[0])
    family = calibration.device_calibration(request.topology.device)
    constants = derive(rows, family.eager_host_op_s)
    errors = leave_one_out(rows, family.eager_host_op_s)
    for row, error in zip(rows, errors):
        print(f"{row['name']:16s} measured {row['step_time_s']:.3f} s, leave-one-row-out error {error:+.1%}")
    print(f"{STACK} on {family.family}: eager_kernel_s {constants['eager_kernel_s'] * 1e6:.2f} us, eager_host_op_s "
          f"{constants['eager_host_op_s'] * 1e6:.2f} us (family's: {family.eager_kernel_s * 1e6:.2f}, "
          f"{family.eager_host_op_s * 1e6:.2f}); leave-one-row-out |error| median "
          f"{statistics.median(abs(e) for e in errors):.1%} max {max(abs(e) for e in errors):.1%} over {len(rows)} rows")
    if write_file:
        write(constants)
        calibration.reload()
        print(f"written {CALIBRATION_FILE.relative_to(ROOT)} (stack_eager)")
    return 0
