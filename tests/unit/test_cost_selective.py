"""Selective recompute by module (Megatron-Core --recompute-modules, planner.cost.selective): what each module drops
and reruns against the module structure transformer_config.py documents, the refusals Megatron-Core makes, the
estimate, search, export and service paths that carry the modules."""

import dataclasses
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.cost import arrays, memory
from planner.cost.model import Candidate, CostModel
from planner.errors import BadInputError, InfeasibleError
from planner.schemas.plan import Configuration, SearchLimits

DSV3 = dict(model="deepseek-v3", topology="dgx-h100", gpus=1024, global_batch_size=8192, seq_len=4096)
CAND = Candidate(dp=32, tp=2, pp=16, ep=64, sp=True, zero_stage=1, microbatch_size=1, num_microbatches=256,
                 recompute="selective")
DENSE, MOE = 1, 5  # module-table columns: layers.0 (dense, first_k_dense 3) and layers.4 (MoE)


def _columns(modules: tuple[str, ...], precision: str = "bf16", framework: str = "megatron-core", cand=CAND) -> dict:
    model = CostModel(api.build_request(**DSV3, precision=precision, framework=framework))
    table = arrays.module_table(model, dataclasses.replace(cand, recompute_modules=modules))
    return dict(zip(arrays.MODULE_FIELDS, table)), model


def _dropped(modules: tuple[str, ...], column: int, precision: str = "bf16") -> float:
    col, _ = _columns(modules, precision)
    return float(col["act_none"][column] - col["act_selective"][column])


def test_each_module_drops_its_own_tensors():
    """moe: everything inside the MoE layer (memory.FfnSaved.moe); mlp: the dense MLP's intermediates, nothing in
    an MoE layer; moe_act: the routed experts' fc2 input; layernorm: the two norm outputs the GEMMs save
    (2 * 2 bytes * s*b*h / tp with SP); mla_up_proj: the up-projected Q, K, V for the latents."""
    _, model = _columns(())
    shape = model.shape(CAND)
    s, h, t = 4096, model.spec.hidden_size, 2
    ffn_moe = memory.ffn_saved_bytes(model.spec, shape, moe_layer=True)
    ffn_dense = memory.ffn_saved_bytes(model.spec, shape, moe_layer=False)
    assert _dropped(("moe",), MOE) == pytest.approx(ffn_moe.moe, rel=1e-9)
    assert _dropped(("moe",), DENSE) == 0.0 and _dropped(("mlp",), MOE) == 0.0
    assert _dropped(("mlp",), DENSE) == pytest.approx(ffn_dense.mlp, rel=1e-9)
    assert ffn_dense.mlp == pytest.approx(s * 6 * model.spec.ffn_hidden_size / t)  # fused SwiGLU: 2f input + f fc2 input
    assert _dropped(("moe_act",), MOE) == pytest.approx(ffn_moe.routed_act_out, rel=1e-9)
    assert _dropped(("layernorm",), MOE) == pytest.approx(2 * 2 * s * h / t, rel=1e-9)
    mla = model.spec.mla
    qkv = 2 * s * 128 * (2 * (mla.qk_nope_head_dim + mla.qk_rope_head_dim) + mla.v_head_dim) / t
    latents = 2 * s * (mla.q_lora_rank + mla.kv_lora_rank + mla.qk_rope_head_dim)
    assert _dropped(("mla_up_proj",), MOE) == pytest.approx(qkv - latents, rel=1e-9)


def test_modules_add_up_and_moe_covers_its_parts():
    """Drops and reruns of a set are the sum of its modules'; "moe" reruns the whole layer, so moe_act and
    shared_experts add nothing on top of it."""
    both, _ = _columns(("mla_up_proj", "moe"))
    up, _ = _columns(("mla_up_proj",))
    moe, _ = _columns(("moe",))
    assert both["selective_s"][MOE] == pytest.approx(up["selective_s"][MOE] + moe["selective_s"][MOE], rel=1e-9)
    assert _dropped(("mla_up_proj", "moe"), MOE) == pytest.approx(_dropped(("mla_up_proj",), MOE) + _dropped(("moe",), MOE))
    covered, _ = _columns(("moe", "moe_act", "shared_experts"))
    assert covered["selective_s"][MOE] == moe["selective_s"][MOE]
    assert covered["act_selective"][MOE] == moe["act_selective"][MOE]


def test_moe_rerun_repeats_the_dispatch_and_the_experts():
    """The MoE layer's checkpoint reruns router, experts and the EP dispatch and combine (moe_layer.py
    moe_layer_recompute wraps the whole forward): more than its exposed all-to-all forward, less than a full
    layer recompute plus nothing; moe_act reruns only a memory-bound activation."""
    moe, _ = _columns(("moe",))
    act, _ = _columns(("moe_act",))
    assert moe["ep_fwd_s"][MOE] < moe["selective_s"][MOE] < moe["full_recompute_s"][MOE]
    assert 0 < act["selective_s"][MOE] < 0.05 * moe["selective_s"][MOE]


def test_core_attn_reruns_the_fused_kernel_for_its_log_sum_exp():
    """Megatron's default module with a fused kernel: the core's forward reruns (attention.py
    checkpoint_core_attention) to drop only the fp32 log-sum-exp, 4*b*a*s/tp bytes."""
    col, model = _columns(("core_attn",))
    assert col["selective_s"][MOE] > 0
    assert _dropped(("core_attn",), MOE) == pytest.approx(4 * 128 * 4096 / 2, rel=1e-9)
    default, _ = _columns(())  # megatron-core's own selective is that module
    assert default["selective_s"][MOE] == col["selective_s"][MOE]


def test_fp8_keeps_the_checkpointed_input_in_16_bits():
    """Under fp8 fc1 would have saved a 1-byte cast; a normally checkpointed MLP keeps its 2-byte input instead."""
    col, model = _columns((), precision="fp8")
    shape = model.shape(CAND)
    ffn = memory.ffn_saved_bytes(model.spec, shape, moe_layer=False)
    assert _dropped(("mlp",), DENSE, "fp8") == pytest.approx(ffn.mlp - 4096 * model.spec.hidden_size / 2, rel=1e-9)


def test_the_rerun_tensors_are_alive_while_the_layer_runs_its_backward():
    """A checkpointed module rebuilds what it dropped inside the backward: the layer's working set grows by it."""
    _, model = _columns(())
    cand = dataclasses.replace(CAND, recompute_modules=("moe",))
    col = dict(zip(arrays.MODULE_FIELDS, arrays.module_table(model, cand)))
    rebuilt = float((col["act_none"] - col["act_selective"]).max())
    with_rebuilt = arrays.layer_working_bytes(model, cand, recompute="selective")
    assert with_rebuilt >= rebuilt > 0
    assert with_rebuilt > arrays.layer_working_bytes(model, cand, recompute="none")


def test_the_nemo_recipe_fits_with_its_modules_and_not_priced_as_none():
    """NeMo's DeepSeek-V3 H100 recipe (model_configs_h100.csv: mla_up_proj/mlp/moe) holds far less than the same
    layout without recompute, and pays for it in time."""
    request = api.build_request(**DSV3, framework="megatron-core")
    configs = {mods: Configuration(parallelism=dict(dp=32, tp=2, pp=16, ep=64, sp=True, zero_stage=1),
                                   recompute="selective" if mods else "none", recompute_modules=mods,
                                   stage_layers=(4,) * 15 + (1,))
               for mods in ((), ("mla_up_proj", "mlp", "moe"))}
    none, modules = (api.estimate(request, c) for c in configs.values())
    assert modules.stages[0].recompute.modules == ("mla_up_proj", "mlp", "moe")
    assert modules.memory.peak_bytes < 0.6 * none.memory.peak_bytes
    assert modules.prediction.step_time_s > none.prediction.step_time_s


@pytest.mark.parametrize("modules, mode, message", [
    (("moe",), "full", "needs recompute='selective'"),
    (("moe", "moe"), "selective", "names a module twice"),
])
def test_configuration_refuses_modules_without_selective(modules, mode, message):
    with pytest.raises(ValueError, match=message):
        Configuration(parallelism=dict(dp=8, tp=1, pp=1), recompute=mode, recompute_modules=modules)


@pytest.mark.parametrize("model, modules, message", [
    ("llama3-8b", ("mla_up_proj",), "needs multi-latent attention"),
    ("llama3-8b", ("moe",), "need a mixture-of-experts model"),
    ("mixtral-8x7b", ("shared_experts",), "has no shared experts"),
    ("mixtral-8x7b", ("mlp",), "every layer of"),
])
def test_modules_the_model_lacks_are_refused(model, modules, message):
    request = api.build_request(model=model, topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=4096,
                                framework="megatron-core")
    config = Configuration(parallelism=dict(dp=8, tp=1, pp=1), recompute="selective", recompute_modules=modules)
    with pytest.raises(BadInputError, match=message):
        api.estimate(request, config)


def test_a_stack_without_megatrons_modules_refuses_them():
    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=4096,
                                framework="torchtitan")
    config = Configuration(parallelism=dict(dp=8, tp=1, pp=1, zero_stage=3), recompute="selective",
                           recompute_modules=("mlp",))
    with pytest.raises(BadInputError, match="is not run by framework 'torchtitan'"):
        api.estimate(request, config)
    limits = SearchLimits(recompute_modules=("mlp",), time_limit_s=5)
    with pytest.raises(BadInputError, match="is not run by framework 'torchtitan'"):
        api.plan(request.model_copy(update={"search": limits}))


def test_the_search_prices_its_selective_with_the_asked_modules():
    request = api.build_request(**DSV3, framework="megatron-core",
                                search=SearchLimits(recompute_modes=("selective",), time_limit_s=20, top_k=1,
                                                    recompute_modules=("mla_up_proj", "mlp", "moe")))
    plan = api.plan(request)
    assert all(stage.recompute.modules == ("mla_up_proj", "mlp", "moe") for stage in plan.stages)
    from planner.plan_verify import verify_plan

    verify_plan(plan)  # the modules travel with the plan: it re-derives to the same numbers


def test_cli_estimate_writes_the_modules_and_refuses_a_misspelt_one(tmp_path):
    runner = CliRunner()
    base = ["estimate", "--model", "deepseek-v3", "--gpus", "1024", "--tp", "2", "--pp", "16", "--ep", "64", "--sp",
            "--zero", "1", "--global-batch-size", "8192", "--seq-len", "4096", "--framework", "megatron-core",
            "--first-stage-layers", "4", "--last-stage-layers", "1", "--recompute", "selective"]
    out = tmp_path / "plan.json"
    done = runner.invoke(app, base + ["--recompute-modules", "mla_up_proj,mlp,moe", "-o", str(out)])
    assert done.exit_code == 0, done.output
    assert json.loads(out.read_text())["stages"][0]["recompute"]["modules"] == ["mla_up_proj", "mlp", "moe"]
    checked = runner.invoke(app, ["check", str(out)])
    assert checked.exit_code == 0, checked.output
    bad = runner.invoke(app, base + ["--recompute-modules", "mla_up_proj,moe_layer"])
    assert bad.exit_code == 2
    assert "--recompute-modules=mla_up_proj,moe_layer: moe_layer is not a module" in bad.output
    assert "Traceback" not in bad.output


def test_service_refuses_modules_without_selective_in_one_line():
    from planner.service.worker import solve

    body = dict(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=4096,
                framework="megatron-core", recompute="full", recompute_modules=["mlp"])
    status, text = solve("estimate", json.dumps(body), 64)
    assert status == 422
    detail = json.loads(text)["detail"]
    assert "recompute_modules" in detail and "selective" in detail and "\n" not in detail


def _dsv3_plan(modules: tuple[str, ...], precision: str = "bf16"):
    request = api.build_request(**DSV3, precision=precision, framework="megatron-core")
    config = Configuration(parallelism=dict(dp=32, tp=2, pp=16, ep=64, sp=True, zero_stage=1), recompute="selective",
                           recompute_modules=modules, stage_layers=(4,) * 15 + (1,))
    return api.estimate(request, config)


def _verdict(plan, edit=None):
    from planner.export import export_plan
    from planner.export.common import Export
    from planner.export.judges import judge
    from planner.export.verdicts import JudgeUnavailable

    export = export_plan(plan, "megatron")
    if edit is not None:
        export = Export(target=export.target, text=edit(export.text), suffix=export.suffix)
    try:
        return export, judge(plan, export)
    except JudgeUnavailable as exc:
        pytest.skip(str(exc))


def test_megatron_export_names_the_modules_and_megatron_core_accepts_them():
    export, verdict = _verdict(_dsv3_plan(("mla_up_proj", "mlp", "moe")))
    assert "--recompute-modules mla_up_proj mlp moe" in " ".join(export.text.split())
    assert verdict.accepted, verdict.reason


def test_fp8_layernorm_recompute_exports_current_scaling_which_megatron_requires():
    """transformer_config.py: "Delayed scaling does not support moe_act and layernorm recompute for fp8"; the export
    asks for per-tensor current scaling, and the judge refuses the same export without it."""
    plan = _dsv3_plan(("layernorm", "mla_up_proj"), precision="fp8")
    export, verdict = _verdict(plan)
    assert "--fp8-recipe tensorwise" in " ".join(export.text.split()) and verdict.accepted, verdict.reason
    _, delayed = _verdict(plan, lambda text: text.replace("--fp8-recipe tensorwise", ""))
    assert not delayed.accepted and "Delayed scaling" in delayed.reason


def test_shared_expert_recompute_drops_the_shared_expert_overlap():
    """Megatron-Core refuses shared_experts recompute with --moe-shared-expert-overlap: the cost prices no shared
    overlap for it and the export never writes the flag beside it (the same plan without the module does)."""
    from planner.export.megatron import moe_overlap_args

    request = api.build_request(model=str(Path(__file__).resolve().parents[1] / "data" / "hf" / "deepseek-v2-lite"), topology="dgx-h100", gpus=16,
                                global_batch_size=256, seq_len=4096, framework="megatron-core")
    plans = {}
    for modules in (("mla_up_proj",), ("mla_up_proj", "shared_experts")):
        config = Configuration(parallelism=dict(dp=8, tp=1, pp=2, ep=8, zero_stage=1), recompute="selective",
                               recompute_modules=modules)
        plans[modules] = api.estimate(request, config)
        assert _verdict(plans[modules])[1].accepted
    plain, recomputed = plans.values()
    assert plain.parallelism.moe_dispatcher == "alltoall" and moe_overlap_args(plain, []) == ["--moe-shared-expert-overlap"]
    alltoall = recomputed.model_copy(update={"parallelism": recomputed.parallelism.model_copy(
        update={"moe_dispatcher": "alltoall"})})
    assert moe_overlap_args(alltoall, []) == []
    assert recomputed.prediction.step_time_s > plain.prediction.step_time_s


def test_memoised_parts_tell_recompute_modes_apart():
    """What a rank holds besides its activations depends on the recompute mode and modules (the rebuilt working
    set): a model that priced one mode first prices the next as a fresh model does (CostModel.other_per_rank was
    once memoised on `recompute == "full"` only, and the search kept a selective plan that did not fit)."""
    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=64, global_batch_size=64, seq_len=32768,
                                framework="deepspeed")
    base = Candidate(dp=16, tp=4, pp=1, sp=True, zero_stage=1, microbatch_size=1, num_microbatches=4)
    variants = [dataclasses.replace(base, recompute=mode) for mode in ("none", "selective", "full")]
    shared = CostModel(request)
    for cand in variants:
        fresh = CostModel(request).evaluate(cand)
        assert shared.evaluate(cand).peak_bytes == fresh.peak_bytes
    assert len({CostModel(request).evaluate(c).peak_bytes for c in variants}) == 3


def test_the_search_returns_a_plan_that_fits_where_only_full_recompute_does():
    """Llama-3 8B at 32k tokens on a stack without fused attention: the s x s scores a selective recompute rebuilds
    inside the backward do not fit at tp 4; the search's plan fits, as its own evaluation says."""
    request = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=64, global_batch_size=64, seq_len=32768,
                                framework="deepspeed", search=SearchLimits(time_limit_s=20, top_k=0))
    plan = api.plan(request)
    assert plan.feasible and plan.memory.fits


def test_the_search_reaches_nemos_folded_expert_layout():
    """NeMo's DeepSeek-V3 H100 layout folds ep 64 over dp 32 x tp 2 (Megatron-Core MoE parallel folding); the search
    enumerates ep = dp*cp times a divisor of tp for a stack whose experts fold (expert_parallel.span tp_dp_cp)."""
    limits = SearchLimits(time_limit_s=30, top_k=0, fixed={"tp": 2, "pp": 16, "ep": 64}, recompute_modes=("selective",),
                          recompute_modules=("mla_up_proj", "mlp", "moe"))
    plan = api.plan(api.build_request(**DSV3, framework="megatron-core", search=limits))
    assert (plan.parallelism.dp, plan.parallelism.ep, plan.parallelism.tp) == (32, 64, 2) and plan.memory.fits
    with pytest.raises(InfeasibleError, match="no factorisation"):  # DeepSpeed carves experts from dp only
        api.plan(api.build_request(**DSV3, framework="deepspeed", search=limits.model_copy(
            update={"recompute_modules": (), "recompute_modes": ("none", "selective", "full")})))


def test_the_search_tries_the_stacks_module_sets_for_moe_models():
    """megatron-core's capabilities.recompute.module_sets (its MoE README's fine-grained recompute, NeMo's DeepSeek-V3
    recipe), each less the modules the model lacks, searched beside the stack's own selective; none for a dense model,
    a stack without sets, or a request that names its own modules."""
    from planner.frameworks import load_framework
    from planner.search.entry import module_sets

    core = load_framework("megatron-core")
    dsv3 = api.build_request(**DSV3, framework="megatron-core")
    assert module_sets(dsv3, core) == [("layernorm", "mla_up_proj", "moe_act"), ("mla_up_proj", "mlp", "moe")]
    mixtral = api.build_request(model="mixtral-8x7b", topology="dgx-h100", gpus=64, global_batch_size=256, seq_len=4096,
                                framework="megatron-core")
    assert module_sets(mixtral, core) == [("layernorm", "moe_act"), ("moe",)]  # no MLA, no dense MLP layer
    dense = api.build_request(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=4096)
    assert module_sets(dense, core) == [] and module_sets(dsv3, load_framework("torchtitan")) == []
    named = dsv3.model_copy(update={"search": SearchLimits(recompute_modules=("moe",))})
    assert module_sets(named, core) == []
    plan = api.plan(dsv3.model_copy(update={"search": SearchLimits(time_limit_s=60, top_k=2)}))
    from planner.plan_verify import verify_plan

    verify_plan(plan)
    assert plan.stages[0].recompute.modules in module_sets(dsv3, core)  # fastest that fits at this size (predicted)
    without = api.plan(dsv3.model_copy(update={"search": SearchLimits(time_limit_s=60, top_k=2,
                                                                       recompute_modes=("none", "full"))}))
    assert plan.prediction.step_time_s <= without.prediction.step_time_s
