"""Do the frameworks accept what we export? Plans made for each stack, exported, judged by that stack's own code.

For each of REQUESTS (dense and MoE, 8 to 16,384 GPUs, layer counts that do not divide evenly, long sequences, HF
config.json files of the 2025-26 model types, and dimensions fixed as a user pins them: --tp 8 --pp 16, --cp 8,
--ep 64 --pp 8, 80 layers over 6 stages, 16,384 GPUs)
and each framework (megatron-core, torchtitan, deepspeed, planner): `api.build_request(..., framework=NAME)`,
`api.plan`, `export_plan(plan, <the framework's exporter>)`, then `planner.export.judges.judge`:

  megatron-core  Megatron-LM's parse_args + validate_args + core_transformer_config_from_args when
                 $MEGATRON_LM_PATH points at a Megatron-LM checkout (e.g. `git archive core_v0.16.1 megatron/training
                 megatron/legacy megatron/rl megatron/post_training`), else megatron-core's TransformerConfig; then
                 megatron-core's GPTModel built from the flags on the meta device must have the plan's parameter count
  torchtitan     torchtitan 0.3 ConfigManager.parse_args, ParallelDims, torch's pipeline schedule per pp rank
  deepspeed      DeepSpeedConfig(config, mpu=<PipeModelDataParallelTopology sizes>) in a fake world of the plan's size
  planner        planner.launch_spec.runnable.check_runnable (our executor's pre-launch check)

Outcomes: `ok` accepted; `REJECTED` exported but the framework's code refused it (the bug this measures);
`refused` our exporter refused (with the reason); `no plan` the search found no configuration the profile runs, or the
profile cannot build the model (its unsupported_models, e.g. Megatron-Core and a parallel residual);
`n/a` the framework is not installed here. The acceptance rate is accepted / exported.

    PYTHONPATH=. MEGATRON_LM_PATH=/path/to/Megatron-LM python benchmarks/framework_acceptance.py [--time-limit 10] [--cross]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

FRAMEWORKS = ("megatron-core", "torchtitan", "deepspeed", "planner")

# (label, model, gpus, global batch, seq_len): nodes of 8 GPUs (dgx-h100) unless the GPU count is smaller.
REQUESTS = [
    ("8b-8gpu", "llama3-8b", 8, 256, 8192),
    ("8b-64gpu-32k", "llama3-8b", 64, 64, 32768),
    ("8b-16gpu-128k", "llama3-8b", 16, 16, 131072),
    ("tinyllama-8gpu", "tinyllama-1.1b", 8, 512, 2048),
    ("70b-64gpu", "llama3-70b", 64, 512, 8192),
    ("70b-256gpu", "llama3-70b", 256, 1024, 8192),
    ("70b-1024gpu-32k", "llama3-70b", 1024, 512, 32768),
    ("405b-1024gpu", "llama3-405b", 1024, 1024, 8192),
    ("405b-16384gpu", "llama3-405b", 16384, 2048, 8192),
    ("405b-2048gpu-128k", "llama3-405b", 2048, 128, 131072),
    ("gpt3-175b-512gpu", "gpt3-175b", 512, 1536, 2048),
    ("bloom-176b-384gpu", "bloom-176b", 384, 2048, 2048),
    ("opt-175b-1024gpu", "opt-175b", 1024, 2048, 2048),
    ("mtnlg-530b-2240gpu", "mt-nlg-530b", 2240, 1920, 2048),
    ("glm-130b-768gpu", "glm-130b", 768, 4224, 2048),
    ("neox-20b-96gpu", "gpt-neox-20b", 96, 1536, 2048),
    ("mixtral-8x7b-64gpu", "mixtral-8x7b", 64, 512, 4096),
    ("mixtral-8x22b-256gpu", "mixtral-8x22b", 256, 1024, 8192),
    ("mixtral-8x7b-16gpu-32k", "mixtral-8x7b", 16, 32, 32768),
    ("dsv3-2048gpu", "deepseek-v3", 2048, 4096, 4096),
    ("dsv3-16384gpu", "deepseek-v3", 16384, 16384, 4096),
    ("dsv3-1024gpu-16k", "deepseek-v3", 1024, 512, 16384),
    # HF config.json files (tests/data/hf/<folder>/config.json, README there names each Hub repository)
    ("hf-gpt-oss-20b-64gpu", "hf:gpt-oss-20b", 64, 512, 8192),
    ("hf-glm-4.5-air-128gpu", "hf:glm-4.5-air", 128, 1024, 4096),
    ("hf-dsv2-lite-16gpu", "hf:deepseek-v2-lite", 16, 256, 4096),
    ("hf-olmoe-16gpu", "hf:olmoe-1b-7b", 16, 512, 4096),
    ("hf-qwen3-30b-a3b-32gpu", "hf:qwen3-30b-a3b", 32, 256, 8192),
    ("hf-ministral-8b-16gpu-32k", "hf:ministral-8b", 16, 32, 32768),
    ("hf-smollm3-8gpu", "hf:smollm3-3b", 8, 256, 4096),
    ("hf-granite-moe-8gpu", "hf:granite-3.0-1b-a400m", 8, 256, 4096),
    ("hf-hunyuan-a13b-128gpu", "hf:hunyuan-a13b", 128, 512, 8192),
    ("hf-phi-3.5-moe-64gpu", "hf:phi-3.5-moe", 64, 512, 4096),
    ("hf-dbrx-256gpu", "hf:dbrx", 256, 1024, 4096),
    ("hf-exaone4-32b-64gpu", "hf:exaone-4.0-32b", 64, 256, 8192),
    ("hf-llama4-scout-128gpu", "hf:llama-4-scout", 128, 512, 8192),
    ("hf-mistral-small-24b-32gpu", "hf:mistral-small-3.1-24b", 32, 256, 8192),
    ("hf-dsv3-2048gpu", "hf:deepseek-v3", 2048, 4096, 4096),
    ("hf-qwen3-next-80b-64gpu", "hf:qwen3-next-80b-a3b", 64, 512, 4096),  # Gated DeltaNet + gated attention, MoE
    ("hf-jamba-v0.1-64gpu", "hf:jamba-v0.1", 64, 256, 8192),  # Mamba-1 + attention, MoE on alternate layers
    # fixed dimensions (the search is told --tp/--pp/--cp/--ep, as a user pins them)
    ("70b-tp8-pp16-1024gpu", "llama3-70b", 1024, 1024, 8192, {"tp": 8, "pp": 16}),
    ("405b-cp8-1024gpu-128k", "llama3-405b", 1024, 64, 131072, {"cp": 8}),
    ("dsv3-ep64-pp8-2048gpu", "deepseek-v3", 2048, 4096, 4096, {"ep": 64, "pp": 8}),
    ("70b-80layers-6stages", "llama3-70b", 96, 384, 8192, {"tp": 8, "pp": 6}),
    ("405b-16384gpu-tp8-pp16", "llama3-405b", 16384, 2048, 8192, {"tp": 8, "pp": 16}),
    ("mixtral-ep8-tp2-64gpu", "mixtral-8x7b", 64, 512, 4096, {"ep": 8, "tp": 2}),
    # DeepSeek-V3 with its MTP module (a spec file; the last stage carries it; Megatron builds it from --mtp-num-layers)
    ("dsv3-mtp-ep64-pp16-2048gpu", "examples/models/deepseek-v3-mtp.yaml", 2048, 4096, 4096, {"ep": 64, "pp": 16}),
    # NeMo's H100 recipe for DeepSeek-V3: Megatron-Core --recompute-modules (a search limit; other stacks refuse them)
    ("dsv3-nemo-modules-1024gpu", "deepseek-v3", 1024, 8192, 4096, {"tp": 2, "pp": 16, "ep": 64},
     {"recompute_modes": ("selective",), "recompute_modules": ("mla_up_proj", "mlp", "moe")}),
]
HF_DIR = "tests/data/hf"  # "hf:<folder>" models: relative to the repository root (run from it, as the usage line says)


@dataclass
class Cell:
    outcome: str  # ok | REJECTED | refused | no plan | n/a
    detail: str = ""


def plan_for(label: str, model: str, gpus: int, gbs: int, seq: int, fixed: dict | None = None, limits: dict | None = None,
             *, framework: str, time_limit: float):
    from pathlib import Path

    from planner import api
    from planner.schemas.plan import SearchLimits

    if model.startswith("hf:"):
        model = str(Path(__file__).resolve().parents[1] / HF_DIR / model[3:])
    limits = SearchLimits(time_limit_s=time_limit, top_k=0, fixed=fixed or {}, **(limits or {}))
    request = api.build_request(model=model, topology="dgx-h100", gpus=gpus, nodes=max(1, gpus // 8), global_batch_size=gbs,
                                seq_len=seq, framework=framework, search=limits)
    return api.plan(request)


PLANS: dict[tuple[str, str], object] = {}  # (request label, framework) -> plan, for --cross


def one_cell(spec: tuple, framework: str, time_limit: float, target_framework: str | None = None) -> Cell:
    """Plan `spec` for `framework` and judge its export for `target_framework` (default: the same stack)."""
    from planner.errors import PlannerError

    try:
        if (spec[0], framework) not in PLANS:
            PLANS[spec[0], framework] = plan_for(*spec, framework=framework, time_limit=time_limit)
        plan = PLANS[spec[0], framework]
    except PlannerError as exc:  # bad input, infeasible, or the search's time limit without a fitting plan
        PLANS[spec[0], framework] = exc
        return Cell("no plan", str(exc)[:200])
    if isinstance(plan, PlannerError):
        return Cell("no plan", str(plan)[:200])
    if not plan.feasible:
        return Cell("no plan", "; ".join(plan.infeasible_reasons)[:200])
    return export_and_judge(plan, target_framework or framework)


def export_and_judge(plan, framework: str) -> Cell:
    from planner.errors import BadInputError
    from planner.export import export_plan
    from planner.export.common import TARGET_FRAMEWORKS
    from planner.export.judges import judge
    from planner.export.verdicts import JudgeUnavailable

    target = {name: t for t, name in TARGET_FRAMEWORKS.items() if t != "slurm"}[framework]
    par = plan.parallelism
    shape = f"dp{par.dp} tp{par.tp} pp{par.pp}x{par.vpp} cp{par.cp} ep{par.ep} z{par.zero_stage} {plan.schedule}"
    try:
        export = export_plan(plan, target)
    except BadInputError as exc:
        return Cell("refused", f"{shape}: {exc}")
    try:
        verdict = judge(plan, export)
    except JudgeUnavailable as exc:
        return Cell("n/a", str(exc))
    return Cell("ok" if verdict.accepted else "REJECTED", shape if verdict.accepted else f"{shape}: {verdict.reason}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--time-limit", type=float, default=10.0, help="search time limit per plan (s)")
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    parser.add_argument("--only", default="", help="comma-separated request labels")
    parser.add_argument("--cross", action="store_true",
                        help="also export each plan to every other framework: re-checked, accepted or refused, never rejected")
    args = parser.parse_args(argv)
    frameworks = [f for f in args.frameworks.split(",") if f]
    requests = [r for r in REQUESTS if not args.only or r[0] in args.only.split(",")]
    cells: dict[tuple[str, str], Cell] = {}
    for spec in requests:
        for framework in frameworks:
            start = time.perf_counter()
            cells[spec[0], framework] = cell = one_cell(spec, framework, args.time_limit)
            print(f"{spec[0]:<24} {framework:<14} {cell.outcome:<9} {time.perf_counter() - start:5.1f}s  {cell.detail}",
                  file=sys.stderr, flush=True)
    print_table(requests, frameworks, cells)
    crossed = cross(requests, frameworks, args.time_limit) if args.cross else {}
    return 0 if all(c.outcome != "REJECTED" for c in [*cells.values(), *crossed.values()]) else 1


def cross(requests: list, frameworks: list[str], time_limit: float) -> dict:
    """Plans made for one stack exported to another: the exporter re-checks them against the target's profile."""
    cells = {}
    for spec in requests:
        for source in frameworks:
            for target in frameworks:
                if target != source:
                    cells[spec[0], source, target] = cell = one_cell(spec, source, time_limit, target)
                    print(f"{spec[0]:<24} {source:>14} -> {target:<14} {cell.outcome:<9} {cell.detail}", file=sys.stderr, flush=True)
    print("\ncross-framework exports (plan made for the row's stack, exported to the column's):")
    print(f"{'made for':<14}" + "".join(f"{t:>30}" for t in frameworks))
    for source in frameworks:
        row = []
        for target in frameworks:
            mine = [c for (_, s, t), c in cells.items() if s == source and t == target]
            counts = {o: sum(c.outcome == o for c in mine) for o in ("ok", "refused", "REJECTED")}
            row.append("-" if source == target else f"{counts['ok']} ok/{counts['refused']} refused/{counts['REJECTED']} rejected")
        print(f"{source:<14}" + "".join(f"{r:>30}" for r in row))
    return cells


def print_table(requests: list, frameworks: list[str], cells: dict) -> None:
    width = 12
    print(f"{'request':<24}" + "".join(f"{f:>{width + 2}}" for f in frameworks))
    for spec in requests:
        print(f"{spec[0]:<24}" + "".join(f"{cells[spec[0], f].outcome:>{width + 2}}" for f in frameworks))
    print()
    for framework in frameworks:
        mine = [cells[spec[0], framework] for spec in requests]
        counts = {o: sum(c.outcome == o for c in mine) for o in ("ok", "REJECTED", "refused", "no plan", "n/a")}
        exported = counts["ok"] + counts["REJECTED"]
        rate = f"{counts['ok'] / exported:.0%}" if exported else "-"
        print(f"{framework:<14} accepted {counts['ok']}/{exported} exported ({rate}); refused by exporter {counts['refused']}, "
              f"no plan {counts['no plan']}, not installed {counts['n/a']}")
    details = [(s[0], f, cells[s[0], f]) for s in requests for f in frameworks if cells[s[0], f].outcome not in ("ok", "n/a")]
    if details:
        print("\nnot accepted:")
        for label, framework, cell in details:
            print(f"  {label} / {framework}: {cell.outcome}: {cell.detail}")


if __name__ == "__main__":
    raise SystemExit(main())
