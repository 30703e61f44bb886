"""Do the stacks' own recommended configurations fit, as the planner predicts them? (validation/stack_recipes.yaml)

Each recipe there is a configuration a stack's maintainers launch (NeMo's recommended H100 pre-training configs,
torchtitan's Llama 3 train configs on the hardware its docs name): CONFIGURATIONS ONLY, no throughput. Each is
priced by planner.api.estimate (what `planner estimate` runs) and reported per pipeline rank: the predicted peak
(allocated x (1 + fraction) + fixed, the allowance of the stack's allocator setting: calibration.yaml `memory`,
frameworks/*.yaml behaviour.memory.allocator) against the device's usable memory; the allocated bytes without the
allowance; and the largest allowance fraction at which the rank still fits, (usable - fixed) / allocated - 1
(negative: the allocated bytes alone, plus the fixed part, pass the device). A recipe its maintainers run that is
predicted not to fit is a memory-model error to explain (issue 21); the recipe's facts the estimate cannot say are
listed under it (`not_expressed`), since each moves the prediction.

    python benchmarks/stack_recipes_fit.py > benchmarks/results/stack_recipes_fit.txt
    python benchmarks/stack_recipes_fit.py --recipes FILE      # another file of the same format
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from planner import api
from planner.errors import BadInputError

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "validation" / "stack_recipes.yaml"
GiB = 2**30


def topology_of(recipe: dict):
    """The recipe's node preset for its GPUs, with the device memory its source states (gpu_memory_gib, read as
    GiB the way benchmarks/published_hardware.py device_of reads a stated size)."""
    topo = api.load_topology(recipe.get("topology", "dgx-h100"), gpus=recipe["gpus"])
    gib = recipe.get("gpu_memory_gib")
    if gib is None:
        return topo
    device = topo.device.model_copy(update={"memory_bytes": int(gib * GiB), "name": f"{topo.device.name} as {gib} GB"})
    return topo.model_copy(update={"device": device})


def configuration(recipe: dict, request):
    """The recipe's Configuration (planner.schemas.plan), as `planner estimate` builds it from the same flags."""
    from planner.cli.estimate import stage_layers_of
    from planner.schemas.dims import ParallelDims
    from planner.schemas.plan import Configuration, Parallelism

    dims = ParallelDims.resolve(recipe["gpus"], tp=recipe["tp"], pp=recipe["pp"], cp=recipe["cp"], ep=recipe["ep"])
    split = stage_layers_of(recipe.get("stage_layers"), None, None, num_layers=request.model.num_layers,
                            pp=recipe["pp"], vpp=recipe["vpp"])
    parallelism = Parallelism(**dims.as_dict(), sp=recipe["sp"], vpp=recipe["vpp"], zero_stage=recipe["zero"],
                              moe_dispatcher=recipe.get("moe_dispatcher"), moe_overlap=recipe.get("moe_overlap"),
                              compression=api.compression(recipe.get("compression", "none"), request.topology))
    return Configuration(parallelism=parallelism, microbatch_size=recipe["microbatch_size"], schedule=recipe["schedule"],
                         recompute=recipe["recompute"], recompute_modules=tuple(recipe.get("recompute_modules", ())),
                         stage_layers=split)


def request_of(recipe: dict):
    return api.build_request(model=recipe["model"], topology=topology_of(recipe), gpus=recipe["gpus"],
                             global_batch_size=recipe["global_batch_size"], seq_len=recipe["seq_len"],
                             precision=recipe["precision"], framework=recipe["framework"])


def evaluate(recipe: dict) -> dict:
    """The recipe's estimate: per pipeline rank its peak, allocated bytes and largest fitting allowance fraction."""
    from planner.cost.model import CostModel

    request = request_of(recipe)
    plan = api.estimate(request, configuration(recipe, request))
    allowance = CostModel(request).mem_cal  # the allowance the estimate used (the stack's allocator setting)
    capacity = plan.memory.capacity_bytes
    ranks = []
    for stage in plan.memory.per_stage:
        allocated = (stage.peak_bytes - allowance.fragmentation_fixed_bytes) / (1 + allowance.fragmentation_fraction)
        ranks.append({"rank": stage.stage, "peak_bytes": stage.peak_bytes, "allocated_bytes": allocated,
                      "grads_bytes": stage.grads_bytes,
                      "max_fraction": (capacity - allowance.fragmentation_fixed_bytes) / allocated - 1})
    return {"id": recipe["id"], "precision": recipe["precision"], "framework": recipe["framework"],
            "device": request.topology.device.name, "capacity_bytes": capacity, "fits": plan.memory.fits,
            "feasible": plan.feasible, "reasons": list(plan.infeasible_reasons), "ranks": ranks,
            "allocator": allowance.allocator, "fraction": allowance.fragmentation_fraction,
            "fixed_bytes": allowance.fragmentation_fixed_bytes, "measured": allowance.measured,
            "not_expressed": list(recipe.get("not_expressed", []))}


def layout(recipe: dict) -> str:
    text = (f"tp{recipe['tp']} pp{recipe['pp']} cp{recipe['cp']} ep{recipe['ep']} vpp{recipe['vpp']} "
            f"zero{recipe['zero']} mbs{recipe['microbatch_size']} gbs{recipe['global_batch_size']} seq{recipe['seq_len']} "
            f"rc:{recipe['recompute']}" + (f"({'/'.join(recipe['recompute_modules'])})" if recipe.get("recompute_modules") else ""))
    text += f" split {recipe['stage_layers']}" if recipe.get("stage_layers") else ""
    text += f" dispatcher {recipe['moe_dispatcher']}" if recipe.get("moe_dispatcher") else ""
    text += f" overlap {recipe['moe_overlap']}" if recipe.get("moe_overlap") else ""
    return text + (f" compression {recipe['compression']}" if recipe.get("compression") else "")


def lines_of(recipe: dict, result: dict) -> list[str]:
    worst = max(result["ranks"], key=lambda r: r["allocated_bytes"])
    peaks = " ".join(f"{r['peak_bytes'] / GiB:.1f}" for r in result["ranks"])
    verdict = "fits" if result["fits"] else "DOES NOT FIT"
    head = (f"{result['id']:30} {result['precision']:4} {recipe['gpus']:>5} {result['capacity_bytes'] / GiB:6.2f} "
            f"{max(r['peak_bytes'] for r in result['ranks']) / GiB:7.2f} {worst['allocated_bytes'] / GiB:7.2f} "
            f"{worst['grads_bytes'] / GiB:6.2f} {worst['max_fraction']:+7.3f}  {verdict} at {result['allocator']} "
            f"{result['fraction']:.3f}")
    out = [head, f"    {layout(recipe)}; peak GiB per pp rank: {peaks}"]
    out += [f"    not fitting for another reason: {reason}" for reason in result["reasons"] if "needs" not in reason]
    out += [f"    not expressed: {item}" for item in result["not_expressed"]]
    return out


def report(recipes: list[dict]) -> tuple[list[str], list[dict]]:
    lines = [f"{'recipe':30} {'prec':4} {'gpus':>5} {'cap':>6} {'peak':>7} {'alloc':>7} {'grads':>6} {'max f':>7}  "
             "verdict at the stack's allowance",
             "(GiB of the worst pipeline rank: cap = device memory less the CUDA context, peak = alloc x (1 + f) + fixed, "
             "alloc = without the allowance, grads = its gradient bytes as priced; max f = the largest allowance "
             "fraction f at which it fits)"]
    results, refused = [], []
    for recipe in recipes:
        try:
            result = evaluate(recipe)
        except BadInputError as exc:
            refused.append(f"{recipe['id']}: cannot be expressed: {exc}")
            continue
        results.append(result)
        lines += lines_of(recipe, result)
    lines += refused
    late = [r for r in results if not r["fits"]]
    without = [r for r in late if min(x["max_fraction"] for x in r["ranks"]) >= 0]
    allowances = sorted({(r["allocator"], r["fraction"], r["measured"]) for r in results})
    lines.append(f"{len(results)} of {len(recipes)} recipes priced; {len(late)} predicted not to fit at their stack's "
                 f"allowance, {len(without)} of them fit with no fractional allowance (only the fixed part)")
    lines += [f"allowance {name}: {fraction:.3f} x allocated + fixed "
              f"({'measured' if measured else 'not measured: the default allocator value carried over'})"
              for name, fraction, measured in allowances]
    return lines, results


def load(path: Path) -> list[dict]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise BadInputError(f"--recipes={path}: not a readable YAML file ({exc.__class__.__name__}): pass "
                            "validation/stack_recipes.yaml or a file of its format") from None
    recipes = data.get("recipes") if isinstance(data, dict) else None
    if not recipes:
        raise BadInputError(f"--recipes={path}: no `recipes` list: see validation/stack_recipes.yaml for the format")
    return recipes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", type=Path, default=RECIPES)
    args = parser.parse_args(argv)
    try:
        lines, _ = report(load(args.recipes))
    except BadInputError as exc:
        print(f"stack_recipes_fit: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
