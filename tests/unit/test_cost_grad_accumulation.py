"""Gradient accumulation over micro-batches outside the weight-gradient GEMM (planner.cost.grad_accumulation), each
path against the stack code it comes from:
- DeepSpeed BF16_Optimizer.update_hp_grads (56c522386 bf16_optimizer.py, called per micro-batch by pipe/engine.py):
  hp_grad.add_(lp.grad.to(fp32)) = read 2, write 4, read 4 + 4, write 4 bytes, every micro-batch;
- Megatron-LM v2.5 bf16: param.main_grad.add_(param.grad.data) in a hook = read 2 + 4, write 4, every micro-batch;
- torch AccumulateGrad (fp16, DeepSpeed ZeRO-1): .grad += new in place = 2 + 2 + 2, micro-batches after the first;
- Megatron-Core's gradient_accumulation_fusion: nothing outside the GEMM."""

import copy
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from published_grad_accumulation import grad_accumulation_of, source_month  # noqa: E402

from planner import api  # noqa: E402
from planner.cost import grad_accumulation  # noqa: E402
from planner.cost.model import Candidate, CostModel  # noqa: E402
from planner.cost.stack import options_for  # noqa: E402
from planner.frameworks import load_framework  # noqa: E402
from planner.models import counting  # noqa: E402

BF16_OPTIMIZER_BYTES = 2 + 4 + 4 + 4 + 4  # lp.grad read, its fp32 copy written, copy + accumulator read, accumulator written
MAIN_GRAD_HOOK_BYTES = 2 + 4 + 4  # .grad read, fp32 main_grad read and written
AUTOGRAD_BYTES = 2 + 2 + 2  # .grad read, new gradient read, .grad written (16-bit)


def _cand(**kw) -> Candidate:
    return Candidate(**{"dp": 1, "tp": 1, "pp": 1, "microbatch_size": 1, "num_microbatches": 4, "zero_stage": 0, **kw})


BF16_OPTIMIZER_HELD = 4 + 2  # its full-size fp32 accumulator beside the bf16 lp grads (bf16_optimizer.py)
ZERO_BUCKET = 2 * 5e8  # stage_1_and_2.py setup_buckets: two reduce_bucket_size buffers under overlap_comm


@pytest.mark.parametrize("profile, cand, expected", [
    # bf16 + pipeline + no ZeRO: the BFLOAT16 wrapper
    ("deepspeed", _cand(pp=2), (BF16_OPTIMIZER_BYTES, True, BF16_OPTIMIZER_HELD, 0.0, True)),
    ("deepspeed", _cand(pp=2, zero_stage=1), (AUTOGRAD_BYTES, False, 2.0, ZERO_BUCKET, False)),  # bf16 + ZeRO-1: the ZeRO optimizer
    ("deepspeed", _cand(), (AUTOGRAD_BYTES, False, 2.0, 0.0, False)),  # bf16 without pipeline: DDP_BFLOAT16
    ("deepspeed", _cand(dp=2, zero_stage=2), None),  # ZeRO-2 reduce-scatters every micro-batch
    ("legacy/deepspeed-2021", _cand(pp=2), (AUTOGRAD_BYTES, False, 2.0, 0.0, False)),  # before BF16_Optimizer
    ("megatron-lm", _cand(pp=2), (MAIN_GRAD_HOOK_BYTES, True, None, 0.0, False)),  # the recipe's fp32 main_grad
    ("megatron-core", _cand(pp=2, zero_stage=1), (0.0, False, None, 0.0, False)),
    ("torchtitan", _cand(), None),
])
def test_each_stack_runs_its_own_path(profile, cand, expected):
    found = grad_accumulation.path_for(options_for(profile, "bf16").grad_accum_paths, cand)
    assert (found if found is None else found[2:]) == expected


def _step(framework: str, cand: Candidate, paths=None) -> float:
    request = api.build_request(model="gpt-neox-20b", gpus=cand.world_size, precision="bf16", framework=framework,
                                seq_len=2048, global_batch_size=cand.dp * cand.microbatch_size * cand.num_microbatches)
    options = options_for(framework, "bf16")
    if paths is not None:
        options = dataclasses.replace(options, grad_accum_paths=paths)
    model = CostModel(request, options=options)
    return model.evaluate(cand).step_time_s, model


@pytest.mark.parametrize("framework, every, num_bytes", [("megatron-lm", True, MAIN_GRAD_HOOK_BYTES),
                                                         ("deepspeed", False, AUTOGRAD_BYTES)])
def test_the_step_pays_bytes_per_parameter_per_microbatch(framework, every, num_bytes):
    """Without a pipeline: m (or m - 1) x bytes x the GPU's parameters / the achieved HBM bandwidth, added to the step."""
    cand = _cand(num_microbatches=8)
    with_it, model = _step(framework, cand)
    without, _ = _step(framework, cand, paths=())
    params = counting.total_params(model.spec)
    expected = (8 if every else 7) * num_bytes * params / model.hbm_rate_Bps
    assert with_it - without == pytest.approx(expected, rel=0.02)
    parts = model.evaluate(cand).breakdown  # its own line of the breakdown, which still sums to the step
    assert parts.grad_accum_s == pytest.approx(expected, rel=0.02)
    assert sum(parts.model_dump().values()) == pytest.approx(with_it)


def test_one_microbatch_stored_by_autograd_costs_nothing():
    cand = _cand(num_microbatches=1)
    assert _step("deepspeed", cand)[0] == pytest.approx(_step("deepspeed", cand, paths=())[0])


def test_the_bf16_optimizer_makes_many_small_microbatches_dearer():
    """Per micro-batch the cost is fixed while the work shrinks with the micro-batch: at one global batch the
    BF16_Optimizer favours the larger micro-batch more than a fused stack does."""
    small, big = _cand(pp=2, microbatch_size=1, num_microbatches=16), _cand(pp=2, microbatch_size=4, num_microbatches=4)
    ratio_bf16 = _step("deepspeed", small)[0] / _step("deepspeed", big)[0]
    ratio_fused = _step("deepspeed", small, paths=())[0] / _step("deepspeed", big, paths=())[0]
    assert ratio_bf16 > ratio_fused * 1.01


BASE = {"id": "r", "source": {"title": "A source", "url": ""},
        "training": {"framework": "Megatron-DeepSpeed", "precision": "bf16"}, "parallel": {"num_gpus": 8}}


def _run(framework: str, precision: str, url: str = "") -> dict:
    r = copy.deepcopy(BASE)
    r["training"].update(framework=framework, precision=precision)
    r["source"]["url"] = url
    return r


def test_a_stated_fp16_run_takes_the_fp16_path():
    assert grad_accumulation_of(_run("GPT-NeoX (Megatron + DeepSpeed)", "FP16 (dynamic loss scaling)"), "deepspeed") == {
        "grad_accum_paths": (((1,), None, AUTOGRAD_BYTES, False, 2.0, ZERO_BUCKET, False),
                             ((0,), None, AUTOGRAD_BYTES, False, 2.0, 0.0, False))}
    assert grad_accumulation_of(_run("Megatron-DeepSpeed", "BF16"), "deepspeed") == {}  # the profile's own


def test_a_named_bf16_optimizer_runs_at_zero_stage_one_too():
    found = grad_accumulation_of(_run("Megatron-DeepSpeed (BF16_Optimizer = ZeRO-1 equivalent)", "BF16"), "deepspeed")
    assert found == {"grad_accum_paths": (((0, 1), None, BF16_OPTIMIZER_BYTES, True, BF16_OPTIMIZER_HELD, 0.0, True),)}
    assert grad_accumulation_of(_run("Megatron-DeepSpeed (BF16_Optimizer)", "BF16"), "deepspeed",
                                off=("grad_accumulation_stated",)) == {}


def test_megatron_lm_sources_from_february_2022_ran_the_fusion():
    assert source_month(_run("Megatron-LM", "", "https://arxiv.org/abs/2205.05198")) == (2022, 5)
    assert grad_accumulation_of(_run("Megatron-LM", "mixed precision (16-bit)", "https://arxiv.org/abs/2205.05198"),
                                "megatron-lm") == {"grad_accum_paths": ()}
    assert grad_accumulation_of(_run("Megatron-LM", "mixed precision (16-bit)", "https://arxiv.org/abs/2104.04473"),
                                "megatron-lm") == {}  # the v2.5 hook, the profile's own
    fp16 = grad_accumulation_of(_run("Megatron-LM", "fp16", "https://arxiv.org/abs/2205.05198"), "megatron-lm")
    assert fp16 == {"grad_accum_paths": (((0,), None, AUTOGRAD_BYTES, False, 2.0, 0.0, False),)}  # fp16 fusion only from 2022-09


def test_every_path_is_sourced_in_its_profile():
    for name in ("deepspeed", "megatron-lm", "megatron-core", "legacy/deepspeed-2021"):
        found = load_framework(name).behaviour.grad_accumulation
        assert found is not None and found.source and {p.dtype for p in found.paths} == {"bf16", "fp16"}


@pytest.mark.parametrize("precision, priced", [("bf16", True), ("fp8", True), ("fp32", False), ("amp-bf16", False)])
def test_paths_are_for_sixteen_bit_gradients(precision, priced):
    """The profiles record the bf16 and fp16 paths; fp32 parameters accumulate 4-byte gradients, priced by no path."""
    assert bool(options_for("deepspeed", precision).grad_accum_paths) is priced


@pytest.mark.parametrize("bad", [{"zero_stages": (7,)}, {"bytes_per_element": 1e300}, {"bytes_per_element": -1},
                                 {"name": "sgd"}, {"grad_bytes": 65}, {"grad_bytes": -2}, {"bucket_params": 1e13}])
def test_a_profile_path_out_of_range_is_refused(bad):
    import pydantic

    from planner.schemas.framework_behaviour import AccumulationPath

    fields = {"name": "autograd", "dtype": "bf16", "zero_stages": (0,), "bytes_per_element": 6, "every_microbatch": False}
    with pytest.raises(pydantic.ValidationError, match=next(iter(bad))):
        AccumulationPath(**{**fields, **bad})


@pytest.mark.parametrize("cand, grad_bytes, bucket", [
    (_cand(dp=2, pp=2), BF16_OPTIMIZER_HELD, 0.0),  # BF16_Optimizer: fp32 accumulator (whole group) + bf16 lp grads
    (_cand(dp=2, pp=2, zero_stage=1), 2.0, ZERO_BUCKET),  # the ZeRO optimizer: the bf16 .grad and its bucket
])
def test_deepspeed_holds_its_optimizers_gradients(cand, grad_bytes, bucket):
    """A rank's gradient bytes are what its DeepSpeed optimizer keeps through the backward (bf16_optimizer.py
    fp32_groups_gradients_flat, stage_1_and_2.py setup_buckets), not the recipe's fp32 main gradients (4 bytes per
    parameter), and both keep their fp32 states on a 1/dp share, BF16_Optimizer at ZeRO-0 too
    (fp32_groups_flat_partition); with options.grad_accum_memory off (the ablation) the recipe's again."""
    _, model = _step("deepspeed", cand)
    ablated = CostModel(model.request, options=dataclasses.replace(model.options, grad_accum_memory=False))
    ev, off = model.evaluate(cand), ablated.evaluate(cand)
    params = ev.raw_stage_memory[0] / model.recipe.weight_bytes  # weights row: 2 bytes per parameter held
    assert ev.raw_stage_memory[1] == pytest.approx(grad_bytes * params)
    assert off.raw_stage_memory[1] == pytest.approx(4 * params)
    assert ev.raw_stage_memory[2] == pytest.approx(12 * params / cand.dp)  # fp32 master, m, v on a 1/dp share
    sharded = 12 * params / (cand.dp if cand.zero_stage else 1)  # off: ZeRO-0 keeps them whole
    assert off.raw_stage_memory[2] == pytest.approx(sharded)
    allowance = 1 + model.mem_cal.fragmentation_fraction  # the peak row is allocated bytes x (1 + fraction) + fixed
    held = (grad_bytes - 4) * params + 2 * bucket + ev.raw_stage_memory[2] - off.raw_stage_memory[2]  # bucket: 16-bit
    assert ev.raw_stage_memory[-1] - off.raw_stage_memory[-1] == pytest.approx(held * allowance, rel=1e-6)
