"""The precision recipes as the executor runs them (planner.executor.precision), counted from the tensors it holds:
bf16, amp-bf16 and fp32 differ in bytes per parameter as stated, and each equals what the cost model prices for the
`planner` stack (CostModel.recipe: weights, gradients, optimizer incl. the fp32 master). Plain and FSDP2 (a 1-rank
gloo group) paths; autocast's bf16 weight copies counted from what autograd saves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from executor_plans import CPU, TINY, make_plan  # noqa: E402

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
