"""benchmarks/stack_recipes_fit.py on the shipped validation/stack_recipes.yaml: the report is produced for every
recipe, and its numbers are planner.api.estimate's for the same configuration built the way `planner estimate`
builds it from its flags (no assertion that every recipe fits: that is what the report is for)."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from planner import api
from planner.cli.estimate import configuration, stage_layers_of
from planner.cost.calibration import memory_calibration
from planner.frameworks import load_framework

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "stack_recipes_fit.py"
RECIPES = yaml.safe_load((ROOT / "validation" / "stack_recipes.yaml").read_text())
GiB = 2**30


def _module():
    spec = importlib.util.spec_from_file_location("stack_recipes_fit", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def reported():
    return _module().report(RECIPES["recipes"])


def test_every_recipe_is_cited_and_reported(reported):
    lines, results = reported
    sources = RECIPES["sources"]
    for recipe in RECIPES["recipes"]:
        source = sources[recipe["source"]]
        assert len(source["commit"]) == 40 and source["repo"] and source["file"] and recipe["row"], recipe["id"]
        assert sum(line.startswith(recipe["id"] + " ") for line in lines) == 1, recipe["id"]  # priced or refused
    assert {r["id"] for r in results} == {r["id"] for r in RECIPES["recipes"]}  # every shipped recipe is expressible
    assert lines[-2].startswith(f"{len(results)} of {len(RECIPES['recipes'])} recipes priced")
    assert not any("throughput" in key or "tokens" in key for r in RECIPES["recipes"] for key in r)  # configs only


def _independent_estimate(recipe: dict):
    """The recipe through `planner estimate`'s own builders (planner.cli.estimate), not the script's."""
    topo = api.load_topology("dgx-h100", gpus=recipe["gpus"])
    if recipe.get("gpu_memory_gib"):
        topo = topo.model_copy(update={"device": topo.device.model_copy(
            update={"memory_bytes": int(recipe["gpu_memory_gib"] * GiB)})})
    request = api.build_request(model=recipe["model"], topology=topo, gpus=recipe["gpus"],
                                global_batch_size=recipe["global_batch_size"], seq_len=recipe["seq_len"],
                                precision=recipe["precision"], framework=recipe["framework"])
    split = stage_layers_of(recipe.get("stage_layers"), None, None, num_layers=request.model.num_layers,
                            pp=recipe["pp"], vpp=recipe["vpp"])
    config = configuration(request, dp=None, tp=recipe["tp"], pp=recipe["pp"], ep=recipe["ep"], cp=recipe["cp"],
                           sp=recipe["sp"], vpp=recipe["vpp"], zero=recipe["zero"], tp_overlap="none",
                           microbatch_size=recipe["microbatch_size"], schedule=recipe["schedule"],
                           recompute=recipe["recompute"], stage_layers=split,
                           recompute_modules=",".join(recipe.get("recompute_modules", ())) or None,
                           compression=api.compression(recipe.get("compression", "none"), request.topology),
                           stated={name: recipe.get(name) for name in ("moe_dispatcher", "moe_overlap")})
    return api.estimate(request, config)


def test_numbers_are_the_estimate_s(reported):
    lines, results = reported
    by_id = {r["id"]: r for r in RECIPES["recipes"]}
    for result in results:
        recipe = by_id[result["id"]]
        plan = _independent_estimate(recipe)
        assert result["capacity_bytes"] == plan.memory.capacity_bytes and result["fits"] == plan.memory.fits
        assert [r["peak_bytes"] for r in result["ranks"]] == [s.peak_bytes for s in plan.memory.per_stage]
        allowance = memory_calibration(load_framework(recipe["framework"]).behaviour.memory.allocator)
        for rank, stage in zip(result["ranks"], plan.memory.per_stage):
            allocated = rank["allocated_bytes"]
            assert allocated * (1 + allowance.fragmentation_fraction) + allowance.fragmentation_fixed_bytes == pytest.approx(stage.peak_bytes)
            # at the largest fitting fraction the rank's peak is exactly the capacity; it fits at the stack's
            # allowance exactly when that fraction is at least the allowance
            assert allocated * (1 + rank["max_fraction"]) + allowance.fragmentation_fixed_bytes == pytest.approx(plan.memory.capacity_bytes)
        assert plan.memory.fits == (min(r["max_fraction"] for r in result["ranks"]) >= allowance.fragmentation_fraction)
        head = next(line for line in lines if line.startswith(result["id"] + " "))
        assert f"{max(s.peak_bytes for s in plan.memory.per_stage) / GiB:7.2f}" in head
        assert ("DOES NOT FIT" in head) == (not plan.memory.fits)


def test_bad_recipes_file_is_one_line(tmp_path):
    bad = tmp_path / "r.yaml"
    bad.write_text("recipes: [\n")
    done = subprocess.run([sys.executable, str(SCRIPT), "--recipes", str(bad)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--recipes=" in done.stderr, done.stderr
