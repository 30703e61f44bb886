"""The MoE token dispatcher: the cost prices the least exposed one the stack runs (planner.cost.moe_comm.choose), the
plan carries it (Parallelism.moe_dispatcher) and the Megatron export writes it (--moe-token-dispatcher-type), judged
by the megatron-core wheel's TransformerConfig where installed."""

from __future__ import annotations

import pytest
from test_export import LLAMA, make_plan

from planner import api
from planner.cost import moe_comm
from planner.export import export_plan
from planner.export.judges import judge
from planner.export.verdicts import JudgeUnavailable
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import Configuration, Parallelism

MOE = ModelSpec(**LLAMA, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))


def for_megatron_core(plan):
    """The plan as if made for the megatron-core stack (whose cost prices the EP overlap the export then writes)."""
    return plan.model_copy(update={"request": plan.request.model_copy(update={"framework": "megatron-core"})})


def test_allgather_gets_no_overlap():
    """Megatron-Core runs its EP overlaps with alltoall and flex only (transformer_config.py)."""
    options = {"alltoall": (2.0, 2.0), "allgather": (1.0, 1.0)}
    hidden = moe_comm.choose(options, layer_s=(3.0, 3.0), shared_s=(0.0, 0.0), batch_overlap=True, shared_overlap=False)
    assert hidden == ("alltoall", 0.0, 0.0)
    plain = moe_comm.choose(options, layer_s=(3.0, 3.0), shared_s=(0.0, 0.0), batch_overlap=False, shared_overlap=False)
    assert plain == ("allgather", 1.0, 1.0)
    assert moe_comm.choose({}, layer_s=(1, 1), shared_s=(0, 0), batch_overlap=True, shared_overlap=True) == (None, 0.0, 0.0)


def test_the_plan_carries_the_priced_dispatcher_and_the_export_writes_it():
    request = api.build_request(model=MOE, topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="megatron-core")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=16, tp=1, pp=1, ep=8, zero_stage=1),
                                               schedule="1f1b"))
    chosen = plan.parallelism.moe_dispatcher
    assert chosen in ("alltoall", "flex", "allgather")
    assert f"--moe-token-dispatcher-type {chosen}" in export_plan(plan, "megatron").text
    dense = api.estimate(api.build_request(model=ModelSpec(**LLAMA), topology="dgx-h100", gpus=8, global_batch_size=64,
                                           seq_len=4096, framework="megatron-core"),
                         Configuration(parallelism=Parallelism(dp=8, tp=1, pp=1, zero_stage=1), schedule="1f1b"))
    assert dense.parallelism.moe_dispatcher is None and "moe_dispatcher" not in dense.parallelism.model_dump()


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex", "allgather"])
def test_megatron_export_of_each_dispatcher(dispatcher):
    base = for_megatron_core(make_plan(dp=4, tp=2, pp=1, ep=4, spec=MOE))
    plan = base.model_copy(update={"parallelism": base.parallelism.model_copy(update={"moe_dispatcher": dispatcher})})
    text = export_plan(plan, "megatron").text
    assert f"--moe-token-dispatcher-type {dispatcher}" in text
    assert ("--moe-flex-dispatcher-backend deepep" in text) == (dispatcher == "flex")
    assert ("--overlap-moe-expert-parallel-comm" in text) == (dispatcher != "allgather")
    pytest.importorskip("megatron.core")
    try:
        verdict = judge(plan, export_plan(plan, "megatron"))
    except JudgeUnavailable as exc:
        pytest.skip(str(exc))
    assert verdict.accepted, verdict.reason


def test_megatron_judge_refuses_the_overlap_with_allgather():
    """What the export must not write: the EP overlap with the allgather dispatcher (transformer_config.py asserts)."""
    pytest.importorskip("megatron.core")
    base = for_megatron_core(make_plan(dp=4, tp=2, pp=1, ep=4, spec=MOE))
    export = export_plan(base, "megatron")
    assert "--overlap-moe-expert-parallel-comm" in export.text
    broken = type(export)(target=export.target, text=export.text.replace("--moe-token-dispatcher-type alltoall",
                                                                         "--moe-token-dispatcher-type allgather"),
                          suffix=export.suffix)
    try:
        verdict = judge(base, broken)
    except JudgeUnavailable as exc:
        pytest.skip(str(exc))
    assert not verdict.accepted
