"""Sharding shapes of apply_ep / apply_tp / apply_dp on an 8-rank mesh, in one process with torch's "fake"
process-group backend (collectives are no-ops: this checks layouts, not numbers; the multi-process tests in
tests/integration/test_parallelize.py check the numbers)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from planner.errors import BadInputError  # noqa: E402
from planner.schemas.model import ModelSpec, MoESpec  # noqa: E402

SPEC = ModelSpec(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8, num_kv_heads=4,
                 vocab_size=128, seq_len=16, activation="swiglu", norm="rmsnorm",
                 moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=32, first_k_dense=1))


@pytest.fixture()
def fake_world():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    dist.init_process_group("fake", store=FakeStore(), rank=3, world_size=8)
    try:
        yield
    finally:
        dist.destroy_process_group()


def _local(p):
    return tuple(p.to_local().shape) if hasattr(p, "to_local") else tuple(p.shape)


def test_dp2_tp4_ep2_local_shapes(fake_world):
    from torch.distributed.device_mesh import init_device_mesh

    from planner.executor.parallelize import apply_dp, apply_ep, apply_tp, expert_params
    from planner.nn import Transformer

    mesh = init_device_mesh("cpu", (2, 4), mesh_dim_names=("dp", "tp"))
    model = Transformer(SPEC)
    model.init_weights(0)
    apply_ep(model, mesh["dp"].get_group())
    apply_tp(model, mesh["tp"], sp=True)
    apply_dp(model, mesh["dp"], zero_stage=3)
    params = dict(model.named_parameters())
    assert _local(params["layers.0.attention.wq.weight"]) == (64 // 4 // 2, 64)  # tp then FSDP rows
    assert _local(params["layers.0.attention.wk.weight"]) == (32 // 4 // 2, 64)
    assert _local(params["layers.0.attention.wo.weight"]) == (64 // 2, 64 // 4)  # tp cols, FSDP rows
    assert _local(params["layers.0.feed_forward.w2.weight"]) == (32, 128 // 4)
    assert _local(params["tok_embeddings.weight"]) == (128 // 4 // 2, 64)
    assert _local(params["layers.1.moe.experts.w1"]) == (8 // 2, 32, 64)  # experts/ep, not FSDP-sharded
    assert len(expert_params(model)) == 3 and not any(hasattr(p, "to_local") for p in expert_params(model))
    assert model(torch.randint(0, 128, (2, 16))).shape == (2, 16, 128)


def test_tp_that_does_not_divide_the_heads_is_refused(fake_world):
    from torch.distributed.device_mesh import init_device_mesh

    from planner.executor.parallelize import apply_tp
    from planner.nn import Transformer

    mesh = init_device_mesh("cpu", (8,), mesh_dim_names=("tp",))
    with pytest.raises(BadInputError, match="tp=8 must divide num_kv_heads=4"):
        apply_tp(Transformer(SPEC), mesh, sp=False)
