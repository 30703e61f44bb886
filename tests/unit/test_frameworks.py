"""Framework profiles: the files load strictly, the CLI shows and validates them, the search explores only what the
chosen stack runs, `estimate` refuses what it cannot run, 2BW is opt-in, and the frameworks' own validity rules
(uneven interleaved splits, MoE parallel folding) hold."""

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.errors import BadInputError
from planner.frameworks import Config, config_of, interleaved_split_reason, list_frameworks, load_framework, refusal
from planner.schemas.plan import Configuration, Parallelism, SearchLimits

runner = CliRunner()
EVERYTHING = str(Path(__file__).resolve().parents[1] / "data" / "frameworks" / "everything.yaml")
SHIPPED = ("deepspeed", "hai-llm", "megatron-core", "megatron-lm", "planner", "pytorch-fsdp", "torchtitan")
FAST = SearchLimits(max_microbatch_size=2, top_k=3, time_limit_s=20)


def test_every_shipped_profile_loads_and_every_section_is_sourced():
    assert tuple(list_frameworks()) == SHIPPED
    for name in SHIPPED:
        profile = load_framework(name)
        assert profile.name == name
        dumped = profile.model_dump()
        for section in ("recompute", "zero", "sequence_parallel", "context_parallel", "expert_parallel", "interleaved_split"):
            assert dumped["capabilities"][section]["source"], (name, section)
        assert all(s.source and s.native_name for s in profile.capabilities.schedules)
        assert all(rule.source for rule in profile.capabilities.exclusions)


def test_cli_list_show_validate():
    listed = runner.invoke(app, ["framework", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    assert [row["name"] for row in json.loads(listed.output)] == list(SHIPPED)
    shown = runner.invoke(app, ["framework", "show", "torchtitan", "--json"])
    assert shown.exit_code == 0 and json.loads(shown.output)["export"]["names"]["head_module"] == "lm_head"
    table = runner.invoke(app, ["framework", "show", "megatron-core"], terminal_width=200)
    assert table.exit_code == 0 and "span=tp_dp_cp" in table.output
    valid = runner.invoke(app, ["framework", "validate", "planner/data/frameworks/deepspeed.yaml"])
    assert valid.exit_code == 0 and "valid framework profile 'deepspeed'" in valid.output


def test_a_profile_with_a_missing_field_is_one_line_exit_2(tmp_path):
    data = yaml.safe_load(Path("planner/data/frameworks/planner.yaml").read_text())
    del data["capabilities"]["zero"]["stages_with_pp"]
    broken = tmp_path / "broken.yaml"
    broken.write_text(yaml.safe_dump(data))
    result = runner.invoke(app, ["framework", "validate", str(broken)])
    assert result.exit_code == 2
    assert "capabilities.zero.stages_with_pp: Field required" in result.output and "Traceback" not in result.output
    plan = runner.invoke(app, ["plan", "--framework", str(broken)])
    assert plan.exit_code == 2 and "stages_with_pp" in plan.output


def test_unknown_framework_is_one_line_exit_2():
    result = runner.invoke(app, ["plan", "--framework", "megatron"])
    assert result.exit_code == 2
    assert "framework='megatron' is unknown: did you mean megatron-lm, megatron-core?" in result.output
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(BadInputError, match="unknown"):
        api.build_request(framework="nemo-9")


@pytest.mark.parametrize("framework", SHIPPED)
def test_plans_for_each_framework_use_only_what_it_runs(framework):
    request = api.build_request(model="llama3-70b", topology="dgx-h100", nodes=4, global_batch_size=256, seq_len=4096,
                                framework=framework, search=FAST)
    plan = api.plan(request)
    profile = load_framework(framework)
    assert plan.request.framework == framework
    modes = {s.recompute.mode for s in plan.stages}
    par = plan.parallelism
    for mode in modes:
        config = Config(dp=par.dp, tp=par.tp, pp=par.pp, cp=par.cp, ep=par.ep, vpp=par.vpp, sp=par.sp,
                        zero_stage=par.zero_stage, schedule=plan.schedule, recompute=mode, tp_overlap=par.tp_overlap)
        assert refusal(profile, config, allow_stale_weights=False) is None
    assert plan.schedule != "2bw"


def test_the_default_plan_runs_under_planner_run():
    from planner.launch_spec.runnable import check_runnable

    request = api.build_request(model="llama3-70b", topology="dgx-h100", nodes=4, global_batch_size=256, seq_len=4096, search=FAST)
    plan = api.plan(request)
    assert plan.request.framework == "planner"
    check_runnable(plan)  # raises BadInputError for anything the executor refuses


def test_stale_weights_are_opt_in():
    base = dict(model="llama3-8b", topology="dgx-h100", nodes=2, global_batch_size=64, seq_len=4096, framework=EVERYTHING)
    only_2bw = SearchLimits(schedules=("1f1b", "2bw"), max_microbatch_size=1, top_k=8, time_limit_s=20)
    plain = api.plan(api.build_request(**base, search=only_2bw.model_copy(update={"fixed": {"pp": 4}})))
    assert plain.schedule != "2bw" and all(a.schedule != "2bw" for a in plain.alternatives)
    opted = api.plan(api.build_request(**base, search=only_2bw.model_copy(update={"fixed": {"pp": 4}, "allow_stale_weights": True})))
    assert "2bw" in {opted.schedule, *(a.schedule for a in opted.alternatives)}


def test_a_framework_without_the_schedule_says_so():
    request = api.build_request(model="llama3-8b", nodes=2, global_batch_size=64, seq_len=4096, framework="megatron-core",
                                search=SearchLimits(schedules=("2bw",)))
    with pytest.raises(BadInputError, match="framework 'megatron-core' runs none of them"):
        api.plan(request)
    result = runner.invoke(app, ["plan", "--framework", "deepspeed", "--schedule", "interleaved"])
    assert result.exit_code == 2 and "deepspeed" in result.output


def _estimate(framework, **par):
    request = api.build_request(model="llama3-8b", topology="dgx-h100", nodes=2, global_batch_size=64, seq_len=4096,
                                framework=framework)
    fields = dict(dp=2, tp=4, pp=2, sp=True, zero_stage=1)
    schedule = par.pop("schedule", "1f1b")
    fields.update(par)
    return api.estimate(request, Configuration(parallelism=Parallelism(**fields), schedule=schedule))


def test_estimate_refuses_with_the_frameworks_reason():
    assert _estimate("megatron-core").feasible
    assert _estimate("planner").feasible  # ZeRO-1 with TP: the executor shards DTensor optimizer states
    with pytest.raises(BadInputError, match="schedule=2bw with zero_stage=1 is not runnable by the executor"):
        _estimate("planner", schedule="2bw")
    with pytest.raises(BadInputError, match="zero_stage=3 is not run by framework 'deepspeed' with pp > 1"):
        _estimate("deepspeed", zero_stage=3)
    with pytest.raises(BadInputError, match="schedule='gpipe' is not run by framework 'megatron-core'"):
        _estimate("megatron-core", schedule="gpipe")
    with pytest.raises(BadInputError, match="zero_stage=1 is not run by framework 'torchtitan' with pp > 1"):
        _estimate("torchtitan")
    cli = runner.invoke(app, ["estimate", "--framework", "deepspeed", "--nodes", "2", "--tp", "4", "--pp", "2", "--cp", "2",
                              "--global-batch-size", "64", "--seq-len", "4096"])
    assert cli.exit_code == 2 and "no context parallelism" in cli.output


def test_uneven_interleaved_split_with_embedding_and_loss_slots():
    """NeMo runs Llama-3.1 405B (126 layers) at pp 8 x vpp 8; equal chunks cannot (126 % 64 != 0)."""
    megatron, planner = load_framework("megatron-core"), load_framework("planner")
    assert interleaved_split_reason(megatron, num_layers=126, pp=8, vpp=8, num_microbatches=64) is None
    assert interleaved_split_reason(planner, num_layers=126, pp=8, vpp=8, num_microbatches=64) is None  # layer lists
    equal = planner.capabilities.interleaved_split.model_copy(update={"layout": False, "equal_chunks": True})
    equal_only = planner.model_copy(update={"capabilities": planner.capabilities.model_copy(update={"interleaved_split": equal})})
    refused = interleaved_split_reason(equal_only, num_layers=126, pp=8, vpp=8, num_microbatches=64)
    assert refused is not None and refused[0] == "layers_not_divisible_by_pp_vpp"
    assert interleaved_split_reason(megatron, num_layers=60, pp=8, vpp=8, num_microbatches=64) is not None  # < 1 layer a chunk
    request = api.build_request(model="llama3-405b", topology="dgx-h100", nodes=64, global_batch_size=512, seq_len=8192,
                                framework="megatron-core")
    config = Configuration(parallelism=Parallelism(dp=8, tp=8, pp=8, vpp=8, sp=True, zero_stage=1), schedule="interleaved",
                           recompute="full")
    plan = api.estimate(request, config)
    layers = [sum(n.startswith("layers.") for n in s.layers) for s in plan.stages]
    assert len(layers) == 64 and sum(layers) == 126 and min(layers) >= 1


def test_moe_parallel_folding_lets_ep_span_tp_ranks():
    """Megatron-Core MoE parallel folding: the expert mesh ep x etp covers tp*dp*cp ranks, so ep 64 with dp*cp = 32
    (tp 2) is valid there, while stacks whose experts live inside dp refuse it."""
    fold = Config(dp=32, tp=2, pp=16, ep=64, is_moe=True, sp=True, zero_stage=1)
    assert refusal(load_framework("megatron-core"), fold) is None
    refused = refusal(load_framework("deepspeed"), fold)
    assert refused is not None and refused[0] in ("ep_outside_framework_span", "deepspeed_moe_with_pp")
    refused = refusal(load_framework("planner"), fold)
    assert refused is not None and refused[0] == "ep_outside_framework_span" and "dp=32" in refused[1]


def test_moe_with_tp_needs_sp_on_megatron():
    profile = load_framework("megatron-core")
    refused = refusal(profile, Config(dp=4, tp=2, pp=1, ep=2, is_moe=True, sp=False))
    assert refused is not None and refused[0] == "moe_tp_needs_sp"
    assert refusal(profile, Config(dp=4, tp=2, pp=1, ep=2, is_moe=True, sp=True)) is None


def test_runnable_is_an_alias_of_framework_planner():
    result = runner.invoke(app, ["plan", "--runnable", "--framework", "torchtitan"])
    assert result.exit_code == 2 and "--runnable means --framework planner" in result.output
    request = api.build_request(framework="torchtitan", search=SearchLimits(runnable=True))
    with pytest.raises(BadInputError, match="runnable=true with framework='torchtitan'"):
        api.plan(request)


def test_config_of_reads_candidate_fields():
    from planner.cost.model import Candidate

    cand = Candidate(dp=2, tp=4, pp=2, ep=1, cp=1, sp=True, vpp=1, zero_stage=1, tp_overlap="none", microbatch_size=2,
                     num_microbatches=4, schedule="1f1b", recompute="selective")
    config = config_of(cand, model=api.load_model("gpt-neox-20b"), precision="bf16")
    assert (config.dp, config.tp, config.pp, config.zero_stage, config.recompute, config.microbatch_size) == (2, 4, 2, 1, "selective", 2)
    assert not config.is_moe and not config.tied_embeddings


def test_tied_embeddings_across_stages_follow_the_framework():
    """torchtitan 0.3 refuses weight tying with pipeline parallelism; Megatron-Core keeps an embedding group."""
    tied = Config(dp=2, tp=1, pp=2, tied_embeddings=True)
    refused = refusal(load_framework("torchtitan"), tied)
    assert refused is not None and refused[0] == "tied_embeddings_across_stages_not_in_framework"
    assert refusal(load_framework("megatron-core"), tied) is None
    assert refusal(load_framework("torchtitan"), Config(dp=4, tp=1, pp=1, tied_embeddings=True)) is None
    spec = api.load_model("tinyllama-1.1b").model_copy(update={"tied_embeddings": True})
    plan = api.plan(api.build_request(model=spec, topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=2048,
                                      framework="torchtitan", search=FAST))
    assert plan.parallelism.pp == 1 and all(a.parallelism.pp == 1 for a in plan.alternatives)


def test_folded_expert_parallelism_is_priced_by_estimate():
    """DeepSeek-V3 at ep 64 with dp*cp = 32 and tp 2 (NeMo's layout under MoE parallel folding): valid and priced on
    megatron-core, with the expert groups spanning the tp pairs; our executor's profile refuses it."""
    from planner.topology.placement import axis_groups, expert_fold

    sizes = {"pp": 16, "dp": 32, "cp": 1, "tp": 2, "ep": 64}
    assert expert_fold(sizes) == 2
    groups = axis_groups(sizes, ("pp", "dp", "cp", "tp"), "ep")
    assert len(groups) == 16 and all(len(g) == 64 for g in groups)
    assert sorted(r for g in groups for r in g) == list(range(1024))
    request = api.build_request(model="deepseek-v3", topology="hgx-h800", nodes=128, global_batch_size=1024, seq_len=4096,
                                framework="megatron-core")
    config = Configuration(parallelism=Parallelism(dp=32, tp=2, pp=16, ep=64, sp=True, zero_stage=1), recompute="full")
    folded = api.estimate(request, config)
    assert folded.prediction.breakdown.ep_comm_s > 0
    unfolded = api.estimate(request, config.model_copy(update={"parallelism": config.parallelism.model_copy(update={"ep": 32})}))
    # the same experts per GPU either way (ep x etp covers tp*dp*cp): equal expert memory, a larger all-to-all group
    assert folded.memory.per_stage[1].params_bytes == unfolded.memory.per_stage[1].params_bytes
    with pytest.raises(BadInputError, match="ep=64 must divide dp=32"):
        api.estimate(request.model_copy(update={"framework": "planner"}), config)
    with pytest.raises(BadInputError, match="choose ep in"):
        expert_fold({"dp": 32, "cp": 1, "tp": 2, "ep": 48})


# Every capability planner/data/frameworks/planner.yaml claims, and the executor test that runs it (file: test or layout name).
EXECUTOR_EVIDENCE = {
    "schedule gpipe": ("test_executor_capabilities.py", "test_gpipe_with_partial_full_recompute_matches_single_process"),
    "schedule 1f1b": ("test_executor.py", "test_pp2_1f1b_matches_single_process_and_reports"),
    "schedule interleaved": ("test_executor.py", "test_pp2_interleaved_vpp2_with_tied_embeddings_matches_single_process"),
    "schedule zero-bubble": ("test_executor_layouts.py", "test_zero_bubble_with_selective_recompute_and_fsdp_matches_single_process"),
    "schedule 2bw": ("test_executor_2bw.py", "test_2bw_matches_the_delayed_update_and_differs_from_the_synchronous_one"),
    "schedule interleaved-zero-bubble": ("test_executor_layouts.py", "test_torch_schedule_names_place_stages_and_refuse_what_they_cannot_run"),
    "schedule zbv": ("test_executor_layouts.py", "test_v_schedules_with_tied_embeddings_match_single_process"),
    "schedule dualpipev": ("test_executor_layouts.py", "test_v_schedules_with_tied_embeddings_match_single_process"),
    "zero 0": ("test_parallelize.py", "dp2_ddp"),
    "zero 1": ("test_parallelize.py", "dp2_zero1"),
    "zero 1 with tp": ("test_executor_layouts.py", "test_zero1_with_tp2_matches_single_process_and_resumes_bit_identically"),
    "zero 2": ("test_parallelize.py", "dp2_zero2_fsdp"),
    "zero 3": ("test_parallelize.py", "dp2_zero3_fsdp"),
    "hsdp": ("test_executor_layouts.py", "test_hsdp_2x2_matches_single_process_and_shards_over_two_ranks"),
    "recompute none": ("test_executor.py", "test_pp2_1f1b_matches_single_process_and_reports"),
    "recompute selective": ("test_parallelize.py", "tp2_sp_selective_ac"),
    "recompute full": ("test_parallelize.py", "dp2_zero3_full_ac"),
    "recompute partial_full": ("test_executor_capabilities.py", "test_gpipe_with_partial_full_recompute_matches_single_process"),
    "sequence_parallel": ("test_parallelize.py", "tp2_sp"),
    "tp_overlap domino": ("test_parallelize.py", "domino_tp2"),
    "expert_parallel": ("test_parallelize.py", "ep2_zero3_fsdp"),
    "tied_embeddings_across_stages": ("test_executor_tied.py", "test_tied_embeddings_match_the_tied_single_process_reference"),
    "stale_weights": ("test_executor_2bw.py", "test_2bw_matches_the_delayed_update_and_differs_from_the_synchronous_one"),
    "precision fp32": ("test_executor.py", "test_pp2_1f1b_matches_single_process_and_reports"),
    "precision bf16": ("test_precision_recipes.py", "test_bf16_runs_track_fp32_and_hold_bf16_weights"),
    "precision fp8": ("test_precision_recipes.py", "test_fp8_trains_with_float8_linears_on_an_fp8_gpu"),
    "precision amp-bf16": ("test_executor_capabilities.py", "test_amp_bf16_dp2_tracks_the_fp32_reference_within_bf16_precision"),
}


def planner_claims() -> set[str]:
    caps = load_framework("planner").capabilities
    claims = {f"schedule {s.name}" for s in caps.schedules} | {f"zero {z}" for z in caps.zero.stages}
    claims |= {f"recompute {m}" for m in caps.recompute.modes} | {f"precision {p}" for p in caps.precisions}
    claims |= {f"tp_overlap {o}" for o in caps.tp_overlap if o != "none"}
    claims |= {name for name, on in (("hsdp", caps.zero.hsdp), ("stale_weights", caps.stale_weights),
                                     ("recompute partial_full", caps.recompute.partial_full),
                                     ("sequence_parallel", caps.sequence_parallel.supported),
                                     ("expert_parallel", caps.expert_parallel.supported),
                                     ("context_parallel", caps.context_parallel.supported),
                                     ("tied_embeddings_across_stages", caps.tied_embeddings_across_stages.supported)) if on}
    if not any(rule.key.startswith("zero1_with_tp") for rule in caps.exclusions) and 1 in caps.zero.stages:
        claims.add("zero 1 with tp")
    return claims


def test_every_planner_capability_is_exercised_by_an_executor_test():
    """The `planner` profile claims exactly what the executor's tests run: a claim without a test, or a test
    named here that does not exist, fails."""
    folder = Path(__file__).resolve().parents[1] / "integration"
    missing = sorted(planner_claims() - set(EXECUTOR_EVIDENCE))
    assert not missing, f"the planner profile claims {missing} but no executor test is named for them"
    for claim in planner_claims():
        file, name = EXECUTOR_EVIDENCE[claim]
        text = (folder / file).read_text()
        assert (f"def {name}(" in text) or (f'"{name}"' in text), f"{claim}: {file} has no test or layout {name!r}"


def test_deepspeed_moe_never_runs_with_zero3():
    """deepspeed/runtime/engine.py: "Native DeepSpeed MoE is not supported with ZeRO Stage 3": estimate refuses it,
    the search never plans it, and a plan made elsewhere is refused by the exporter."""
    from planner.export import export_plan

    request = api.build_request(model="mixtral-8x7b", topology="dgx-h100", nodes=4, global_batch_size=256, seq_len=4096,
                                framework="deepspeed", search=FAST)
    moe3 = Configuration(parallelism=Parallelism(dp=32, tp=1, pp=1, ep=8, zero_stage=3), schedule="1f1b")
    with pytest.raises(BadInputError, match="Native DeepSpeed MoE is not supported with ZeRO Stage 3"):
        api.estimate(request, moe3)
    plan = api.plan(request)
    assert plan.feasible and plan.parallelism.zero_stage in (0, 1, 2)
    assert all(a.parallelism.zero_stage != 3 for a in plan.alternatives)
    elsewhere = api.estimate(request.model_copy(update={"framework": "planner"}), moe3)
    with pytest.raises(BadInputError, match="ZeRO Stage 3"):
        export_plan(elsewhere, "deepspeed")


def test_every_model_feature_a_profile_names_has_a_predicate():
    from typing import get_args

    from planner.models.features import MODEL_FEATURES
    from planner.schemas.framework import ModelFeature

    assert set(get_args(ModelFeature)) == set(MODEL_FEATURES)


def test_a_model_the_stack_cannot_build_is_refused_at_plan_estimate_and_export():
    """Megatron-Core has no parallel residual (transformer_layer.py): GPT-NeoX is refused in one line naming it,
    before the search, by estimate, and by the exporter for a plan made for another stack."""
    from planner.export import export_plan
    from planner.models import load_model

    hf = Path(__file__).resolve().parents[1] / "data" / "hf"
    neox = load_model(str(hf / "gpt-neox-20b"))
    with pytest.raises(BadInputError, match="parallel attention/FFN residual .* framework 'megatron-core' does not build"):
        api.build_request(model=neox, nodes=4, framework="megatron-core")
    request = api.build_request(model=neox, nodes=4, global_batch_size=64, seq_len=2048, framework="planner")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=4, tp=8, pp=1, sp=True, zero_stage=1)))
    with pytest.raises(BadInputError, match="cannot export to megatron: .*parallel attention/FFN residual"):
        export_plan(plan, "megatron")
    with pytest.raises(BadInputError, match="does not build"):
        api.estimate(request.model_copy(update={"framework": "megatron-core"}),
                     Configuration(parallelism=Parallelism(dp=4, tp=8, pp=1, sp=True, zero_stage=1)))
    cli = runner.invoke(app, ["plan", "--model", str(hf / "gpt-neox-20b"), "--framework", "megatron-core"])
    assert cli.exit_code == 2 and len(cli.output.strip().splitlines()) == 1 and "parallel attention/FFN residual" in cli.output
