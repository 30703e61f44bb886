"""Every published configuration in validation/published_runs.json is valid in its framework's profile.

One general conversion, no per-run table:
- the stacks a run names: its `training.framework` text, matched by keyword (Megatron -> megatron-core,
  DeepSpeed -> deepspeed, torchtitan -> torchtitan, FSDP / Composer / metaseq -> pytorch-fsdp). A text naming
  several stacks ("Megatron-LM + DeepSpeed") ran their combination: the run is valid if one of them runs it
  ("Megatron" names both Megatron-LM before Megatron-Core and Megatron-Core; HAI-LLM is DeepSeek's stack).
  A run naming none of ours (MindSpore) gets the verdict "no profile" and is listed, not judged;
- what the run publishes is fixed (tp, pp, cp, ep, sp, ZeRO stage, schedule, recompute, precision: 16-bit
  mixed precision of any kind is bf16);
- what it leaves unsaid (null, or text we do not read) takes every value the stack could have used: the run is
  valid if any completion is (the planner's own rule for unsaid settings: its best choice among the allowed).
The test id is the run id; a failure prints the stack's reason.
"""

import itertools
import json
from pathlib import Path

import pytest

from planner.frameworks import Config, interleaved_split_reason, load_framework, refusal

RUNS = Path(__file__).resolve().parents[2] / "validation" / "published_runs.json"
STACK_KEYWORDS = (("megatron-core", "megatron-core"), ("megatron", "megatron-lm"), ("megatron", "megatron-core"),
                  ("hai-llm", "hai-llm"), ("deepspeed", "deepspeed"), ("torchtitan", "torchtitan"),
                  ("fsdp", "pytorch-fsdp"), ("composer", "pytorch-fsdp"), ("metaseq", "pytorch-fsdp"))


def runs() -> list[dict]:
    return json.loads(RUNS.read_text()) if RUNS.is_file() else []


def stacks_of(run: dict) -> list[str]:
    text = (run["training"].get("framework") or "").lower()
    return list(dict.fromkeys(stack for key, stack in STACK_KEYWORDS if key in text))


def _zero(value) -> list[int]:
    if isinstance(value, int):
        return [value]
    text = str(value or "").lower()
    if "zero-3" in text or "full_shard" in text or "fully sharded" in text:
        return [3]
    return [0, 1, 2, 3]


def _schedule(value, pp: int) -> list[str]:
    text = str(value or "").lower()
    if pp == 1:
        return ["1f1b"]
    if "interleav" in text:
        return ["interleaved"]
    if "1f1b" in text or "pipedream-flush" in text:
        return ["1f1b"]
    return ["gpipe", "1f1b", "interleaved", "zero-bubble"]


def _recompute(value) -> list[str]:
    text = str(value or "").lower()
    if text.startswith("none"):
        return ["none"]
    if "selective" in text or text.startswith("recompute "):
        return ["selective"]
    if "full" in text or "checkpoint" in text or "recomputation" in text or "re-materializ" in text:
        return ["full"]
    return ["none", "selective", "full"]


def _precision(value) -> str:
    text = str(value or "").lower()
    return "fp8" if "fp8" in text else "bf16"


def completions(run: dict):
    """Every Config the run could have been, given what it publishes (unsaid fields take every value)."""
    par, train = run["parallel"], run["training"]
    tp, pp, cp, ep = (int(par.get(k) or 1) for k in ("tp", "pp", "cp", "ep"))
    gpus = int(par.get("num_gpus") or run["hardware"]["num_nodes"] * run["hardware"]["gpus_per_node"])
    dp = int(par.get("dp") or gpus // (tp * pp * cp))
    sps = [bool(par["sp"])] if par.get("sp") is not None else [False, True]
    vpps = [int(train["virtual_pipeline_stages"])] if train.get("virtual_pipeline_stages") else list(range(1, 9))
    is_moe = run["model"].get("moe") is not None or ep > 1
    for sp, zero, schedule, recompute, vpp in itertools.product(
            sps, _zero(train.get("zero_stage")), _schedule(train.get("pipeline_schedule"), pp),
            _recompute(train.get("recompute")), vpps):
        if (vpp > 1) != (schedule == "interleaved"):
            continue
        yield Config(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, vpp=vpp, sp=sp and tp > 1, zero_stage=zero, schedule=schedule,
                     recompute=recompute, is_moe=is_moe, precision=_precision(train.get("precision")))


def verdict(run: dict) -> tuple[str, str]:
    """('valid', stack) | ('no profile', text) | ('no configuration', why) | ('refused', reasons by stack)."""
    stacks = stacks_of(run)
    if not stacks:
        return "no profile", str(run["training"].get("framework"))
    if not run["parallel"].get("num_gpus") and not run["hardware"].get("num_nodes"):
        return "no configuration", "the source publishes no GPU count or parallel degrees"
    layers = int(run["model"].get("num_layers") or 1)
    reasons = {}
    for stack in stacks:
        profile = load_framework(stack)
        for config in completions(run):
            found = refusal(profile, config)
            if found is None and config.schedule == "interleaved":
                found = interleaved_split_reason(profile, num_layers=layers, pp=config.pp, vpp=config.vpp,
                                                 num_microbatches=config.pp * 8)
            if found is None:
                return "valid", stack
            reasons.setdefault(stack, found[1])
    return "refused", "; ".join(f"{stack}: {reason}" for stack, reason in reasons.items())


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
    assert counts.get("no profile", 0) <= 1  # MindSpore (CodeGeeX)
    assert counts.get("valid", 0) >= len(runs()) - 4 and "refused" not in counts


def test_the_conversion_can_refuse():
    """The judge is not vacuous: a pipeline on an FSDP-only stack and 2 model chunks on DeepSpeed are refused."""
    run = {"training": {"framework": "MosaicML Composer (PyTorch FSDP)", "zero_stage": 0,
                        "pipeline_schedule": "1F1B", "recompute": "full", "precision": "bf16", "virtual_pipeline_stages": None},
           "parallel": {"tp": 1, "pp": 4, "cp": 1, "ep": 1, "sp": False, "num_gpus": 16, "dp": 4},
           "model": {"num_layers": 32, "moe": None}, "hardware": {"num_nodes": 2, "gpus_per_node": 8}}
    assert verdict(run)[0] == "refused" and "no pipeline parallelism" in verdict(run)[1]
    run["training"].update(framework="DeepSpeed", pipeline_schedule="interleaved 1F1B", virtual_pipeline_stages=2)
    assert verdict(run)[0] == "refused"
