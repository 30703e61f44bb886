"""The memory model's transient terms against peaks measured on an H200 (profiles/memory-h200.json, written by
benchmarks/gpu_memory.py; compared by benchmarks/memory_mechanisms.py): one-sided where it must be, and each
term needed by some measurement."""

import importlib.util
import json
from pathlib import Path

import pytest

from planner import api
from planner.cost import memory
from planner.cost.calibration import memory_calibration
from planner.cost.model import CostModel
from planner.cost.types import Candidate
from planner.frameworks import load_framework
from planner.models import counting

ROOT = Path(__file__).resolve().parents[2]
MEASURED = ROOT / "profiles" / "memory-h200.json"
GiB = 2**30


def _mechanisms():
    spec = importlib.util.spec_from_file_location("memory_mechanisms", ROOT / "benchmarks" / "memory_mechanisms.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows():
    return {r["case"]: r for r in _mechanisms().rows(MEASURED)}


def test_every_case_was_measured():
    data = json.loads(MEASURED.read_text())
    assert data["device"].startswith("NVIDIA") and len(data["cases"]) == 12
    assert not [c["case"] for c in data["cases"] if "error" in c]


@pytest.mark.parametrize("case", sorted(json.loads(MEASURED.read_text())["cases"], key=lambda c: c["case"]),
                         ids=lambda c: c["case"])
def test_prediction_covers_the_measured_peak(case):
    """One-sided: the predicted bytes above the pre-step allocation cover the measured peak of forward + backward."""
    row = _rows()[case["case"]]
    assert row["predicted_peak_above"] >= row["measured_peak_above"]


def test_the_transient_terms_are_needed():
    """Without the recompute working set and the gradients in flight, the unfused-attention steps (the s x s
    scores of the layer in backward) are under-predicted: the terms are measured, not padding."""
    rows = _rows()
    short = [name for name, r in rows.items() if r["predicted_without_working_set"] < r["measured_peak_above"]]
    assert {"torch-full-math", "deepspeed-z3-full-math", "deepspeed-z3-full-math-small-buckets"} <= set(short)


def test_deepspeed_static_bytes_and_reduce_bucket():
    """DeepSpeed ZeRO-3 holds 16 bytes per parameter (bf16 weight and gradient partitions, fp32 master, Adam) plus
    its contiguous reduce bucket (reduce_bucket_size 16-bit elements) before the step, within 0.1 GiB."""
    for name, r in _rows().items():
        if name.startswith("deepspeed"):
            assert abs(r["measured_before"] - r["predicted_before"]) < 0.1 * GiB, name
    rows = _rows()
    bucket = rows["deepspeed-z3-full-math"]["measured_before"] - rows["deepspeed-z3-full-math-small-buckets"]["measured_before"]
    assert bucket == pytest.approx((5e8 - 1e7) * memory.DEEPSPEED_REDUCE_BUCKET_BYTES, rel=0.02)


def test_deepspeed_gathers_per_module_not_per_block():
    """The wide case (weights >> activations): DeepSpeed's live set is below two gathered blocks (what FSDP holds),
    and within the per-module bound; FSDP2's is above one block."""
    data = {c["case"]: c for c in json.loads(MEASURED.read_text())["cases"]}
    ds, fsdp = data["deepspeed-z3-full-flash-wide"], data["fsdp2-full-flash-wide"]
    block_bf16 = ds["params"]["block"] * 2
    assert ds["fwd_bwd_peak_bytes"] - ds["allocated_before_bytes"] < block_bf16
    fsdp_above_grads = fsdp["fwd_bwd_peak_bytes"] - fsdp["after_backward_bytes"]
    assert fsdp_above_grads > block_bf16
    bound = memory.zero3_working_set_bytes(ds["params"]["largest_linear"], gather_bytes=2, unit="module", max_live_params=1e9)
    assert ds["fwd_bwd_peak_bytes"] - ds["allocated_before_bytes"] < bound


def test_deepspeed_step_peak_is_covered_with_the_allowance():
    """The optimizer step of DeepSpeed ZeRO-3 casts gradient partitions to fp32 (two sub-groups' worth at once):
    the measured step peak is within the predicted static + step bytes plus the stack's allocator allowance."""
    profile = load_framework("deepspeed").behaviour.memory
    allowance = memory_calibration(profile.allocator)  # the stack's allocator setting's allowance (calibration.yaml)
    for case in json.loads(MEASURED.read_text())["cases"]:
        if case["stack"] != "deepspeed":
            continue
        n = case["params"]["total"]
        predicted = (16 * n + 4 * min(n, profile.zero3_step_fp32_grad_params)
                     + case["ds"]["reduce_bucket"] * memory.DEEPSPEED_REDUCE_BUCKET_BYTES)
        assert case["step_peak_bytes"] <= predicted * (1 + allowance.fragmentation_fraction) + allowance.fragmentation_fixed_bytes
        assert case["step_peak_bytes"] > 16 * n + 3 * min(n, profile.zero3_step_fp32_grad_params)  # the cast is real


def test_recompute_working_set_is_one_layer_without_recompute():
    layer = memory.LayerActivations(none=10.0, selective=6.0, full=1.0)
    assert memory.recompute_working_set_bytes(layer) == 9.0


def test_backward_transient_is_the_largest_gradient_pair():
    spec = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=8, seq_len=4096).model
    from planner.cost.compute import Shape

    flash = Shape(microbatch_size=2, seq_len=4096, tp=2, flash_attention=True)
    unfused = Shape(microbatch_size=2, seq_len=4096, tp=2, flash_attention=False)
    ffn = 2 * 4096 * 2 * 3 * spec.ffn_hidden_size / 2  # gated: output gradient f + input gradient 2f, bf16, /tp
    assert memory.backward_transient_bytes(spec, flash, moe_layer=False) == pytest.approx(ffn)
    scores = 2 * 2 * spec.num_attention_heads * 4096 * 4096 * 2 / 2
    assert memory.backward_transient_bytes(spec, unfused, moe_layer=False) == pytest.approx(max(ffn, scores))


def test_largest_linear_of_gpt3_530b_is_its_ffn_input():
    spec = api.build_request(model="mt-nlg-530b", topology="dgx-a100-80g", gpus=8, global_batch_size=8, seq_len=2048).model
    assert counting.largest_linear_params(spec) == 4 * spec.hidden_size ** 2


def test_full_recompute_charges_the_working_set_and_zero3_the_stack_s_unit():
    """Same candidate: full recompute holds more than its checkpoints (one layer's activations); DeepSpeed's
    per-module ZeRO-3 holds less gathered than FSDP's per-block ZeRO-3 (stage_other_bytes of the first pipeline
    rank, which holds no logits)."""
    request = api.build_request(model="mt-nlg-530b", topology="dgx-a100-80g", gpus=64, global_batch_size=64, seq_len=2048)
    cand = Candidate(dp=32, tp=1, pp=2, zero_stage=3, microbatch_size=1, num_microbatches=2, recompute="full")
    fsdp = CostModel(request.model_copy(update={"framework": "pytorch-fsdp"}))
    ds = CostModel(request.model_copy(update={"framework": "deepspeed"}))
    none = Candidate(**{**cand.__dict__, "recompute": "none"})
    assert fsdp.stage_other_bytes(cand, 0) > fsdp.stage_other_bytes(none, 0)
    assert ds.stage_other_bytes(cand, 0) < fsdp.stage_other_bytes(cand, 0)


def test_memory_benchmark_runs_its_code_path_on_cpu(tmp_path):
    """The script the committed file came from, on tiny sizes and CPU/gloo: a plain and an FSDP2 case run in
    their own processes and are written (DeepSpeed runs where it is installed; its absence is recorded)."""
    pytest.importorskip("torch")
    spec = importlib.util.spec_from_file_location("gpu_memory", ROOT / "benchmarks" / "gpu_memory.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "m.json"
    assert bench.main(["--device", "cpu", "--quick", "--cases", "torch-full-math", "fsdp2-full-flash-wide", "-o", str(out)]) == 0
    cases = {c["case"]: c for c in json.loads(out.read_text())["cases"]}
    assert set(cases) == {"torch-full-math", "fsdp2-full-flash-wide"}
    assert all("error" not in c and c["params"]["total"] > 0 for c in cases.values()), cases


def test_dropout_is_the_model_s_when_it_says_else_the_stack_s_default():
    """ModelSpec.dropout None (unsaid) takes the framework's behaviour.defaults.dropout (2021-22 Megatron-LM and
    Megatron-DeepSpeed default to 0.1 attention and hidden dropout; Megatron-Core's large-model recipes and
    torchtitan train without); a model that says wins."""
    request = api.build_request(model="mt-nlg-530b", topology="dgx-a100-80g", gpus=64, global_batch_size=64, seq_len=2048)
    unsaid = request.model.model_copy(update={"dropout": None})
    said = request.model.model_copy(update={"dropout": False})
    for framework, default in (("megatron-core", False), ("megatron-lm", True), ("deepspeed", True), ("torchtitan", False)):
        assert CostModel(request.model_copy(update={"framework": framework, "model": unsaid})).options.dropout is default
        assert CostModel(request.model_copy(update={"framework": framework, "model": said})).options.dropout is False
        spoken = request.model.model_copy(update={"dropout": True})
        assert CostModel(request.model_copy(update={"framework": framework, "model": spoken})).options.dropout is True
    llama = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=8, framework="megatron-core")
    assert llama.model.dropout is False and CostModel(llama).options.dropout is False


def test_dropout_of_a_huggingface_config():
    from planner.models.hf import dropout_of

    assert dropout_of({"attention_dropout": 0.0, "hidden_dropout": 0.0}) is False
    assert dropout_of({"resid_pdrop": 0.1, "attn_pdrop": 0.1}) is True
    assert dropout_of({"hidden_size": 4096}) is None
    assert dropout_of({"dropout": True}) is None  # a flag, not a probability: unsaid


def test_an_in_place_softmax_backward_holds_one_score_gradient():
    """Megatron's fused scaled-masked softmax overwrites its output gradient (its CUDA source: "backward pass is
    completely in-place"): without fused attention the gradient pair over the s x s scores is one tensor, not two."""
    from planner.cost.compute import Shape

    spec = api.build_request(model="gpt3-175b", topology="dgx-a100-80g", gpus=8, global_batch_size=8, seq_len=2048).model
    scores = spec.num_attention_heads * 2048 * 2048 * 2 * 2 / 8  # a*s^2*b bf16 elements, b = 2, tp = 8
    eager = Shape(microbatch_size=2, seq_len=2048, tp=8, flash_attention=False)
    fused = Shape(microbatch_size=2, seq_len=2048, tp=8, flash_attention=False, softmax_in_place=True)
    assert memory.backward_transient_bytes(spec, eager, moe_layer=False) == pytest.approx(2 * scores)
    assert memory.backward_transient_bytes(spec, fused, moe_layer=False) == pytest.approx(scores)
    assert load_framework("megatron-lm").behaviour.kernels.softmax_backward_in_place
    assert not load_framework("torchtitan").behaviour.kernels.softmax_backward_in_place
