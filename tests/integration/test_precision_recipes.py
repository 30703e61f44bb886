"""The precision recipes as the executor runs them (planner.executor.precision), counted from the tensors it holds:
bf16, amp-bf16 and fp32 differ in bytes per parameter as stated, and each equals what the cost model prices for the
`planner` stack (CostModel.recipe: weights, gradients, optimizer incl. the fp32 master). Plain and FSDP2 (a 1-rank
gloo group) paths; autocast's bf16 weight copies counted from what autograd saves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from executor_plans import CPU, TINY, honest, make_plan  # noqa: E402

from planner.schemas.plan import PlanRequest  # noqa: E402

RECIPES = ("fp32", "amp-bf16", "bf16")
# (weights, grads, masters + Adam moments) bytes per parameter the executor holds (planner.executor.precision)
STATED = {"fp32": (4, 4, 8), "amp-bf16": (4, 4, 8), "bf16": (2, 2, 12)}


@pytest.fixture(scope="module")
def one_rank_group(tmp_path_factory):
    if not dist.is_initialized():
        store = dist.FileStore(str(tmp_path_factory.mktemp("store") / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _cost_recipe(precision: str):
    from planner.cost.model import CostModel

    request = PlanRequest(model=TINY, topology=CPU, gpus=1, global_batch_size=2, seq_len=16, precision=precision,
                          framework="planner")
    return CostModel(request).recipe


def _step(precision: str, zero_stage: int):
    """One training step of TINY under the recipe; (held bytes after backward, after the optimizer step, params,
    bytes of bf16 weight copies autograd saved in the forward)."""
    from torch.distributed.device_mesh import init_device_mesh

    from planner.executor.parallelize import apply_dp, build_optimizer
    from planner.executor.precision import autocast_dtype, cast_parameters, held_bytes
    from planner.executor.train import cross_entropy
    from planner.nn import Transformer

    model = Transformer(TINY)
    model.init_weights(0)
    numel = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    cast_parameters(model, precision)
    casts = [p.detach().to(torch.bfloat16) for p in model.parameters()] if precision == "amp-bf16" else []
    if zero_stage:
        model = apply_dp(model, init_device_mesh("cpu", (1,)), zero_stage=zero_stage, precision=precision)
    opt = build_optimizer(model, zero_stage=zero_stage, precision=precision)
    tokens = torch.randint(0, TINY.vocab_size, (2, 17), generator=torch.Generator().manual_seed(0))
    copies = {}

    def pack(t):  # a saved bf16 tensor equal to a parameter's bf16 cast (or its transpose) is autocast's copy of it
        if t.dtype == torch.bfloat16 and any(torch.equal(t, c) or (c.dim() == 2 and torch.equal(t, c.t()))
                                             for c in casts if c.numel() == t.numel()):
            copies[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    dtype = autocast_dtype(precision)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with torch.autocast("cpu", dtype=dtype, enabled=dtype is not None):
            logits = model(tokens[:, :-1])
        loss = cross_entropy(logits, tokens[:, 1:])
    loss.backward()
    after_backward = held_bytes(list(model.parameters()), opt)
    opt.step()
    after_step = held_bytes(list(model.parameters()), opt)
    return after_backward, after_step, numel, sum(copies.values())


@pytest.mark.parametrize("zero_stage", [0, 3])
def test_recipes_hold_the_bytes_per_parameter_the_cost_model_prices(one_rank_group, zero_stage):
    held = {}
    for precision in RECIPES:
        backward, step, numel, copies = _step(precision, zero_stage)
        per_param = (backward["weights"] / numel, backward["grads"] / numel,
                     (step["masters"] + step["optimizer_states"]) / numel)
        held[precision] = per_param
        print(f"zero {zero_stage} {precision}: weights {per_param[0]:.2f} grads {per_param[1]:.2f} "
              f"optimizer {per_param[2]:.2f} (masters {step['masters'] / numel:.2f}) autocast copies {copies / numel:.2f}")
        assert per_param == pytest.approx(STATED[precision])
        recipe = _cost_recipe(precision)
        cast_copies = 2.0 if precision == "amp-bf16" else 0.0  # priced inside amp-bf16's weight bytes (memory.RECIPES)
        assert (recipe.weight_bytes - cast_copies, recipe.grad_bytes, recipe.optimizer_bytes) == pytest.approx(per_param)
        if precision == "amp-bf16":  # autocast copies every matmul weight once; the embedding table is not a matmul
            assert 0 < copies <= cast_copies * numel
            assert copies == 2 * (numel - TINY.vocab_size * TINY.hidden_size - _norm_numel())
        else:
            assert copies == 0
    assert held["bf16"] != held["amp-bf16"] and held["bf16"][0] == held["amp-bf16"][0] / 2


def _norm_numel() -> int:
    return TINY.hidden_size * (2 * TINY.num_layers + 1)


def test_bf16_step_updates_the_fp32_master_and_writes_the_bf16_parameters_back():
    from planner.executor.parallelize import build_optimizer
    from planner.executor.precision import MasterWeightOptimizer

    weight = torch.nn.Parameter(torch.full((3,), 1.0, dtype=torch.bfloat16))
    opt = build_optimizer(torch.nn.Linear(1, 1), zero_stage=0, optimizer="sgd", lr=1e-3, precision="bf16")
    assert isinstance(opt, MasterWeightOptimizer)
    opt = MasterWeightOptimizer([weight], torch.optim.SGD, lr=1e-3)
    for _ in range(4):  # 4 updates of 1e-3: each alone is below bf16's spacing at 1.0 (2**-7), their sum is not
        weight.grad = torch.ones(3, dtype=torch.bfloat16)
        opt.step()
    assert opt.masters[0].dtype == torch.float32 and weight.grad is None
    assert opt.masters[0][0].item() == pytest.approx(1 - 4e-3)
    assert weight[0].item() == torch.tensor(1 - 4e-3).to(torch.bfloat16).item() != 1.0


# bf16 keeps 8 significand bits: unit roundoff 2**-8. Parameters are bf16 roundings of fp32 masters and every op
# computes in bf16, so a loss drifts from the fp32 run's by about one unit (measured <= 3.2e-3 on these layouts);
# 2 units (0.78%) bound it, as for amp-bf16 (test_executor_capabilities.BF16_REL_TOL).
BF16_REL_TOL = 2 * 2.0**-8


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "layout"), [
    ("dense", dict(dp=2, zero_stage=1)),
    ("dense", dict(pp=2, schedule="2bw")),
    ("moe", dict(dp=2, ep=2)),
    ("dense", dict(tp=2, sp=True, zero_stage=0)),
], ids=["dp2-zero1", "pp2-2bw", "ep2-moe", "tp2-sp"])
def test_bf16_runs_track_fp32_and_hold_bf16_weights(spec, layout, tmp_path):
    """`planner run` of a bf16 plan: losses within BF16_REL_TOL of the fp32 single-process reference (2BW: of its
    delayed update), and every rank's parameter storage is 2 bytes per local parameter (2BW: two versions)."""
    from executor_plans import TINY_MOE
    from executor_reference import LR, SEED, reference_2bw_losses, reference_losses

    from planner.executor.run import run_plan
    from planner.launch_spec.options import RunOptions

    plan = make_plan(TINY if spec == "dense" else TINY_MOE, **layout)
    plan = honest(plan.model_copy(update={"request": plan.request.model_copy(update={"precision": "bf16"})}))
    report = run_plan(plan, options=RunOptions(lr=LR, seed=SEED, timeout_s=90, steps=4), report_path=tmp_path / "run.json")
    fp32 = make_plan(TINY if spec == "dense" else TINY_MOE, **layout)
    reference = reference_2bw_losses(fp32, 4) if layout.get("schedule") == "2bw" else reference_losses(fp32, 4)
    worst = max(abs(g - r) / abs(r) for g, r in zip(report.losses, reference))
    print(f"bf16 vs fp32 ({layout}): largest relative difference {worst:.2e}")
    assert len(report.losses) == 4 and worst <= BF16_REL_TOL
    fp32_report = run_plan(honest(fp32), options=RunOptions(lr=LR, seed=SEED, timeout_s=90, steps=1), report_path=tmp_path / "fp32.json")
    for bf16_rank, fp32_rank in zip(report.memory, fp32_report.memory):
        assert bf16_rank.weights_bytes * 2 == fp32_rank.weights_bytes > 0


def test_fp8_is_refused_on_cpu_and_on_gpus_without_fp8_with_the_reason(tmp_path):
    """One line naming the reason: `planner run` before launch (CPU), the rank on a GPU under compute capability 8.9,
    the plan check for what the executor cannot convert (MoE experts, TP)."""
    from executor_plans import TINY_MOE

    from planner.errors import BadInputError
    from planner.executor.fp8 import fp8_refusal
    from planner.executor.run import run_plan
    from planner.launch_spec.options import RunOptions
    from planner.launch_spec.runnable import check_runnable

    plan = make_plan(TINY, num_microbatches=1)
    plan = honest(plan.model_copy(update={"request": plan.request.model_copy(update={"precision": "fp8"})}))
    check_runnable(plan)  # the profile lists fp8: the device decides
    with pytest.raises(BadInputError, match=r"^precision='fp8' needs fp8 tensor cores .* this run is on cpu, which has no fp8 matmul"):
        run_plan(plan, options=RunOptions(device="cpu", steps=1), report_path=tmp_path / "run.json")
    assert "compute capability 8.0" in fp8_refusal("cuda", (8, 0), torchao_installed=True)  # A100
    assert fp8_refusal("cuda", (9, 0), torchao_installed=True) is None  # H100
    assert "pip install 'llm-planner[fp8]'" in fp8_refusal("cuda", (8, 9), torchao_installed=False)
    for spec, update in ((TINY_MOE, {}), (TINY, {"tp": 2})):
        other = make_plan(spec, num_microbatches=1, **update)
        other = other.model_copy(update={"request": other.request.model_copy(update={"precision": "fp8"})})
        with pytest.raises(BadInputError, match=r"precision=fp8 (is not runnable on an MoE model|with tp=2 is not runnable)"):
            check_runnable(other)


def bf16_and_fp8_losses(device) -> dict[str, list[float]]:
    """4 AdamW steps of TINY under the bf16 recipe and under fp8 on `device`, checking on the way that every decoder
    nn.Linear (not the LM head) became a torchao Float8Linear, that the optimizer holds fp32 masters
    (MasterWeightOptimizer) and that the parameters stay bf16."""
    from planner.executor.fp8 import apply_fp8
    from planner.executor.parallelize import build_optimizer
    from planner.executor.precision import MasterWeightOptimizer, cast_parameters
    from planner.executor.train import synthetic_batches, train_steps
    from planner.nn import Transformer

    losses = {}
    for precision in ("bf16", "fp8"):
        model = Transformer(TINY)
        model.init_weights(0)
        cast_parameters(model, precision)
        if precision == "fp8":
            assert apply_fp8(model) == 7 * TINY.num_layers  # wq wk wv wo w1 w2 w3
            assert type(model.output).__name__ == "Linear"
            assert sum(type(m).__name__ == "Float8Linear" for m in model.modules()) == 7 * TINY.num_layers
        model = model.to(device)
        opt = build_optimizer(model, zero_stage=0, lr=1e-2, precision=precision)
        assert isinstance(opt, MasterWeightOptimizer)
        batches = [(x.to(device), y.to(device)) for x, y in synthetic_batches(
            vocab_size=TINY.vocab_size, batch_size=4, seq_len=16, steps=4, seed=0)]
        losses[precision] = train_steps(model, opt, batches)
        assert all(p.dtype == torch.bfloat16 for p in model.parameters())
    return losses


def _fp8_gpu() -> bool:
    import importlib.util

    return (torch.cuda.is_available() and torch.cuda.get_device_capability(0) >= (8, 9)
            and importlib.util.find_spec("torchao") is not None)


@pytest.mark.skipif(not _fp8_gpu(), reason="needs a GPU with fp8 tensor cores (compute capability >= 8.9) and torchao")
def test_fp8_trains_with_float8_linears_on_an_fp8_gpu():
    """On an fp8 GPU: every decoder nn.Linear (not the LM head) becomes a torchao Float8Linear, the parameters stay
    bf16 with fp32 masters, and 4 AdamW steps track the bf16 recipe's losses within 5% (e4m3 keeps 3 mantissa bits)."""
    from planner.executor.fp8 import check_fp8

    device = torch.device("cuda", 0)
    check_fp8(device)
    losses = bf16_and_fp8_losses(device)
    assert max(abs(a - b) / b for a, b in zip(losses["fp8"], losses["bf16"])) < 0.05


@pytest.mark.slow
def test_bf16_resume_restores_the_fp32_masters(tmp_path):
    """A bf16 run checkpointed at step 2 and resumed gives steps 3-4 bit-identically to the uninterrupted run: the
    checkpoint carries the fp32 masters (rebuilding them from the bf16 parameters would round them and drift).
    ZeRO-1 over dp=2: each rank saves its own masters and moment partition."""
    from executor_reference import LR, SEED

    from planner.executor.run import run_plan
    from planner.launch_spec.options import RunOptions

    plan = make_plan(TINY, dp=2, zero_stage=1)
    plan = honest(plan.model_copy(update={"request": plan.request.model_copy(update={"precision": "bf16"})}))

    def run(steps, **kw):
        return run_plan(plan, options=RunOptions(lr=LR, seed=SEED, timeout_s=90, steps=steps, **kw),
                        report_path=tmp_path / f"run{steps}{sorted(kw)}.json")

    whole = run(4)
    run(2, checkpoint_dir=str(tmp_path / "ckpt"), checkpoint_every=2)
    resumed = run(4, checkpoint_dir=str(tmp_path / "ckpt"), resume=True)
    assert resumed.first_step == 3 and list(resumed.losses) == list(whole.losses[2:])


def test_fp8_conversion_and_master_step_run_where_torchao_is_installed():
    """The fp8 code path without fp8 hardware (torchao's float8 GEMMs have a CPU fallback in torch 2.13; the
    executor still refuses CPU runs, which would not be fp8 speed): the decoder's nn.Linear layers become
    Float8Linear, the LM head stays, parameters stay bf16 with fp32 masters, and 4 AdamW steps stay within 1% of
    the bf16 recipe's losses."""
    pytest.importorskip("torchao.float8")
    losses = bf16_and_fp8_losses(torch.device("cpu"))
    assert max(abs(a - b) / b for a, b in zip(losses["fp8"], losses["bf16"])) < 0.01
