"""Every plan satisfies its invariants (hypothesis over random models and clusters), plans are deterministic to
the byte, and the golden plans in tests/golden/ are reproduced exactly."""

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.api import build_request, plan
from planner.errors import InfeasibleError
from planner.io import canonical_json
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import LaunchPlan, SearchLimits

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
LIMITS = SearchLimits(max_microbatch_size=2, zero_stages=(0, 1, 3), tp_overlap=("none",), top_k=2)


@st.composite
def requests(draw):
    heads = draw(st.sampled_from([4, 8, 12, 16]))
    kv = draw(st.sampled_from([h for h in (1, 2, 4, heads) if heads % h == 0]))
    head_dim = draw(st.sampled_from([32, 64]))
    moe = None
    if draw(st.booleans()):
        moe = MoESpec(num_experts=draw(st.sampled_from([2, 4, 8])), top_k=2, expert_ffn_hidden_size=256)
    model = ModelSpec(
        name="random", num_layers=draw(st.integers(1, 10)), hidden_size=heads * head_dim,
        ffn_hidden_size=draw(st.sampled_from([512, 768, 1024])), num_attention_heads=heads, num_kv_heads=kv,
        vocab_size=draw(st.sampled_from([1000, 32000])), seq_len=draw(st.sampled_from([256, 1024])),
        activation="swiglu", norm="rmsnorm", moe=moe,
    )
    gpus = draw(st.sampled_from([1, 2, 4, 6, 8, 16]))
    topology = draw(st.sampled_from(["dgx-h100", "dgx-a100-40g", "mi300x-8"]))
    gbs = draw(st.sampled_from([1, 4, 12, 16, 32]))
    return build_request(model=model, topology=topology, gpus=gpus, global_batch_size=gbs, seq_len=model.seq_len, search=LIMITS)


def check_invariants(p: LaunchPlan) -> None:
    req, par, batch, spec = p.request, p.parallelism, p.batch, p.request.model
    assert par.dp * par.tp * par.pp * par.cp == req.gpus == len(p.ranks)
    assert sorted(r.rank for r in p.ranks) == list(range(req.gpus))
    assert len(p.stages) == par.pp * par.vpp and spec.num_layers >= par.pp * par.vpp
    modules = [name for stage in p.stages for name in stage.layers]
    assert modules == ["tok_embeddings", *(f"layers.{i}" for i in range(spec.num_layers)), "norm", "output"]
    assert all(any(n.startswith("layers.") for n in stage.layers) for stage in p.stages)
    assert spec.num_attention_heads % par.tp == 0 and (spec.mla is not None or spec.kv_heads % par.tp == 0)
    assert batch.microbatch_size * batch.num_microbatches * par.dp == req.global_batch_size
    if spec.moe is not None:
        assert spec.moe.num_experts % par.ep == 0 and (par.dp * par.cp) % par.ep == 0
    else:
        assert par.ep == 1
    assert p.feasible and p.memory.fits
    assert all(m.peak_bytes <= p.memory.capacity_bytes for m in p.memory.per_stage)
    if p.schedule == "interleaved":
        assert batch.num_microbatches % par.pp == 0 and spec.num_layers % (par.pp * par.vpp) == 0
    fitting = p.solver.configurations_evaluated - p.pruned.get("does_not_fit", 0)
    assert fitting + sum(p.pruned.values()) == p.solver.configurations_considered


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_every_plan_satisfies_its_invariants(request):
    try:
        result = plan(request)
    except InfeasibleError as exc:
        assert "no plan fits" in str(exc) or "is valid" in str(exc)
        return
    check_invariants(result)


def test_same_request_same_bytes():
    request = build_request(model="tinyllama-1.1b", topology="dgx-h100", gpus=8, global_batch_size=16, seq_len=1024,
                            search=LIMITS)
    assert canonical_json(plan(request)) == canonical_json(plan(request))


def golden_files():
    return sorted(GOLDEN.glob("plan_*.json"))


@pytest.mark.parametrize("path", golden_files(), ids=lambda p: p.name)
def test_golden_plans_are_reproduced(path):
    committed = path.read_text()
    request = LaunchPlan.model_validate(json.loads(committed)).request
    recomputed = plan(request)
    check_invariants(recomputed)
    assert canonical_json(recomputed) == committed, f"{path.name} changed: regenerate with python tests/golden/make_plans.py"
