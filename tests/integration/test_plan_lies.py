"""Plans edited to lie are refused on load (issue 24): each edit below passed `explain`/`export`/`run` before
planner.plan_verify re-derived a plan's numbers from its own request. Every command that takes a plan answers
exit 2 with one line naming the field; the committed plans (honest) still load."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
from cli_refusals import refused
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.io import canonical_json, load_file
from planner.plan_verify import verify_plan
from planner.errors import BadInputError
from planner.schemas.plan import Configuration, LaunchPlan, Parallelism, TracedMemory

ROOT = Path(__file__).resolve().parents[2]
COMMITTED = sorted([*ROOT.glob("examples/plans/*.json"), ROOT / "docs/plan.json", *ROOT.glob("tests/golden/*.json")])


@pytest.fixture(scope="module")
def plans() -> dict[str, dict]:
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, global_batch_size=16, seq_len=512)
    dense = api.estimate(request, Configuration(parallelism=Parallelism(dp=2, tp=2, pp=2), microbatch_size=1))
    request_8b = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=16, seq_len=512)
    interleaved = api.estimate(request_8b, Configuration(parallelism=Parallelism(dp=2, tp=2, pp=2, vpp=2), microbatch_size=1,
                                                         schedule="interleaved"))
    moe = json.loads((ROOT / "tests/golden/plan_mixtral-8x7b_16xh100.json").read_text())
    return {"dense": json.loads(canonical_json(dense)), "interleaved": json.loads(canonical_json(interleaved)), "moe": moe}


def _empty_stage(d: dict) -> None:
    """A middle chunk emptied (end chunks may hold only the embedding or the head where the stack runs that)."""
    first, second = d["stages"][1], d["stages"][2]
    moved = [name for name in first["layers"] if name.startswith("layers.")]
    first["layers"] = [name for name in first["layers"] if not name.startswith("layers.")]
    second["layers"] = [*moved, *second["layers"]]


LIES = {  # name: (base plan, edit, words the one line must hold)
    "hidden_size": ("dense", lambda d: d["request"]["model"].update(hidden_size=4096), "request.model.hidden_size is 4096"),
    "vocab_size": ("dense", lambda d: d["request"]["model"].update(vocab_size=64000), "request.model.vocab_size is 64000"),
    "precision": ("dense", lambda d: d["request"].update(precision="fp32"), "request.precision is 'fp32'"),
    "framework": ("dense", lambda d: d["request"].update(framework="megatron-core"), "request.framework is 'megatron-core'"),
    "ep_not_dividing_experts": ("moe", lambda d: (d["parallelism"].update(ep=8), d["request"]["model"]["moe"].update(num_experts=12)),
                                "ep=8 must divide num_experts=12"),
    "vpp2_on_1f1b": ("interleaved", lambda d: d.update(schedule="1f1b"), "vpp=2"),
    "empty_stage": ("interleaved", _empty_stage, "stages[1]"),
    "sp_without_tp": ("moe", lambda d: d["parallelism"].update(sp=True), "sp needs tp>1"),
    "rank_on_missing_node": ("dense", lambda d: d["ranks"][3].update(node=5), "ranks[3].node is 5"),
    "fits_at_10x_capacity": ("dense", lambda d: (d["memory"].update(peak_bytes=10 * d["memory"]["capacity_bytes"], fits=True),
                                                 d["memory"]["per_stage"][0].update(peak_bytes=10 * d["memory"]["capacity_bytes"])),
                             "memory.fits is true but memory.peak_bytes"),
    "zero_second_step": ("dense", lambda d: d["prediction"].update(step_time_s=0.0), "prediction.step_time_s is 0"),
    "faster_step": ("dense", lambda d: d["prediction"].update(step_time_s=d["prediction"]["step_time_s"] / 2,
                                                              tokens_per_s=d["prediction"]["tokens_per_s"] * 2),
                    "prediction.step_time_s"),
}


def lie(plans, tmp_path: Path, name: str) -> str:
    base, edit, _ = LIES[name]
    data = copy.deepcopy(plans[base])
    edit(data)
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("name", list(LIES))
@pytest.mark.parametrize("command", [["explain"], ["export", "--to", "megatron"], ["launch"], ["run", "--device", "cpu"]],
                         ids=lambda c: c[0])
def test_a_plan_edited_to_lie_is_refused_naming_the_field(plans, tmp_path, name, command):
    line = refused([command[0], lie(plans, tmp_path, name), *command[1:]])
    assert "is inconsistent" in line and LIES[name][2] in line, line


@pytest.mark.parametrize("name", ["fits_at_10x_capacity", "zero_second_step", "ep_not_dividing_experts", "sp_without_tp"])
def test_check_refuses_claims_that_contradict_themselves(plans, tmp_path, name):
    folder = tmp_path / "plans"
    folder.mkdir()
    Path(lie(plans, folder, name))
    line = refused(["check", str(folder)])
    assert "is inconsistent" in line and LIES[name][2] in line, line


@pytest.mark.parametrize("tolerance", ["nan", "inf", "-1"])
def test_check_refuses_a_non_finite_tolerance(tolerance):
    assert "finite number >= 0" in refused(["check", str(ROOT / "tests/golden"), "--tolerance", tolerance])


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: p.name)
def test_committed_plans_are_honest(path):
    verify_plan(load_file(LaunchPlan, path), source=str(path))


@pytest.mark.parametrize("model, topology, gpus, framework, precision", [
    ("llama3-8b", "dgx-h100", 16, "planner", "bf16"), ("tinyllama-1.1b", "dgx-a100-80g", 8, "deepspeed", "bf16"),
    ("gpt3-175b", "dgx-a100-80g", 128, "megatron-lm", "bf16"), ("llama3-8b", "dgx-h100", 8, "megatron-core", "fp8"),
    ("llama3-8b", "dgx-h100", 16, "pytorch-fsdp", "amp-bf16"), ("bloom-176b", "dgx-a100-80g", 64, "deepspeed", "bf16"),
])
def test_fresh_plans_are_honest_after_their_json_round_trip(tmp_path, model, topology, gpus, framework, precision):
    """What the search writes, written and read back as a file, re-derives within the rounding of canonical_json."""
    plan = api.plan(api.build_request(model=model, topology=topology, gpus=gpus, framework=framework, precision=precision))
    path = tmp_path / "plan.json"
    path.write_text(canonical_json(plan))
    verify_plan(load_file(LaunchPlan, path), source=str(path))


def test_a_plan_verified_by_trace_re_derives():
    """`planner plan` for the planner stack adds memory.traced (planner.memory_trace), which the cost model does not
    derive: `planner run` re-derives the rest and runs it; `planner check` re-traces it. An edited traced peak
    still has to agree with the plan's own claims only."""
    plan = api.plan(api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, framework="planner"))
    traced = TracedMemory(peak_bytes=plan.memory.peak_bytes, fits=True, note="traced")
    stated = plan.model_copy(update={"memory": plan.memory.model_copy(update={"traced": traced})})
    assert verify_plan(stated) is stated
    lied = stated.model_copy(update={"memory": stated.memory.model_copy(update={"peak_bytes": stated.memory.peak_bytes + 2**30})})
    with pytest.raises(BadInputError, match="memory"):
        verify_plan(lied)
