"""Every published configuration in validation/published_runs.json is valid in its framework's profile.

The one conversion of benchmarks/published_runs.py (the one benchmarks/accuracy.py evaluates), no second reading:
- the stack is `stack_of(run)` (its profile: `profile_of`), the published settings are `settings(run, stack).fixed`,
  precision `precision_of`;
- what the run leaves unsaid takes every value of `settings(...).choices` (the values the stack runs), and the
  interleaving depth every value that splits the layers: the run is valid if any completion is (the planner's own
  rule for unsaid settings is its best choice among them);
- a run the conversion skips (`skip_reason`: no GPU preset, no parallel configuration, no throughput) is listed,
  not judged.
The test id is the run id; a failure prints the stack's reason.
"""

import itertools
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import published_runs as P  # noqa: E402

from planner.frameworks import Config, interleaved_split_reason, load_framework, refusal  # noqa: E402

RUNS = Path(__file__).resolve().parents[2] / "validation" / "published_runs.json"
JUDGED_SKIPS = ("no throughput published", "throughput published only as a bound")  # the configuration is still published


def runs() -> list[dict]:
    return json.loads(RUNS.read_text()) if RUNS.is_file() else []


def completions(run: dict, stack: str):
    """Every Config the run could have been, given what the conversion reads as published."""
    s = P.settings(run, stack)
    keys = list(s.choices)
    is_moe = run["model"].get("moe") is not None or s.fixed["ep"] > 1
    for values in itertools.product(*(s.choices[k] for k in keys)):
        f = dict(s.fixed, **dict(zip(keys, values)))
        schedule = f["schedule"] or "1f1b"
        vpp = (f["vpp"] or 1) if schedule == "interleaved" else 1
        if (vpp > 1) != (schedule == "interleaved"):
            continue
        yield Config(dp=f["dp"], tp=f["tp"], pp=f["pp"], cp=f["cp"], ep=f["ep"], vpp=vpp, sp=bool(f["sp"]) and f["tp"] > 1,
                     zero_stage=f["zero_stage"] if f["zero_stage"] is not None else 0, schedule=schedule,
                     recompute=f["recompute"] or "none", is_moe=is_moe, precision=P.precision_of(run))


def verdict(run: dict) -> tuple[str, str]:
    """('valid', stack) | ('skipped', why) | ('refused', the stack's reason)."""
    why = P.skip_reason(run)
    if why and not why.startswith(JUDGED_SKIPS):
        return "skipped", why
    stack = P.stack_of(run)
    profile = load_framework(P.profile_of(run, stack))
    layers = int(run["model"].get("num_layers") or 1)
    reason = None
    for config in completions(run, stack):
        found = refusal(profile, config)
        if found is None and config.schedule == "interleaved":
            found = interleaved_split_reason(profile, num_layers=layers, pp=config.pp, vpp=config.vpp,
                                             num_microbatches=config.pp * 8)
        if found is None:
            return "valid", stack
        reason = reason or found[1]
    return "refused", f"{stack}: {reason}"


@pytest.mark.skipif(not RUNS.is_file(), reason="validation/published_runs.json not present")
@pytest.mark.parametrize("run", runs(), ids=lambda run: run["id"])
def test_published_configuration_is_valid_in_its_framework(run):
    status, detail = verdict(run)
    print(f"{run['id']}: {status} ({detail})")
    assert status != "refused", f"{run['id']} really ran but is refused: {detail}"


@pytest.mark.skipif(not RUNS.is_file(), reason="validation/published_runs.json not present")
def test_most_runs_are_judged_by_a_profile():
    counts = {}
    for run in runs():
        counts[verdict(run)[0]] = counts.get(verdict(run)[0], 0) + 1
    print(counts)
    assert counts.get("skipped", 0) <= 6  # no parallel configuration (4), no GPU preset (CodeGeeX on Ascend)
    assert counts.get("valid", 0) >= len(runs()) - 6 and "refused" not in counts


def test_the_conversion_can_refuse():
    """The judge is not vacuous: a pipeline on an FSDP-only stack and 2 model chunks on DeepSpeed are refused."""
    run = {"id": "x", "source": {"title": "t (2024)", "url": ""},
           "training": {"framework": "MosaicML Composer (PyTorch FSDP)", "zero_stage": 0, "micro_batch": 1,
                        "pipeline_schedule": "1F1B", "recompute": "full", "precision": "bf16", "virtual_pipeline_stages": None},
           "parallel": {"tp": 1, "pp": 4, "cp": 1, "ep": 1, "sp": False, "num_gpus": 16, "dp": 4},
           "model": {"num_layers": 32, "moe": None, "seq_len": 2048},
           "hardware": {"gpu_model": "NVIDIA A100 80GB", "gpus_per_node": 8}, "results": {"tokens_per_s": 1.0}}
    assert verdict(run)[0] == "refused" and "no pipeline parallelism" in verdict(run)[1]
    run["training"].update(framework="DeepSpeed", pipeline_schedule="interleaved 1F1B", virtual_pipeline_stages=2)
    assert verdict(run)[0] == "refused"
