"""The `planner` stack priced as the executor now runs (planner/data/frameworks/planner.yaml behaviour.executor: bf16-params, grouped,
fused, sdpa_gqa native), each mechanism against the executor's own code: planner/executor/precision.py
(MasterWeightOptimizer), parallelize.py (build_optimizer, mp_policy), planner/nn/model.py (AttentionCore)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from planner import api
from planner.cost import executor
from planner.cost.static_bytes import executor_uncast_bytes
from planner.cost.model import CostModel
from planner.cost.notes import candidate_of
from planner.cost.stack import options_for
from planner.frameworks import load_framework
from planner.schemas.plan import Configuration, Parallelism


def _model(precision: str, gpus: int = 8, **changes):
    request = api.build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=gpus, global_batch_size=32, seq_len=2048,
                                precision=precision)
    options = dataclasses.replace(options_for("planner", precision), **changes)
    return request, CostModel(request, options=options)


def _cand(request, *, dp=8, zero=0, mb=4):
    return candidate_of(request, Configuration(parallelism=Parallelism(dp=dp, tp=1, pp=1, zero_stage=zero), microbatch_size=mb))


def test_profile_facts_are_the_executor_now():
    facts = load_framework("planner").behaviour.executor
    assert (facts.bf16_recipe, facts.moe_expert_impl, facts.adamw_impl, facts.sdpa_gqa) == ("bf16-params", "grouped", "fused", "native")


def test_master_step_constants_are_precision_py_s():
    precision = pytest.importorskip("planner.executor.precision")
    assert executor.MASTER_STEP_CHUNK_ELEMENTS == precision.MASTER_STEP_CHUNK_NUMEL


def test_bf16_step_moves_40_bytes_per_parameter_against_fused_adamw_s_28():
    """MasterWeightOptimizer.step: grad.float() (2 + 4), fused AdamW on the master (28), master -> bf16 (4 + 2)."""
    times = {}
    for precision in ("bf16", "fp32"):
        request, model = _model(precision)
        times[precision] = model.evaluate(_cand(request)).breakdown.optimizer_s
    assert times["bf16"] / times["fp32"] == pytest.approx(40 / 28, rel=1e-9)


def test_bf16_step_transient_is_one_chunk_of_fp32_gradients():
    """4 bytes x min(local elements, max(2**26, largest local parameter)); FSDP2 shards the largest parameter."""
    from planner.cost.step_memory import step_extra_bytes

    request, model = _model("bf16")
    row = {"dense": np.array([1.1e9]), "expert": np.array([0.0])}
    chunk = max(2**26, executor.largest_parameter(model.spec))
    assert step_extra_bytes(model, _cand(request), row)[0] == 4 * chunk
    assert step_extra_bytes(model, _cand(request, zero=3), row)[0] == 4 * min(1.1e9 / 8, 2**26)
    amp_request, amp = _model("amp-bf16")
    assert np.all(np.asarray(step_extra_bytes(amp, _cand(amp_request), row)) == 0)  # fused AdamW: no temporaries


def test_amp_bf16_under_fsdp2_holds_whole_autocast_copies_now():
    """The executor now autocasts amp-bf16 on every path (FSDP2 gathers fp32, no policy: behaviour.memory.recipes
    amp-bf16 gather 4), so each layer's bf16 weight copies are whole, not sharded; c162dfb ran no autocast there."""
    dense, expert = np.array([1e8, 5e7, 5e7, 1e8]), np.zeros(4)
    now = executor_uncast_bytes(dense, expert, recompute="none", zero_stage=3, dp=8, autocast_under_fsdp=True)
    assert now[1] == pytest.approx(2 * 5e7 / 8 - 2 * 5e7)  # negative: the whole copy added to the sharded 6/dp
    assert now[0] == pytest.approx(2 * 1e8 / 8)  # the embedding is never cast
    old = executor_uncast_bytes(dense, expert, recompute="none", zero_stage=3, dp=8)
    assert np.allclose(old, 2 * dense / 8)
    zero1 = executor_uncast_bytes(dense, expert, recompute="full", zero_stage=1, dp=8, autocast_under_fsdp=True)
    assert np.allclose(zero1, [2e8, 1e8, 1e8, 0.0])
    request, model = _model("amp-bf16")
    assert model.recipe.gather_bytes == 4 and model.recipe.weight_bytes == 6


def test_gqa_inside_sdpa_saves_kv_heads_only():
    """AttentionCore passes k, v with their kv heads (enable_gqa) in 16-bit; fp32 on CUDA repeats them."""
    from planner.cost.compute import Shape
    from planner.models import load_model

    spec, shape = load_model("tinyllama-1.1b"), Shape(microbatch_size=1, seq_len=2048)
    native = executor.recipe_for("bf16", bf16_autocast=False, sdpa_gqa="native")
    repeat = executor.recipe_for("bf16", bf16_autocast=False, sdpa_gqa="repeat")
    saved = executor.attention_bytes(spec, shape, repeat)[1] - executor.attention_bytes(spec, shape, native)[1]
    assert saved == 2 * 2 * shape.tokens * (spec.num_attention_heads - spec.kv_heads) * spec.dim_per_head
    assert executor.recipe_for("fp32", bf16_autocast=False, sdpa_gqa="native").repeat_kv
