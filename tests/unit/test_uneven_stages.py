"""Uneven first and last pipeline stages (planner.frameworks_split, refine_uneven, estimate, exports): the stacks'
rules against their own code where installed (megatron-core's get_num_layers_to_build), against hand-derived values
otherwise; Llama-3.1 405B (126 layers) at pp 8 / pp 16 x vpp 8 and DeepSeek-V3 (61 layers) at pp 16 plannable,
estimable and exportable for megatron-core; refusals as one line naming the rule."""

from __future__ import annotations

import itertools
import re
import shlex

import pytest
from typer.testing import CliRunner

from planner import api
from planner.cli import app
from planner.errors import BadInputError
from planner.export import export_plan
from planner.frameworks import interleaved_split_reason, load_framework
from planner.frameworks_split import (
    SplitError,
    balanced_split,
    compact,
    interleaved_forms,
    megatron_flags,
    megatron_split,
    split_refusal,
    torchtitan_split,
)
from planner.schemas.plan import Configuration, Parallelism

MEGATRON, TITAN, DEEPSPEED = (load_framework(n) for n in ("megatron-core", "torchtitan", "deepspeed"))
LAYOUT_DSV3 = (3,) + (2,) * 29 + (0, 0)  # Megatron's DeepSeek-V3 example "Et*3|(tt|)*29,m|L" (the MTP chunk: none of ours)


def layers_of(plan) -> list[int]:
    return [sum(n.startswith("layers.") for n in s.layers) for s in sorted(plan.stages, key=lambda s: s.stage)]


# ---- the stacks' rules --------------------------------------------------------------------------------------

def test_megatron_split_by_its_rules():
    """Values derived by hand from TransformerConfig.__post_init__ and get_num_layers_to_build (core_v0.19)."""
    assert megatron_split(126, 8, 8, embedding=True, loss=True) == (1,) + (2,) * 62 + (1,)  # NeMo's 405B
    assert megatron_split(126, 16, 8, embedding=True, loss=True) == (0,) + (1,) * 126 + (0,)  # Llama 3's 405B
    assert megatron_split(61, 16, 1, first=3, last=2) == (3,) + (4,) * 14 + (2,)
    assert megatron_split(32, 4, 2, first=2, last=2) == (1, 7, 7, 1, 1, 7, 7, 1)  # rank 0 holds stages 0 and 4
    assert megatron_split(32, 2, 2, first=12, last=20) == (6, 10, 6, 10)
    for kwargs, rule in [
        (dict(), "must be divisible by pp=8"),
        (dict(first=8, last=8), "middle stage: 110 must be divisible by the middle pipeline model parallel size 6"),
        (dict(first=3, last=3), "layers at first stage: 3 must be divisible by virtual pipeline parallel degree 8"),
        (dict(first=8, embedding=True), "cannot be set with --account-for"),
        (dict(embedding=True), "must be divisible by pp=8"),
    ]:
        with pytest.raises(SplitError, match=re.escape(rule)):
            megatron_split(126, 8, 8, **kwargs)


def test_megatron_split_is_what_megatron_core_builds():
    """The installed megatron-core's own get_num_layers_to_build on every small case (skips without it)."""
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    from planner.export.judges_megatron import megatron_stage_counts

    checked = 0
    for n, pp, vpp in itertools.product(range(4, 19, 3), (2, 3, 4), (1, 2, 3)):
        forms = [dict(embedding=e, loss=lo) for e, lo in ((True, True), (True, False), (False, True), (False, False))]
        forms += [dict(first=f, last=la) for f in range(vpp, n, vpp) for la in (None, *range(vpp, n, vpp))]
        for kwargs in forms:
            try:
                ours = megatron_split(n, pp, vpp, **kwargs)
            except SplitError:
                ours = None
            fields = dict(num_layers_in_first_pipeline_stage=kwargs.get("first"), num_layers_in_last_pipeline_stage=kwargs.get("last"),
                          account_for_embedding_in_pipeline_split=kwargs.get("embedding", False),
                          account_for_loss_in_pipeline_split=kwargs.get("loss", False))
            try:
                config = TransformerConfig(num_layers=n, hidden_size=64, num_attention_heads=4, pipeline_model_parallel_size=pp,
                                           virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                                           pipeline_dtype=__import__("torch").float32, **fields)
                theirs = tuple(megatron_stage_counts(config, pp, vpp))
                theirs = theirs if sum(theirs) == n and min(theirs) >= 0 else None
            except (AssertionError, ValueError):
                theirs = None
            assert ours == theirs, (n, pp, vpp, kwargs)
            checked += theirs is not None
    assert checked > 100, checked


def test_megatron_flags_pick_the_plainest_spelling_that_builds_the_split():
    assert megatron_flags(128, 8, 2, balanced_split(128, 16)) == ["--num-virtual-stages-per-pipeline-rank", "2"]
    assert megatron_flags(126, 8, 8, balanced_split(126, 64))[:2] == ["--account-for-embedding-in-pipeline-split",
                                                                     "--account-for-loss-in-pipeline-split"]
    assert megatron_flags(126, 16, 8, balanced_split(126, 128))[:2] == ["--account-for-embedding-in-pipeline-split",
                                                                       "--account-for-loss-in-pipeline-split"]
    assert megatron_flags(61, 16, 1, megatron_split(61, 16, first=3, last=2)) == [
        "--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "2"]
    assert megatron_flags(61, 16, 2, LAYOUT_DSV3) == ["--pipeline-model-parallel-layout", "Et*3|" + "t*2|" * 29 + "|L"]


def test_torchtitan_default_split_by_its_code():
    """pipeline_parallel.py _generate_llm_fqn_per_model_part: its docstring's example (2 stages, 3 layers, weights
    2 and 2: effective 7, the extra one on stage 0) and the 405B split at one layer a stage."""
    assert torchtitan_split(3, 2, 2, 2) == (2, 1)
    assert torchtitan_split(126, 128) == (0,) + (1,) * 126 + (0,)
    assert torchtitan_split(32, 4) == (8, 9, 8, 7)  # 34 = 4 x 8 + 2: stages 0 and 1 take the extra
    with pytest.raises(SplitError, match="cannot be greater than effective layers"):
        torchtitan_split(5, 8)


def test_split_refusal_names_each_stacks_rule():
    counts = balanced_split(126, 128)
    assert split_refusal(MEGATRON, num_layers=126, pp=16, vpp=8, counts=counts) is None
    assert split_refusal(TITAN, num_layers=126, pp=16, vpp=8, counts=counts) is None
    assert split_refusal(MEGATRON, num_layers=61, pp=16, vpp=2, counts=LAYOUT_DSV3) is None  # layouts allow empty stages
    titan = split_refusal(TITAN, num_layers=61, pp=16, vpp=2, counts=LAYOUT_DSV3)
    assert "cannot run a middle stage without decoder layers" in titan and "empty_chunks='ends'" in titan
    ds = split_refusal(DEEPSPEED, num_layers=126, pp=8, vpp=1, counts=(0,) + (18,) * 7)
    assert "cannot run an end stage without decoder layers" in ds and "\n" not in ds
    wrong = split_refusal(MEGATRON, num_layers=126, pp=8, vpp=8, counts=(2,) * 64)
    assert wrong.startswith("stage_layers=2*64 must have pp*vpp=64 entries, none negative, summing to num_layers=126")
    # a stack with first/last flags and slots but no layout: only the forms Megatron's rule spells
    split = MEGATRON.capabilities.interleaved_split.model_copy(update={"layout": False})
    no_layout = MEGATRON.model_copy(update={"capabilities": MEGATRON.capabilities.model_copy(update={"interleaved_split": split})})
    assert split_refusal(no_layout, num_layers=32, pp=4, vpp=2, counts=(1, 7, 7, 1, 1, 7, 7, 1)) is None
    refused = split_refusal(no_layout, num_layers=32, pp=4, vpp=2, counts=(5, 4, 4, 4, 4, 4, 4, 3))
    assert "has no layout for interleaved chunks, only equal chunks, first 2 / last 2 layers" in refused
    assert set(interleaved_forms(no_layout, num_layers=126, pp=8, vpp=8)) == {"embedding+loss as layers"}


def test_interleaved_default_split_rule_counts_the_end_chunks():
    assert interleaved_split_reason(MEGATRON, num_layers=126, pp=16, vpp=8, num_microbatches=64) is None
    assert interleaved_split_reason(MEGATRON, num_layers=125, pp=16, vpp=8, num_microbatches=64)[0] == "layers_not_divisible_by_pp_vpp"
    assert interleaved_split_reason(DEEPSPEED, num_layers=126, pp=8, vpp=8, num_microbatches=64) is not None


def test_compact_reads_back_as_the_cli_option():
    from planner.cli.estimate import stage_layers_of

    for counts in [(1,) + (2,) * 62 + (1,), LAYOUT_DSV3, (5,), (0, 3, 3, 0)]:
        assert stage_layers_of(compact(counts), None, None, num_layers=sum(counts), pp=1, vpp=1) == counts


# ---- estimate, plan and export of the published layouts ------------------------------------------------------

def _estimate(model, nodes, gbs, seq, par, *, schedule, recompute="full", stage_layers=None, framework="megatron-core"):
    request = api.build_request(model=model, topology="dgx-h100", nodes=nodes, global_batch_size=gbs, seq_len=seq,
                                framework=framework)
    config = Configuration(parallelism=Parallelism(**par), schedule=schedule, recompute=recompute, stage_layers=stage_layers)
    return api.estimate(request, config)


def megatron_args(plan) -> list[str]:
    text = export_plan(plan, "megatron").text
    return shlex.split(text.split("PLANNER_MEGATRON_ARGS=(")[1].split("\n)")[0])


def test_llama31_405b_at_pp8_vpp8_and_pp16_vpp8_estimate_and_export():
    """NeMo's 405B recipe (tp 8, pp 8, cp 2, vpp 8) and Llama 3's own (pp 16 with end chunks holding only the
    embedding and the loss, Dubey et al. 2024 sec. 3.3.2): the embedding and loss counted as layers."""
    nemo = _estimate("llama3-405b", 128, 512, 8192, dict(dp=8, tp=8, pp=8, cp=2, vpp=8, sp=True, zero_stage=1), schedule="interleaved")
    assert layers_of(nemo) == [1] + [2] * 62 + [1] and nemo.prediction.step_time_s > 0
    meta = _estimate("llama3-405b", 1024, 2048, 8192, dict(dp=64, tp=8, pp=16, vpp=8, sp=True, zero_stage=1), schedule="interleaved")
    assert layers_of(meta) == [0] + [1] * 126 + [0]
    assert meta.stages[0].layers == ("tok_embeddings",) and meta.stages[-1].layers == ("norm", "output")
    for plan in (nemo, meta):
        args = megatron_args(plan)
        assert "--account-for-embedding-in-pipeline-split" in args and "--account-for-loss-in-pipeline-split" in args
        assert args[args.index("--num-virtual-stages-per-pipeline-rank") + 1] == "8"
    titan = _estimate("llama3-405b", 1024, 2048, 8192, dict(dp=64, tp=8, pp=16, vpp=8, sp=True, zero_stage=3),
                      schedule="interleaved", framework="torchtitan")
    words = shlex.split(export_plan(titan, "torchtitan").text.split("PLANNER_TORCHTITAN_ARGS=(")[1].split("\n)")[0])
    parts = words[words.index("--parallelism.module_fqns_per_model_part") + 1:][:128]
    assert parts[0] == "tok_embeddings" and parts[1] == "layers.0" and parts[-1] == "norm,lm_head"


def test_deepseek_v3_at_pp16_estimate_and_export():
    """61 layers at pp 16: first/last counts (vpp 1) and Megatron's layout example (vpp 2, two empty end chunks)."""
    par = dict(dp=32, tp=2, pp=16, ep=64, sp=True, zero_stage=1)
    plain = _estimate("deepseek-v3", 128, 8192, 4096, par, schedule="1f1b",
                      stage_layers=megatron_split(61, 16, first=3, last=2))
    assert layers_of(plain) == [3] + [4] * 14 + [2]
    args = megatron_args(plain)
    assert args[args.index("--decoder-first-pipeline-num-layers") + 1] == "3"
    assert args[args.index("--decoder-last-pipeline-num-layers") + 1] == "2"
    layout = _estimate("deepseek-v3", 128, 8192, 4096, dict(par, vpp=2), schedule="interleaved", stage_layers=LAYOUT_DSV3)
    assert layers_of(layout) == list(LAYOUT_DSV3)
    args = megatron_args(layout)
    assert args[args.index("--pipeline-model-parallel-layout") + 1] == "Et*3|" + "t*2|" * 29 + "|L"
    assert "--num-virtual-stages-per-pipeline-rank" not in args  # the layout's length sets vpp (validate_args)
    default = _estimate("deepseek-v3", 128, 8192, 4096, par, schedule="1f1b")  # the balanced split: a layout
    assert "--pipeline-model-parallel-layout" in megatron_args(default)


def test_uneven_stages_price_the_slowest_rank():
    """Moving layers off the first and last ranks (which carry the embedding and the head) changes the priced
    bottleneck the way the per-rank times say, not by a rule of thumb."""
    par = dict(dp=1, tp=8, pp=4, sp=True, zero_stage=1)
    even = _estimate("llama3-8b", 4, 16, 8192, par, schedule="1f1b", recompute="selective", stage_layers=(8, 8, 8, 8))
    light = _estimate("llama3-8b", 4, 16, 8192, par, schedule="1f1b", recompute="selective", stage_layers=(7, 9, 9, 7))
    rank_s = lambda plan: [s.time.forward_s + s.time.backward_s for s in plan.stages]  # noqa: E731
    assert max(rank_s(even)) == rank_s(even)[0] or max(rank_s(even)) == rank_s(even)[-1]
    assert max(rank_s(light)) < max(rank_s(even))
    assert light.prediction.step_time_s < even.prediction.step_time_s


def test_planner_plan_finds_405b_at_pp16_vpp8():
    from planner.schemas.plan import SearchLimits

    limits = SearchLimits(fixed={"tp": 8, "pp": 16, "cp": 1}, vpp=8, sp=True, top_k=1)
    request = api.build_request(model="llama3-405b", topology="dgx-h100", nodes=1024, global_batch_size=2048,
                                seq_len=8192, framework="megatron-core", search=limits)
    plan = api.plan(request)
    assert plan.parallelism.vpp == 8 and layers_of(plan)[0] == 0 and layers_of(plan)[-1] == 0


# ---- the command line --------------------------------------------------------------------------------------

def test_cli_estimate_takes_first_last_and_stage_lists_and_refuses_with_the_rule():
    runner = CliRunner()
    base = ["estimate", "--model", "llama3-8b", "--nodes", "1", "--tp", "2", "--pp", "4", "--sp", "--zero", "1",
            "--framework", "megatron-core", "--global-batch-size", "16", "--seq-len", "4096", "--json"]
    ok = runner.invoke(app, base + ["--first-stage-layers", "7", "--last-stage-layers", "7"])
    assert ok.exit_code in (0, 1), ok.output
    assert '"layers.6"' in ok.output and '"layers.7"' in ok.output
    listed = runner.invoke(app, base + ["--stage-layers", "7,9*2,7"])
    assert listed.exit_code in (0, 1) and listed.output == ok.output
    for extra, rule in [
        (["--first-stage-layers", "7", "--last-stage-layers", "6"], "middle stage: 19 must be divisible by the middle"),
        (["--stage-layers", "8,8,8"], "must have pp*vpp=4 entries"),
        (["--stage-layers", "8,x,8,8"], "give decoder layers per virtual stage as integers"),
        (["--stage-layers", "0,16*2,0", "--framework", "deepspeed"], "cannot run an end stage without decoder layers"),
        (["--stage-layers", "7,9*2,7", "--first-stage-layers", "7"], "give one or the other"),
    ]:
        bad = runner.invoke(app, [*base, *extra])
        assert bad.exit_code == 2, bad.output
        assert rule in bad.output and "Traceback" not in bad.output and len(bad.output.strip().splitlines()) == 1


def test_estimate_api_refuses_a_split_the_stack_cannot_spell():
    with pytest.raises(BadInputError, match="cannot run a middle stage without decoder layers"):
        _estimate("deepseek-v3", 128, 8192, 4096, dict(dp=32, tp=2, pp=16, ep=64, vpp=2, sp=True, zero_stage=2),
                  schedule="interleaved", stage_layers=LAYOUT_DSV3, framework="torchtitan")


def test_deepspeed_type_partition_by_its_code_and_in_the_export():
    """deepspeed/runtime/utils.py partition_balanced on binary weights (decoder layers 1, the embedding ahead and
    norm + head behind 0), re-implemented: values checked against DeepSpeed v0.19.5's own function on n 1..39 x
    pp 2..8 when written; here the cases the exporter meets, and DeepSpeed's function itself where installed."""
    from planner.frameworks_split import deepspeed_type_split

    assert deepspeed_type_split(70, 12) == (6,) * 10 + (5, 5)  # BLOOM's 70 layers over pp 12
    assert deepspeed_type_split(61, 16) == (4,) * 13 + (3, 3, 3)
    assert deepspeed_type_split(3, 8) == (0, 1, 1, 1, 0, 0, 0, 0)  # fewer specs than stages: partition_uniform
    try:
        from deepspeed.runtime.utils import partition_balanced
    except ImportError:
        partition_balanced = None
    if partition_balanced is not None:
        for n, pp in itertools.product(range(1, 30), range(2, 7)):
            w = [0] + [1] * n + [0, 0]
            parts = partition_balanced(w, pp)
            assert deepspeed_type_split(n, pp) == tuple(sum(w[parts[s]:parts[s + 1]]) for s in range(pp))
    from test_export import make_plan

    exact = make_plan(dp=2, tp=4, pp=2, zero=1, counts=[16, 16])
    export = export_plan(exact, "deepspeed")
    assert "partition_method='type:transformer'" in " ".join(export.usage)
    assert not any("cannot be given in the config" in w for w in export.warnings)
    other = export_plan(make_plan(dp=2, tp=4, pp=2, zero=1, counts=[14, 18]), "deepspeed")
    assert "partition_method='parameters'" in " ".join(other.usage)
    assert any("'type:transformer' builds [16, 16]" in w for w in other.warnings)


def test_service_estimate_takes_stage_layers_and_refuses_with_the_rule():
    """POST /v1/estimate's worker (planner.service.worker.solve): the body's stage_layers reach the estimate."""
    import json

    from planner.service.worker import solve

    body = dict(model="llama3-8b", topology="dgx-h100", gpus=8, global_batch_size=16, seq_len=4096, tp=2, pp=4, sp=True,
                zero_stage=1, framework="megatron-core", stage_layers=[7, 9, 9, 7])
    from planner.schemas.plan import LaunchPlan

    status, text = solve("estimate", json.dumps(body), 1024)
    assert status == 200, text
    assert layers_of(LaunchPlan.model_validate_json(text)) == [7, 9, 9, 7]
    status, text = solve("estimate", json.dumps(body | {"stage_layers": [0, 16, 16, 0], "framework": "deepspeed"}), 1024)
    assert status == 422 and "cannot run an end stage without decoder layers" in json.loads(text)["detail"]
