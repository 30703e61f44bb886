"""Megatron-Core's MoE overlaps priced only where Megatron-Core runs them, and exported exactly where priced.

The batch-level EP overlap (--overlap-moe-expert-parallel-comm) is refused by TransformerConfig.__post_init__
(megatron/core/transformer/transformer_config.py, megatron-core 0.16.1, lines 1852-1888) with pp > 1 and no virtual
stages, any full recompute, fp32, and together with the shared-expert overlap; the shared-expert overlap
(--moe-shared-expert-overlap) runs with the alltoall dispatcher only (line 1090). The installed wheel's own
TransformerConfig is the oracle where it is importable (planner.export.judges)."""

from __future__ import annotations

import itertools

import pytest
from test_export import LLAMA, make_plan

from planner import api
from planner.cost import moe_comm
from planner.export import export_plan
from planner.export.judges import judge
from planner.export.verdicts import JudgeUnavailable
from planner.frameworks import load_framework
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import Configuration, Parallelism

MOE = ModelSpec(**LLAMA, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))
SHARED = ModelSpec(**LLAMA, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024, num_shared_experts=1))
NEEDS = load_framework("megatron-core").behaviour.overlap.moe_all_to_all_needs
FLAG = "--overlap-moe-expert-parallel-comm"


def _megatron_core(plan):
    return plan.model_copy(update={"request": plan.request.model_copy(update={"framework": "megatron-core"})})


def _verdict(plan, export):
    pytest.importorskip("megatron.core")
    try:
        return judge(plan, export)
    except JudgeUnavailable as exc:
        pytest.skip(str(exc))


LAYOUTS = [  # (pp, vpp, recompute, full_layers per stage, precision)
    (1, 1, "none", None, "bf16"), (1, 1, "selective", None, "bf16"), (1, 1, "full", None, "bf16"),
    (2, 1, "none", None, "bf16"), (2, 2, "none", None, "bf16"), (2, 2, "selective", None, "bf16"),
    (2, 2, "full", None, "bf16"), (2, 1, "none", [1, 0], "bf16"), (1, 1, "none", [1], "bf16"),
    (1, 1, "none", None, "fp32"),
]


def _plan(pp, vpp, recompute, full, precision, spec=MOE, dispatcher="alltoall"):
    base = _megatron_core(make_plan(dp=2, tp=2, pp=pp, vpp=vpp, ep=2, spec=spec, recompute=recompute,
                                    full_layers=full, precision=precision, gbs=16))
    return base.model_copy(update={"parallelism": base.parallelism.model_copy(update={"moe_dispatcher": dispatcher})})


def test_the_rule_names_each_condition():
    assert set(NEEDS) == {"interleaved_when_pp", "no_full_recompute", "half_precision", "no_moe_recompute",
                          "single_mtp_layer"}
    kw = dict(pp=1, vpp=1, recompute="none", full_layers=False, precision="bf16")
    assert moe_comm.batch_overlap_applies(NEEDS, **kw)
    for change in (dict(pp=2), dict(recompute="full"), dict(full_layers=True), dict(precision="fp32"),
                   dict(recompute="selective", modules=("mla_up_proj", "moe")), dict(mtp_layers=2)):
        assert not moe_comm.batch_overlap_applies(NEEDS, **{**kw, **change}), change
    assert moe_comm.batch_overlap_applies(NEEDS, **{**kw, "recompute": "selective", "modules": ("moe_act", "mlp")})
    assert moe_comm.batch_overlap_applies(NEEDS, **{**kw, "mtp_layers": 1})
    assert moe_comm.batch_overlap_applies(NEEDS, **{**kw, "pp": 2, "vpp": 2})
    assert moe_comm.batch_overlap_applies((), **{**kw, "pp": 2, "recompute": "full", "precision": "fp32"})  # DualPipe


@pytest.mark.parametrize("pp,vpp,recompute,full,precision", LAYOUTS)
def test_megatron_accepts_the_flag_exactly_where_the_rule_says(pp, vpp, recompute, full, precision):
    """The oracle: Megatron-Core's TransformerConfig with the flag forced into the export."""
    plan = _plan(pp, vpp, recompute, full, precision)
    export = export_plan(plan, "megatron")
    expected = moe_comm.batch_overlap_applies(NEEDS, pp=pp, vpp=vpp, recompute=recompute, full_layers=bool(full and any(full)),
                                              precision=precision)
    assert (FLAG in export.text) == expected
    forced = export if FLAG in export.text else type(export)(
        target=export.target, text=export.text.replace("  --moe-grouped-gemm\n", f"  --moe-grouped-gemm\n  {FLAG}\n"),
        suffix=export.suffix)
    assert FLAG in forced.text
    assert _verdict(plan, forced).accepted == expected
    assert _verdict(plan, export).accepted


@pytest.mark.parametrize("dispatcher", ["alltoall", "flex", "allgather"])
def test_shared_expert_overlap_with_alltoall_only_and_never_with_the_batch_overlap(dispatcher):
    for pp, vpp in ((2, 1), (1, 1)):  # the batch-level overlap refused / run
        plan = _plan(pp, vpp, "none", None, "bf16", spec=SHARED, dispatcher=dispatcher)
        export = export_plan(plan, "megatron")
        batch = pp == 1 and dispatcher != "allgather"
        assert (FLAG in export.text) == batch
        assert ("--moe-shared-expert-overlap" in export.text) == (not batch and dispatcher == "alltoall")
        assert _verdict(plan, export).accepted
    no_shared = export_plan(_plan(2, 1, "none", None, "bf16", dispatcher=dispatcher), "megatron")
    assert "--moe-shared-expert-overlap" not in no_shared.text


def test_the_shared_overlap_is_priced_with_alltoall_only():
    options = {"alltoall": (2.0, 2.0), "flex": (1.5, 1.5)}
    kw = dict(layer_s=(3.0, 3.0), shared_s=(1.0, 1.0), batch_overlap=False, shared_overlap=True)
    assert moe_comm.choose(options, **kw) == ("alltoall", 1.0, 1.0)  # flex gets no shared-expert overlap
    assert moe_comm.choose(options, **{**kw, "batch_overlap": True}) == ("alltoall", 0.0, 0.0)


def _estimate(pp, vpp, recompute, gpus=16, **kw):
    request = api.build_request(model=MOE, topology="dgx-h100", gpus=gpus, global_batch_size=64, seq_len=4096,
                                framework="megatron-core", **kw)
    dp = gpus // pp
    return api.estimate(request, Configuration(parallelism=Parallelism(dp=dp, tp=1, pp=pp, vpp=vpp, ep=8, zero_stage=1),
                                               schedule="interleaved" if vpp > 1 else "1f1b", recompute=recompute))


def test_the_cost_exposes_the_all_to_all_where_megatron_refuses_the_overlap():
    """pp 2 without virtual stages, or full recompute: the all-to-all priced exposed (more EP time than with the
    overlap), and the export writes the flag exactly where the cost hid it."""
    hidden = _estimate(1, 1, "none")
    exposed_full = _estimate(1, 1, "full")
    interleaved, plain = _estimate(2, 2, "none"), _estimate(2, 1, "none")
    assert exposed_full.prediction.breakdown.ep_comm_s > hidden.prediction.breakdown.ep_comm_s
    assert plain.prediction.breakdown.ep_comm_s > interleaved.prediction.breakdown.ep_comm_s
    for plan, flagged in ((hidden, True), (exposed_full, False), (interleaved, True), (plain, False)):
        text = export_plan(plan, "megatron").text
        assert (FLAG in text) == (flagged and plan.parallelism.moe_dispatcher != "allgather")


def test_the_search_adds_no_partial_full_recompute_to_an_overlapped_plan():
    request = api.build_request(model=MOE, topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="megatron-core")
    plan = api.plan(request)
    export = export_plan(plan, "megatron")
    if FLAG in export.text:
        assert not any(stage.recompute.full_layers for stage in plan.stages)
    assert "expect the all-to-all exposed" not in " ".join(export.warnings)
    assert _verdict(plan, export).accepted


def test_every_layout_pair_of_the_rule_is_covered():
    covered = {(pp > 1 and vpp == 1, recompute == "full" or bool(full and any(full)), precision == "fp32")
               for pp, vpp, recompute, full, precision in LAYOUTS}
    assert {c for c in itertools.product((False, True), repeat=3) if sum(c) <= 1} <= covered


@pytest.mark.parametrize("gpus,gbs,fixed", [(16, 32, {}), (16, 32, {"pp": 2})])
def test_pruned_search_equals_exhaustive_with_the_layout_dependent_overlap(gpus, gbs, fixed):
    """The floors take the overlap wherever the stack has it, the members their own (planner.search.members):
    with the overlap depending on vpp and recompute, the pruned search still finds what brute force finds."""
    from test_search_driver import NARROW, SMALL_MOE, _summary, small_request

    from planner.search.driver import search

    limits = NARROW.model_copy(update=dict(fixed=fixed, schedules=("1f1b", "interleaved"), zero_stages=(0, 1)))
    request = small_request(model=SMALL_MOE, gpus=gpus, gbs=gbs, limits=limits, framework="megatron-core")
    pruned, full = search(request), search(request, exhaustive=True)
    assert pruned.ranked and _summary(pruned) == _summary(full)
    assert pruned.evaluated < full.evaluated


def test_a_plan_whose_stack_profile_is_not_here_exports_with_megatron_cores_rule():
    plan = _plan(1, 1, "none", None, "bf16")
    elsewhere = plan.model_copy(update={"request": plan.request.model_copy(update={"framework": "/elsewhere/stack.yaml"})})
    export = export_plan(elsewhere, "megatron")
    assert FLAG in export.text and any("not found here" in w for w in export.warnings)
    torchtitan = plan.model_copy(update={"request": plan.request.model_copy(update={"framework": "torchtitan"})})
    assert FLAG not in export_plan(torchtitan, "megatron").text  # torchtitan's cost priced no overlap


def _with_stage_modules(plan, modules):
    stages = tuple(stage.model_copy(update={"recompute": stage.recompute.model_copy(update={"modules": modules})})
                   for stage in plan.stages)
    return plan.model_copy(update={"stages": stages})


def test_no_flag_where_selective_reruns_the_moe_block():
    """Megatron-LM d98e8a64 transformer_config.py line 3030: 'disable moe in recompute_modules when enabling
    overlap_moe_expert_parallel_comm' (megatron-core 0.16.1 accepts both, so the installed judge cannot be the
    oracle here): the export leaves the flag out, as the cost prices the all-to-all exposed."""
    base = _plan(1, 1, "selective", None, "bf16")
    assert FLAG in export_plan(_with_stage_modules(base, ("moe_act",)), "megatron").text
    assert FLAG not in export_plan(_with_stage_modules(base, ("mla_up_proj", "moe")), "megatron").text


@pytest.mark.parametrize("mtp", [1, 2])
def test_megatron_refuses_the_flag_with_two_mtp_layers(mtp):
    """megatron-core 0.16.1 transformer_config.py line 1889: 'MTP layernum only supports 1 when enabling
    overlap_moe_expert_parallel_comm'."""
    spec = MOE.model_copy(update={"mtp_num_layers": mtp})
    plan = _plan(1, 1, "none", None, "bf16", spec=spec)
    assert (FLAG in export_plan(plan, "megatron").text) == (mtp == 1)
