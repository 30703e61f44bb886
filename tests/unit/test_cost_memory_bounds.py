"""Memory you can trust one-sidedly: the predicted peak (allocated + the stack's allocator allowance) is never below
a measured peak of memory actually reserved, component by component where the rows allow, and a configuration that
ran is not predicted out of memory (benchmarks/accuracy.py reports the published runs)."""

import json
from pathlib import Path

import pytest

from planner import api
from planner.cost import memory
from planner.cost.model import Candidate, CostModel
from planner.cost.stack import hf_eager_options  # the rows ran HuggingFace's modeling code, not the executor's

VALIDATION = Path(__file__).resolve().parents[2] / "validation" / "h100_hf_tinyllama.jsonl"


def _rows():
    if not VALIDATION.is_file():
        return []
    return [json.loads(line) for line in VALIDATION.read_text().splitlines() if '"status": "ok"' in line]


@pytest.mark.skipif(not VALIDATION.is_file(), reason="validation data not present")
@pytest.mark.parametrize("index", range(8))
def test_predicted_peak_covers_the_measured_reserved_peak(index):
    """h100_hf_tinyllama.jsonl (HF TinyLlama, amp-bf16, one H100): predicted peak >= peak_reserved_gib, and the
    allocated part within 5% of peak_alloc_gib (so the bound is not bought with a loose allocated estimate)."""
    row = _rows()[index]
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1, global_batch_size=row["micro_batch"],
                                seq_len=row["seq"], precision="amp-bf16")
    model = CostModel(request, options=hf_eager_options("amp-bf16"))
    ev = model.evaluate(Candidate(dp=1, tp=1, pp=1, microbatch_size=row["micro_batch"], num_microbatches=1,
                                  recompute="full" if row["checkpointing"] else "none"))
    cal = model.mem_cal
    allocated = (ev.peak_bytes - cal.fragmentation_fixed_bytes) / (1 + cal.fragmentation_fraction)
    assert ev.peak_bytes / 2**30 >= row["peak_reserved_gib"]
    assert allocated / 2**30 == pytest.approx(row["peak_alloc_gib"], rel=0.05)


def test_fsdp_stacks_hold_fp32_master_parameters():
    """bf16 with the parameters as fp32 master (FSDP MixedPrecision, the planner executor): 4 + 4 + 8 = 16 bytes per
    parameter; Megatron's bf16 weights + fp32 main grads + fp32 master + Adam: 2 + 4 + 12 = 18."""
    req = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=8, seq_len=2048)
    fsdp = CostModel(req.model_copy(update={"framework": "pytorch-fsdp"}))
    core = CostModel(req.model_copy(update={"framework": "megatron-core"}))
    assert fsdp.recipe.total == 16 and core.recipe.total == 18 and fsdp.recipe is memory.FP32_MASTER_PARAMS_BF16
    cand = Candidate(dp=8, tp=1, pp=1, zero_stage=3, microbatch_size=1, num_microbatches=1)
    ratio = fsdp.layer_costs(cand).static_bytes.sum() / core.layer_costs(cand).static_bytes.sum()
    assert ratio == pytest.approx(16 / 18, rel=1e-9)


def test_allocator_allowance_is_the_stack_s():
    """Each stack's allowance is calibration.yaml's entry of the allocator setting its launch runs under
    (behaviour.memory.allocator, cited in the profile); a profile's own allocator_allowance_fraction overrides it."""
    req = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=8, seq_len=2048)
    from planner.cost.calibration import memory_calibration
    from planner.frameworks import list_frameworks, load_framework

    settings = set()
    for name in list_frameworks():
        profile = load_framework(name).behaviour.memory
        assert profile.allocator_allowance_fraction is None and len(profile.allocator_source) > 20, name  # cited
        expected = memory_calibration(profile.allocator)
        got = CostModel(req.model_copy(update={"framework": name})).mem_cal
        assert (got.fragmentation_fraction, got.fragmentation_fixed_bytes, got.allocator) == (
            expected.fragmentation_fraction, expected.fragmentation_fixed_bytes, profile.allocator), name
        settings.add(profile.allocator)
    assert settings == {"default", "expandable_segments"}  # torchtitan's run_train.sh, NeMo's executors.py
    everything = str(Path(__file__).resolve().parents[1] / "data" / "frameworks" / "everything.yaml")
    assert CostModel(req.model_copy(update={"framework": everything})).mem_cal.fragmentation_fraction == 0.05


def test_unmeasured_allocator_setting_carries_the_measured_default():
    """No invented number: until benchmarks/gpu_memory_allocator.py has run on a GPU, expandable_segments' entry is
    the measured default's, and says so."""
    from planner.cost.calibration import memory_calibration

    default, expandable = memory_calibration("default"), memory_calibration("expandable_segments")
    assert default.measured and default.fragmentation_fraction == pytest.approx(0.094)
    if not expandable.measured:
        assert expandable.source.startswith("not measured: benchmarks/gpu_memory_allocator.py")
        assert (expandable.fragmentation_fraction, expandable.fragmentation_fixed_bytes) == (
            default.fragmentation_fraction, default.fragmentation_fixed_bytes)
    with pytest.raises(ValueError, match="allocator='cudaMallocAsync'"):
        memory_calibration("cudaMallocAsync")


@pytest.mark.skipif(not VALIDATION.is_file(), reason="validation data not present")
def test_allowance_is_the_one_sided_envelope_of_the_rows():
    """calibration.yaml memory.fragmentation_fraction = max over the rows of (reserved - fixed) / predicted
    allocated - 1 (rounded up to 3 places): derived, and no looser than needed."""
    from planner.cost.calibration import memory_calibration

    cal, needed = memory_calibration(), []
    for row in _rows():
        request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=1,
                                    global_batch_size=row["micro_batch"], seq_len=row["seq"], precision="amp-bf16")
        model = CostModel(request, options=hf_eager_options("amp-bf16"))
        ev = model.evaluate(Candidate(dp=1, tp=1, pp=1, microbatch_size=row["micro_batch"], num_microbatches=1,
                                      recompute="full" if row["checkpointing"] else "none"))
        allocated = (ev.peak_bytes - cal.fragmentation_fixed_bytes) / (1 + model.mem_cal.fragmentation_fraction)
        needed.append((row["peak_reserved_gib"] * 2**30 - cal.fragmentation_fixed_bytes) / allocated - 1)
    assert max(needed) <= cal.fragmentation_fraction <= max(needed) + 0.001
