"""`planner profile --tp-runtime dtensor`: layers timed as the executor runs TP (DTensor, fake process group)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from planner.errors import BadInputError  # noqa: E402
from planner.profiling.options import ProfileOptions  # noqa: E402
from planner.schemas.model import ModelSpec  # noqa: E402

SPEC = ModelSpec(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=128, num_attention_heads=8, num_kv_heads=4,
                 vocab_size=128, seq_len=16, activation="swiglu", norm="rmsnorm")


@pytest.fixture()
def no_world():
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    try:
        yield
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def test_unknown_tp_runtime_is_bad_input():
    with pytest.raises(BadInputError, match="tp_runtime"):
        ProfileOptions(seq_len=16, tp_runtime="megatron")


@pytest.mark.parametrize("layer_type", ["embedding", "decoder", "head"])
def test_dtensor_case_holds_rank_shards_and_runs(no_world, layer_type):
    from planner.profiling.measure_dtensor import dtensor_case

    case = dtensor_case(SPEC, layer_type, tp=2, ep=1, microbatch_size=2, seq_len=16, device=torch.device("cpu"),
                        param_dtype=torch.float32)
    assert any(hasattr(p, "to_local") for p in case.module.parameters())
    out = case.apply(case.make_inputs())[0]
    out.float().sum().backward()
    assert dist.get_world_size() == 2


def test_dtensor_profile_entries(no_world):
    from planner.profiling.measure import profile_model

    opts = ProfileOptions(seq_len=16, tp=(1, 2), layer_types=("decoder",), warmup=0, repeats=1, ops=False,
                          tp_runtime="dtensor")
    profile = profile_model(SPEC, opts)
    by_tp = {e.tp: e for e in profile.entries}
    assert by_tp[2].status == "ok" and by_tp[2].forward_s > 0
    assert by_tp[2].params_bytes < 0.51 * by_tp[1].params_bytes  # the plain build at the rank's shape (norms whole)
