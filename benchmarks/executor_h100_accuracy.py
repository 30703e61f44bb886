"""Our executor on one H100: predicted vs measured step time and peak memory, and the planner's first choices.

Measured: validation/h100_executor_runs.json (or --rows FILE in the same format, e.g. a profiles/executor-<device>.json
written by benchmarks/gpu_executor.py): `planner run --device cuda` of LaunchPlans for `--topology dgx-h100 --gpus 1`,
median step time after warm-up, peak = torch.cuda.max_memory_allocated, or status "oom".

Predicted: the cost model of the `planner` stack (planner/cost/executor.py: the executor's own code) for the row's
model, sequence, batch, micro-batch, recompute and the precision *as it ran*. Reading rule: every row measured at
c162dfb ran `bf16` as fp32 parameters under torch.autocast, exactly as `amp-bf16` (c162dfb:planner/executor/runtime.py
parallelize_part sets autocast_dtype for any non-fp32 precision without FSDP2; parallelize.py mp_policy maps bf16 and
amp-bf16 to one policy; the rows of both precisions measure identical peaks), so such rows are priced as amp-bf16.
Rows written by gpu_executor.py carry the recipe that ran in `recipe`.

Memory: the model's allocated peak, (peak - fixed) / (1 + fraction) with the stack's allocator allowance, is compared
with the measured allocated peak (margin = predicted / measured - 1; must not be below -3%); the full peak (with the
allowance, what `fits` tests against the usable memory) is printed beside it. An OOM row must be predicted not to fit.
Time: error = predicted / measured - 1 (must: median |error| <= 10%, max <= 25%).
Ablations: the same rows with one mechanism of the executor's pricing switched off (its CostOptions fact).
First choices: `planner plan` (api.plan) for each distinct request must choose a plan that fits by these formulas.

    python benchmarks/executor_h100_accuracy.py [--rows FILE] [--json OUT] [--check]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from planner import api
from planner.cost.model import CostModel
from planner.cost.notes import candidate_of
from planner.cost.stack import options_for
from planner.schemas.plan import Configuration, Parallelism
from planner.units import GiB

ROOT = Path(__file__).resolve().parents[1]
ROWS = ROOT / "validation" / "h100_executor_runs.json"
AUTOCAST_COMMITS = ("c162dfb",)  # executor code that ran bf16 as amp-bf16 (module docstring)
C162DFB_FACTS = {"bf16_recipe": "autocast", "moe_expert_impl": "loop", "adamw_impl": "foreach", "sdpa_gqa": "repeat"}
"""The executor facts at c162dfb (planner/data/frameworks/planner.yaml behaviour.executor cites where each is in its code)."""
MUST = {"memory_under": -0.03, "time_median": 0.10, "time_max": 0.25}
ABLATIONS = {
    "executor code off (generic formulas, bf16 as FSDP-style fp32 master + fused kernels)": {"executor_code": False,
                                                                                             "bf16_autocast": False},
    "MoE priced as grouped GEMMs (no per-expert loop)": {"moe_expert_impl": "grouped"},
    "AdamW priced fused (not foreach)": {"adamw_impl": "fused"},
    "GQA priced inside SDPA (k, v not repeated)": {"sdpa_gqa": "native"},
}


def load_rows(path: Path = ROWS) -> list[dict]:
    """The rows of an executor-runs file: a list, or a gpu_executor.py report with its rows under "rows"."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return data["rows"] if isinstance(data, dict) else data


def precision_as_run(row: dict) -> str:
    """The recipe the row's executor ran (module docstring: the reading rule)."""
    if row.get("recipe") == "autocast" or (row["precision"] == "bf16" and any(c in row.get("executor", "") for c in AUTOCAST_COMMITS)):
        return "amp-bf16"
    return row["precision"]


def facts_as_run(row: dict) -> dict:
    """The executor's implementation facts when the row ran: recorded by gpu_executor.py (`executor_facts`), those
    of c162dfb for its rows, else the profile's now."""
    if row.get("executor_facts"):
        return dict(row["executor_facts"])
    if any(c in row.get("executor", "") for c in AUTOCAST_COMMITS):
        return dict(C162DFB_FACTS)
    from planner.frameworks import load_framework

    facts = load_framework("planner").behaviour.executor
    return {"bf16_recipe": facts.bf16_recipe, "moe_expert_impl": facts.moe_expert_impl, "adamw_impl": facts.adamw_impl,
            "sdpa_gqa": facts.sdpa_gqa}


def options_as_run(row: dict, request) -> object:
    """The stack's CostOptions with the row's executor facts (facts_as_run)."""
    facts = facts_as_run(row)
    return dataclasses.replace(options_for(request.framework, request.precision), bf16_autocast=facts["bf16_recipe"] == "autocast",
                               moe_expert_impl=facts["moe_expert_impl"], adamw_impl=facts["adamw_impl"],
                               sdpa_gqa=facts.get("sdpa_gqa", "repeat"))  # rows recorded before the fact: repeat


def model_of(row: dict):
    if row.get("preset"):
        return row["preset"]
    from planner.models.hf import spec_from_hf_config

    return spec_from_hf_config(row["hf_config_json"], name=row["name"])


def request_of(row: dict, *, precision: str | None = None):
    return api.build_request(model=model_of(row), topology=row.get("topology", "dgx-h100"), gpus=row.get("gpus", 1),
                             global_batch_size=row["global_batch_size"], seq_len=row["seq_len"],
                             precision=precision or precision_as_run(row))


def evaluate_row(row: dict, *, changes: dict | None = None, precision: str | None = None, family_eager: bool = False) -> dict:
    """Predicted time, allocated and full peak, and fits, of one row (with CostOptions `changes` for an ablation;
    `family_eager`: the device family's eager constants, measured on HuggingFace's rows, not the stack's own)."""
    request = request_of(row, precision=precision)
    options = options_as_run(row, request)
    if changes:
        options = dataclasses.replace(options, **changes)
    calibration = None
    if family_eager:
        from planner.cost.calibration import device_calibration

        family = device_calibration(request.topology.device)
        calibration = dataclasses.replace(device_calibration(request.topology.device, request.framework, eager=True),
                                          eager_kernel_s=family.eager_kernel_s, eager_host_op_s=family.eager_host_op_s)
    model = CostModel(request, options=options, calibration=calibration)
    config = Configuration(parallelism=Parallelism(dp=1, tp=1, pp=1, zero_stage=row.get("zero", 0)),
                           microbatch_size=row["microbatch_size"], recompute=row["recompute"])
    ev = model.evaluate(candidate_of(request, config))
    cal = model.mem_cal
    allocated = (ev.peak_bytes - cal.fragmentation_fixed_bytes) / (1 + cal.fragmentation_fraction)
    out = {"name": row["name"], "status": row["status"], "precision_priced": request.precision,
           "predicted_step_time_s": ev.step_time_s, "predicted_allocated_bytes": allocated,
           "predicted_peak_bytes": ev.peak_bytes, "usable_bytes": ev.capacity_bytes, "fits": ev.fits}
    if row["status"] == "ok":
        out["measured_step_time_s"] = row["step_time_s"]
        out["measured_peak_bytes"] = row["peak_bytes"]
        out["time_error"] = ev.step_time_s / row["step_time_s"] - 1
        out["memory_margin"] = allocated / row["peak_bytes"] - 1
    return out


def memory_terms(row: dict) -> dict[str, float]:
    """Bytes of each memory mechanism of planner.cost.executor in the row's prediction (for the ablation: the
    allocated margin without it is (allocated - term) / measured - 1)."""
    from planner.cost import executor
    from planner.cost.compute import Shape

    request = request_of(row)
    spec, recipe = request.model, executor.recipe_for(request.precision, bf16_autocast=True)
    shape = Shape(microbatch_size=row["microbatch_size"], seq_len=row["seq_len"])
    a, kv, d, tokens = spec.num_attention_heads, spec.kv_heads, spec.dim_per_head, shape.tokens
    saved = row["recompute"] != "full"
    moe_layers = sum(spec.is_moe_layer(i) for i in range(spec.num_layers))
    terms = {"loss-phase gradients (8*T*V fp32)": executor.loss_transient_bytes(spec, shape, recipe),
             "bf16 logits held through backward": executor.logits_held_bytes(spec, shape, recipe),
             "cuBLAS workspaces": executor.CUBLAS_WORKSPACES_BYTES,
             "GQA k/v expanded before SDPA": saved * spec.num_layers * 2 * recipe.compute * tokens * (a - kv) * d}
    if moe_layers:
        terms["MoE combine product saved by index_add"] = saved * moe_layers * recipe.residual * tokens * spec.moe.top_k * spec.hidden_size
    return terms


def summarise(results: list[dict]) -> dict:
    """Medians and extremes of the ok rows, and whether every OOM row is predicted not to fit."""
    ok = [r for r in results if r["status"] == "ok"]
    errors = [abs(r["time_error"]) for r in ok] or [0.0]
    margins = [r["memory_margin"] for r in ok] or [0.0]
    return {"time_error_median": statistics.median(errors), "time_error_max": max(errors),
            "memory_margin_min": min(margins), "memory_margin_max": max(margins),
            "memory_margin_median": statistics.median(margins),
            "oom_predicted_not_to_fit": all(not r["fits"] for r in results if r["status"] == "oom"),
            "ok_predicted_to_fit": all(r["fits"] for r in ok)}


def must_shows_hold(summary: dict) -> bool:
    return (summary["memory_margin_min"] >= MUST["memory_under"] and summary["time_error_median"] <= MUST["time_median"]
            and summary["time_error_max"] <= MUST["time_max"] and summary["oom_predicted_not_to_fit"])


def first_choices(rows: list[dict]) -> list[dict]:
    """`planner plan` for each distinct (model, seq_len, global batch) of the rows, with the request's own default
    precision (bf16): the chosen configuration, its predicted peak and whether it fits."""
    seen, out = set(), []
    for row in rows:
        key = (row.get("preset") or row["name"], row["seq_len"], row["global_batch_size"])
        if key in seen:
            continue
        seen.add(key)
        plan = api.plan(request_of(row, precision="bf16"))
        out.append({"request": f"{key[0]} seq {key[1]} batch {key[2]}", "microbatch_size": plan.batch.microbatch_size,
                    "recompute": plan.stages[0].recompute.mode, "zero_stage": plan.parallelism.zero_stage,
                    "predicted_step_time_s": plan.prediction.step_time_s, "predicted_peak_bytes": plan.memory.peak_bytes,
                    "usable_bytes": plan.memory.capacity_bytes, "fits": plan.memory.fits})
    return out


def _print(results: list[dict], summary: dict) -> None:
    print(f"{'row':13s} {'status':6s} {'priced':8s} | {'pred s':>7s} {'meas s':>7s} {'err':>7s} | {'alloc GiB':>9s} "
          f"{'meas GiB':>8s} {'margin':>7s} | {'peak GiB':>8s} fits")
    for r in results:
        meas = (f"{r['measured_step_time_s']:7.3f} {r['time_error']:+7.1%}" if r["status"] == "ok" else f"{'-':>7s} {'-':>7s}")
        mem = (f"{r['measured_peak_bytes'] / GiB:8.2f} {r['memory_margin']:+7.1%}" if r["status"] == "ok" else f"{'(' + r['status'] + ')':>8s} {'-':>7s}")
        print(f"{r['name']:13s} {r['status']:6s} {r['precision_priced']:8s} | {r['predicted_step_time_s']:7.3f} {meas} | "
              f"{r['predicted_allocated_bytes'] / GiB:9.2f} {mem} | {r['predicted_peak_bytes'] / GiB:8.2f} {r['fits']}")
    print(f"time |error| median {summary['time_error_median']:.1%} max {summary['time_error_max']:.1%} "
          f"(must <= {MUST['time_median']:.0%} / {MUST['time_max']:.0%}); allocated margin min {summary['memory_margin_min']:+.1%} "
          f"median {summary['memory_margin_median']:+.1%} max {summary['memory_margin_max']:+.1%} (must >= {MUST['memory_under']:+.0%}); "
          f"OOM rows predicted not to fit: {summary['oom_predicted_not_to_fit']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=Path, default=ROWS, help="executor runs (validation format or a gpu_executor.py report)")
    parser.add_argument("--json", type=Path, default=None, help="also write the results here")
    parser.add_argument("--check", action="store_true", help="exit 1 unless every must-show holds")
    args = parser.parse_args(argv)
    rows = load_rows(args.rows)
    results = [evaluate_row(row) for row in rows]
    summary = summarise(results)
    _print(results, summary)
    ablations = {}
    for name, changes in ABLATIONS.items():
        ablated = summarise([evaluate_row(row, changes=changes) for row in rows])
        ablations[name] = ablated
        print(f"ablation, {name}: time |error| median {ablated['time_error_median']:.1%} max {ablated['time_error_max']:.1%}; "
              f"allocated margin {ablated['memory_margin_min']:+.1%}..{ablated['memory_margin_max']:+.1%}; "
              f"OOM predicted not to fit: {ablated['oom_predicted_not_to_fit']}")
    before = summarise([evaluate_row(row, precision=row["precision"], changes={"executor_code": False, "bf16_autocast": False})
                        for row in rows])
    ablations["before (no executor pricing, no reading rule: the row's precision, generic formulas)"] = before
    print(f"ablation, before (no executor pricing, no reading rule): time |error| median {before['time_error_median']:.1%} "
          f"max {before['time_error_max']:.1%}; allocated margin {before['memory_margin_min']:+.1%}..{before['memory_margin_max']:+.1%}; "
          f"OOM predicted not to fit: {before['oom_predicted_not_to_fit']}")
    family = summarise([evaluate_row(row, family_eager=True) for row in rows])
    ablations["the family's eager constants (from the HF rows) instead of the stack's derived ones"] = family
    print(f"ablation, the family's eager constants (from the HF rows) instead of the stack's: time |error| median "
          f"{family['time_error_median']:.1%} max {family['time_error_max']:.1%}")
    bf16 = summarise([evaluate_row(row, precision=row["precision"], changes={"bf16_autocast": False}) for row in rows])
    ablations["reading rule off (bf16 rows priced as bf16 parameters)"] = bf16
    print(f"ablation, reading rule off (bf16 rows priced as bf16 parameters): time |error| median {bf16['time_error_median']:.1%} "
          f"max {bf16['time_error_max']:.1%}; allocated margin {bf16['memory_margin_min']:+.1%}..{bf16['memory_margin_max']:+.1%}; "
          f"OOM predicted not to fit: {bf16['oom_predicted_not_to_fit']}")
    for row, result in zip(rows, results):
        if row["status"] == "ok":
            parts = ", ".join(f"{name} {(result['predicted_allocated_bytes'] - b) / row['peak_bytes'] - 1:+.1%}"
                              for name, b in memory_terms(row).items())
            print(f"memory ablation {row['name']} (allocated margin without the term): {parts}")
    choices = first_choices(rows)
    for c in choices:
        print(f"planner plan {c['request']}: micro-batch {c['microbatch_size']}, recompute {c['recompute']}, zero {c['zero_stage']}, "
              f"{c['predicted_step_time_s']:.3f} s, peak {c['predicted_peak_bytes'] / GiB:.2f} of {c['usable_bytes'] / GiB:.2f} GiB, fits {c['fits']}")
    if args.json is not None:
        from planner.io import atomic_write_text, canonical_json

        atomic_write_text(args.json, canonical_json({"rows": results, "summary": summary, "ablations": ablations,
                                                     "first_choices": choices, "rows_file": str(args.rows)}))
    ok = must_shows_hold(summary) and all(c["fits"] for c in choices)
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
