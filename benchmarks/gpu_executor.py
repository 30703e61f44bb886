"""The GPU truth loop of the `planner` stack: plan, run and measure a matrix of our executor's plans on one GPU.

For each model of the matrix (TinyLlama-1.1B, a wider dense 4-layer Llama-3-8B shape, a Mixtral-style MoE, a
fine-grained Qwen3-MoE-style MoE) it asks the planner the way a user does, through planner.api (what `planner plan`
and `planner estimate` call): the planner's own first choice (`plan`), then fixed configurations (`estimate`) over
both bf16 recipes (bf16, amp-bf16), recompute none/selective/full and micro-batch 1-8, plus one configuration
predicted not to fit; and runs each with the executor (`planner run --device cuda`: planner.executor.run.run_plan,
torchrun + NCCL). A run that dies with CUDA out of memory is a row with status "oom"; any other failure is status
"error" with its message. Rows are written as they finish to profiles/executor-<device>.json (a superset of
validation/h100_executor_runs.json's row format, plus the prediction, the recipe that ran and the wall time), with
the command that made the file, the device, torch and the commit.

Budget (one H100, under 7 minutes of device time): each run takes its startup (torchrun, imports, initialising the
weights; measured on the first run, STARTUP_PRIOR_S before) plus `--steps` steps of its predicted step time; a row
whose estimate would pass `--budget-s` is skipped and listed under "skipped", in the matrix's priority order.

    # on the lent GPU (device image: python 3.12, torch 2.11, no pydantic/pulp: carry them as wheels). Here, once:
    echo /.whl/ >> .git/info/exclude
    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl \
        pydantic==2.13.4 pydantic_core==2.46.4 annotated_types==0.7.0 typing_inspection==0.4.2 \
        typing_extensions==4.16.0 PuLP==3.3.2        # 19 MB; checked with pip download on 2026-11-27
    # the device command (run tool, carry [".whl"], timeout_s 540):
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 || exit; \
        python3 benchmarks/gpu_executor.py --budget-s 400 -o $OUT/executor-h100.json
    # then here: copy it to profiles/executor-h100.json, and fit the stack's constants from it (CPU only):
    python benchmarks/gpu_executor.py --derive profiles/executor-h100.json validation/h100_executor_runs.json

    python benchmarks/gpu_executor.py --smoke -o /tmp/executor-smoke.json   # CPU, gloo, tiny shapes, same format

--derive is benchmarks/executor_constants.py: it rewrites the calibration entries this loop owns.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STARTUP_PRIOR_S = 25.0  # torchrun + imports + weight init of a 1B model, before the first run measures it
SAFETY = 1.3  # a run's estimate: (startup + steps x predicted step) x SAFETY
LLAMA3_8B_4L = {"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 4,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192,
                "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
MIXTRAL_SMALL = {"model_type": "mixtral", "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 8,
                 "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000, "num_local_experts": 8,
                 "num_experts_per_tok": 2, "max_position_embeddings": 8192, "tie_word_embeddings": False,
                 "rms_norm_eps": 1e-5, "rope_theta": 1e6}
QWEN3_MOE_SMALL = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "moe_intermediate_size": 768,
                   "num_hidden_layers": 4, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                   "vocab_size": 151936, "num_experts": 32, "num_experts_per_tok": 8, "norm_topk_prob": True,
                   "decoder_sparse_step": 1, "mlp_only_layers": [], "max_position_embeddings": 8192,
                   "tie_word_embeddings": False, "rms_norm_eps": 1e-6, "rope_theta": 1e6}
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256, "max_position_embeddings": 128,
              "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
TINY_MIXTRAL = {**TINY_LLAMA, "model_type": "mixtral", "num_local_experts": 4, "num_experts_per_tok": 2}


@dataclass(frozen=True)
class Case:
    """One row of the matrix: a model at a sequence length and global batch, and a configuration (None: plan)."""

    name: str
    model: str | dict  # a preset name or an HF config dict
    seq_len: int
    global_batch_size: int
    precision: str = "bf16"
    microbatch_size: int | None = None  # None: the planner's first choice (`planner plan`)
    recompute: str = "none"


@dataclass
class Settings:
    topology: str
    device: str  # "cuda" or "cpu"
    steps: int
    warmup_steps: int
    budget_s: float
    cases: list[Case] = field(default_factory=list)


def _model_cases(tag: str, model, seq: int, batch: int, mbs: tuple[int, ...], extra: tuple[Case, ...] = ()) -> list[Case]:
    """First choice, then bf16 over micro-batches without recompute, then the extra cases of this model."""
    first = [Case(f"{tag}_plan", model, seq, batch)]
    sweep = [Case(f"{tag}_m{m}_none", model, seq, batch, microbatch_size=m) for m in mbs]
    return first + sweep + list(extra)


def h100_matrix() -> list[Case]:
    """Priority order (the budget skips from the end of each pass): first choices and one row per model first."""
    tl, ll, mx, qw = "tinyllama-1.1b", LLAMA3_8B_4L, MIXTRAL_SMALL, QWEN3_MOE_SMALL
    passes = [
        [Case("tl_plan", tl, 2048, 32), Case("ll_plan", ll, 2048, 16), Case("mx_plan", mx, 4096, 8), Case("qw_plan", qw, 2048, 16)],
        [Case("tl_m4_none", tl, 2048, 32, microbatch_size=4), Case("ll_m2_none", ll, 2048, 16, microbatch_size=2),
         Case("mx_m2_none", mx, 4096, 8, microbatch_size=2), Case("qw_m2_none", qw, 2048, 16, microbatch_size=2)],
        [Case("tl_m4_amp", tl, 2048, 32, "amp-bf16", 4), Case("tl_m8_full", tl, 2048, 32, microbatch_size=8, recompute="full"),
         Case("tl_m4_sel", tl, 2048, 32, microbatch_size=4, recompute="selective"), Case("tl_m16_sel_oom", tl, 2048, 32, microbatch_size=16, recompute="selective")],
        [Case("tl_m1_none", tl, 2048, 32, microbatch_size=1), Case("tl_m2_none", tl, 2048, 32, microbatch_size=2),
         Case("ll_m1_full", ll, 2048, 16, microbatch_size=1, recompute="full"), Case("ll_m4_sel", ll, 2048, 16, microbatch_size=4, recompute="selective"),
         Case("mx_m1_amp", mx, 4096, 8, "amp-bf16", 1), Case("qw_m4_full", qw, 2048, 16, microbatch_size=4, recompute="full")],
        [Case("tl_m8_none", tl, 2048, 32, microbatch_size=8), Case("ll_m8_full", ll, 2048, 16, microbatch_size=8, recompute="full"),
         Case("mx_m4_full", mx, 4096, 8, microbatch_size=4, recompute="full"), Case("qw_m8_sel", qw, 2048, 16, microbatch_size=8, recompute="selective")],
    ]
    return [case for group in passes for case in group]


def smoke_matrix() -> list[Case]:
    """CPU (gloo): the same code path on tiny shapes: a first choice, a dense and an MoE configuration."""
    return [Case("tiny_plan", TINY_LLAMA, 64, 4), Case("tiny_m2_amp", TINY_LLAMA, 64, 4, "amp-bf16", 2),
            Case("tinymoe_m2_sel", TINY_MIXTRAL, 64, 4, microbatch_size=2, recompute="selective")]


def request_of(case: Case, topology: str):
    from planner import api
    from planner.models.hf import spec_from_hf_config

    model = case.model if isinstance(case.model, str) else spec_from_hf_config(dict(case.model), name=case.name.split("_")[0])
    return api.build_request(model=model, topology=topology, gpus=1, global_batch_size=case.global_batch_size,
                             seq_len=case.seq_len, precision=case.precision)


def plan_of(case: Case, topology: str):
    """`planner plan` (microbatch_size None) or `planner estimate --dp 1 --tp 1 --pp 1 --zero 0` for the case."""
    from planner import api
    from planner.schemas.plan import Configuration, Parallelism

    request = request_of(case, topology)
    if case.microbatch_size is None:
        return api.plan(request)
    config = Configuration(parallelism=Parallelism(dp=1, tp=1, pp=1, zero_stage=0), microbatch_size=case.microbatch_size,
                           recompute=case.recompute)
    return api.estimate(request, config)


def recipe_of(precision: str) -> str:
    """The recipe the executor runs for a precision, as its profile says at run time (behaviour.executor)."""
    from planner.frameworks import load_framework

    if precision == "bf16":
        return load_framework("planner").behaviour.executor.bf16_recipe
    return {"amp-bf16": "autocast"}.get(precision, precision)


def executor_facts() -> dict:
    """The implementation facts of the executor that runs the row (planner/data/frameworks/planner.yaml behaviour.executor), so
    --derive and the accuracy benchmark price each row as it ran even after the profile changes."""
    from planner.frameworks import load_framework

    facts = load_framework("planner").behaviour.executor
    return {"bf16_recipe": facts.bf16_recipe, "moe_expert_impl": facts.moe_expert_impl, "adamw_impl": facts.adamw_impl,
            "sdpa_gqa": facts.sdpa_gqa}


def classify_failure(message: str) -> str:
    """"oom" for a CUDA (or host) out-of-memory failure, else "error"."""
    text = message.lower()
    return "oom" if ("out of memory" in text or "outofmemoryerror" in text) else "error"


def base_row(case: Case, plan, settings: Settings, device_name: str, torch_version: str, commit: str) -> dict:
    """The row in validation/h100_executor_runs.json's format, with the prediction and the recipe."""
    par, batch = plan.parallelism, plan.batch
    return {"name": case.name, "preset": case.model if isinstance(case.model, str) else None, "hf_config": None,
            "gpus": 1, "topology": settings.topology, "seq_len": batch.seq_len, "global_batch_size": batch.global_batch_size,
            "microbatch_size": batch.microbatch_size, "recompute": plan.stages[0].recompute.mode,
            "precision": plan.request.precision, "zero": par.zero_stage, "chosen_by_plan": case.microbatch_size is None,
            "recipe": recipe_of(plan.request.precision), "device": device_name, "torch": torch_version,
            "executor": f"planner run --device {settings.device}, {commit}, {settings.steps} steps, {settings.warmup_steps} warm-up",
            "date": datetime.date.today().isoformat(), "predicted_step_time_s": plan.prediction.step_time_s,
            "predicted_peak_bytes": plan.memory.peak_bytes, "predicted_fits": plan.memory.fits,
            "executor_facts": executor_facts(),
            **({} if isinstance(case.model, str) else {"hf_config_json": dict(case.model)})}


def run_case(plan, settings: Settings) -> dict:
    """Run the plan with the executor; the measured fields, or status oom/error with the message."""
    from planner.errors import PlannerError
    from planner.executor.run import run_plan
    from planner.launch_spec.options import RunOptions

    options = RunOptions(steps=settings.steps, device=settings.device, timeout_s=300)
    try:
        report = run_plan(plan, options=options, warmup_steps=settings.warmup_steps)
    except PlannerError as exc:
        return {"status": classify_failure(str(exc)), "message": str(exc)[-600:]}
    return {"status": "ok", "step_time_s": report.step_time_s, "peak_bytes": max(m.peak_bytes for m in report.memory),
            "step_times_s": list(report.step_times_s), "mfu": report.mfu, "tokens_per_s": report.tokens_per_s}


def environment(device: str) -> tuple[str, str, str]:
    """(device name with memory, torch version, git commit) of this machine."""
    import torch

    name = "cpu"
    if device == "cuda":
        props = torch.cuda.get_device_properties(0)
        name = f"{props.name} ({props.total_memory // 2**20} MiB)"
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                check=False, timeout=10).stdout.strip() or "unknown commit"
    except (OSError, subprocess.SubprocessError):
        commit = "unknown commit"
    return name, torch.__version__, commit


def estimate_s(plan, startup_s: float, settings: Settings) -> float:
    step = plan.prediction.step_time_s if plan.memory.fits else 0.0  # an OOM dies at step 1
    return (startup_s + settings.steps * step) * SAFETY


def run_matrix(settings: Settings, output: Path, command: str) -> dict:
    """Plan, budget and run every case; the report is rewritten after each row (a killed run keeps its rows)."""
    from planner.io import atomic_write_text

    device_name, torch_version, commit = environment(settings.device)
    report = {"schema": "executor-runs/1", "command": command, "device": device_name, "torch": torch_version,
              "commit": commit, "budget_s": settings.budget_s, "rows": [], "skipped": []}
    started, startup_s = time.perf_counter(), STARTUP_PRIOR_S
    for case in settings.cases:
        try:
            plan = plan_of(case, settings.topology)
        except Exception as exc:  # a case the planner refuses is reported, not fatal
            report["skipped"].append({"name": case.name, "why": f"planner: {exc}"})
            continue
        elapsed = time.perf_counter() - started
        if elapsed + estimate_s(plan, startup_s, settings) > settings.budget_s:
            report["skipped"].append({"name": case.name, "why": f"budget: {elapsed:.0f} s used of {settings.budget_s:.0f} s"})
            continue
        begin = time.perf_counter()
        row = {**base_row(case, plan, settings, device_name, torch_version, commit), **run_case(plan, settings)}
        row["wall_s"] = time.perf_counter() - begin
        if row["status"] == "ok" and not report["rows"]:
            startup_s = max(5.0, row["wall_s"] - sum(row["step_times_s"]))
        report["rows"].append(row)
        print(f"{row['name']:16s} {row['status']:5s} mb {row['microbatch_size']} {row['recompute']:9s} {row['precision']:8s} "
              f"pred {row['predicted_step_time_s']:.3f} s meas {row.get('step_time_s', float('nan')):.3f} s "
              f"peak {row.get('peak_bytes', 0) / 2**30:.2f} GiB wall {row['wall_s']:.0f} s", flush=True)
        atomic_write_text(output, json.dumps(report, indent=1, sort_keys=True) + "\n")
    report["wall_s"] = time.perf_counter() - started
    atomic_write_text(output, json.dumps(report, indent=1, sort_keys=True) + "\n")
    return report


def settings_for(args) -> Settings:
    if args.smoke:
        return Settings(topology="cpu", device="cpu", steps=2, warmup_steps=1, budget_s=args.budget_s, cases=smoke_matrix())
    return Settings(topology=args.topology, device="cuda", steps=args.steps, warmup_steps=2, budget_s=args.budget_s,
                    cases=h100_matrix())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-o", "--output", type=Path, default=None, help="report file (default profiles/executor-<device>.json)")
    parser.add_argument("--smoke", action="store_true", help="CPU, gloo, tiny shapes: the same code path and format")
    parser.add_argument("--topology", default="dgx-h100")
    parser.add_argument("--steps", type=int, default=4, help="steps per run (2 of them warm-up on a GPU)")
    parser.add_argument("--budget-s", type=float, default=400.0, help="wall seconds for the whole matrix")
    parser.add_argument("--derive", nargs="+", type=Path, default=None, metavar="FILE",
                        help="fit the planner stack's constants from executor-run files (CPU) and rewrite calibration.yaml")
    parser.add_argument("--dry-run", action="store_true", help="with --derive: print, do not rewrite calibration.yaml")
    args = parser.parse_args(argv)
    if args.derive:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from executor_constants import derive_and_write

        return derive_and_write(args.derive, write_file=not args.dry_run)
    settings = settings_for(args)
    default = Path(tempfile.gettempdir()) / "executor-smoke.json" if args.smoke else ROOT / "profiles" / "executor-h100.json"
    output = args.output or default
    command = "python benchmarks/gpu_executor.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    report = run_matrix(settings, output, command)
    for row in report["rows"]:
        if row["status"] == "ok":
            print(f"{row['name']:16s} MFU {row['mfu'] or 0:.1%}  time error {row['predicted_step_time_s'] / row['step_time_s'] - 1:+.1%}  "
                  f"peak {row['peak_bytes'] / 2**30:.2f} GiB (predicted with allowance {row['predicted_peak_bytes'] / 2**30:.2f})")
        else:
            print(f"{row['name']:16s} {row['status']}: predicted to fit {row['predicted_fits']}")
    ok = sum(r["status"] == "ok" for r in report["rows"])
    print(f"{ok} ok, {len(report['rows']) - ok} failed (oom/error), {len(report['skipped'])} skipped; {report['wall_s']:.0f} s; "
          f"written {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
