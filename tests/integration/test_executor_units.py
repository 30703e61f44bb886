"""Fast checks of the executor's torch-free parts: what is runnable, run options, report arithmetic,
checkpoint key renames, rank coordinates and the mesh layout (no process is started here)."""

from __future__ import annotations

import pytest
from executor_plans import TINY, TINY_MOE, make_plan

from planner.errors import BadInputError
from planner.executor.checkpoint import ShardKeys, latest_step, remove_partial
from planner.executor.report import RankResult, build_report, loss_rank
from planner.launch_spec.options import RunOptions
from planner.launch_spec.runnable import check_runnable
from planner.schemas.plan import Stage


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(pp=2, dp=2, zero_stage=1, schedule="2bw"), "schedule=2bw with zero_stage=1"),
        (dict(pp=2, vpp=2, schedule="1f1b", num_microbatches=4), "vpp=2 needs schedule interleaved"),
        (dict(pp=2, schedule="interleaved"), "interleaved needs vpp > 1"),
        (dict(dp=2, ep=2), "has no MoE layers"),
        (dict(spec=TINY_MOE, dp=2, ep=2, tp=2, tp_overlap="domino"), "domino is not runnable on an MoE model"),
        (dict(tp=2, sp=True, tp_overlap="domino"), "without sequence parallelism"),
    ],
)
def test_check_runnable_refuses_with_the_reason(kwargs, message):
    with pytest.raises(BadInputError, match=message):
        check_runnable(make_plan(**kwargs))


def test_check_runnable_refuses_bad_stage_lists_and_notes_adjustments():
    plan = make_plan(pp=2)
    swapped = (Stage(stage=0, layers=("tok_embeddings", "layers.2", "layers.3")), Stage(stage=1, layers=("layers.0", "layers.1", "norm", "output")))
    with pytest.raises(BadInputError, match="each once and in order"):
        check_runnable(plan.model_copy(update={"stages": swapped}))
    unknown = (Stage(stage=0, layers=("tok_embeddings", "layers.0", "layers.1")), Stage(stage=1, layers=("layers.2", "layers.3", "lm_head")))
    with pytest.raises(BadInputError, match="'lm_head' is not a module"):
        check_runnable(plan.model_copy(update={"stages": unknown}))
    notes = check_runnable(make_plan(dp=2, pp=2, vpp=2, zero_stage=3, schedule="zero-bubble", num_microbatches=4))
    assert any("ZeRO-3 runs as ZeRO-2" in n for n in notes)


def test_run_options_round_trip_through_the_runtime_command_line():
    opts = RunOptions(steps=7, lr=0.01, data="tok.bin", checkpoint_dir="ck", checkpoint_every=2, resume=True, timeout_s=30)
    argv = opts.to_argv()
    assert argv[:2] == ["--steps", "7"] and "--resume" in argv
    plan, parsed = RunOptions.from_argv(["plan.json", *argv])
    assert plan == "plan.json" and parsed == opts
    with pytest.raises(BadInputError, match="--checkpoint-dir"):
        RunOptions(checkpoint_every=2)
    with pytest.raises(BadInputError, match="at least 1 step"):
        RunOptions(steps=0)


def _result(rank, coords, times, losses=(), first=1, peak=100, dropped=0, routed=0):
    return RankResult(rank=rank, coords=coords, device="cpu", backend="gloo", first_step=first, losses=losses,
                      step_times_s=times, peak_memory_bytes=peak, memory_kind="rss_peak", dropped_tokens=dropped, routed_tokens=routed)


def test_build_report_takes_the_slowest_rank_per_step_and_the_median_after_warmup():
    plan = make_plan(pp=2, step_time_s=2.0)
    assert loss_rank(plan) == 1
    results = [
        _result(0, {"pp": 0, "dp": 0, "cp": 0, "tp": 0}, (9.0, 1.0, 3.0, 1.0), peak=300),
        _result(1, {"pp": 1, "dp": 0, "cp": 0, "tp": 0}, (8.0, 2.0, 1.0, 1.5), losses=(4.0, 3.9, 3.8, 3.7), peak=200),
    ]
    report = build_report(plan, results, data="synthetic", warmup_steps=1)
    assert report.step_times_s == (9.0, 2.0, 3.0, 1.5)
    assert report.step_time_s == 2.0  # median of 2.0, 3.0, 1.5
    assert report.losses == (4.0, 3.9, 3.8, 3.7) and report.steps == 4
    assert report.tokens_per_s == pytest.approx(plan.batch.global_batch_size * plan.batch.seq_len / 2.0)
    assert report.errors.step_time_rel == pytest.approx(0.0) and report.errors.peak_bytes_rel is None
    assert [m.peak_bytes for m in report.memory] == [300, 200] and report.mfu is None


def test_build_report_counts_moe_drops_once_per_tp_group():
    plan = make_plan(spec=TINY_MOE, dp=1, tp=2)
    results = [_result(r, {"pp": 0, "dp": 0, "cp": 0, "tp": r}, (1.0,), losses=(4.0,), dropped=5, routed=40) for r in range(2)]
    report = build_report(plan, results, data="synthetic", warmup_steps=0)
    assert (report.dropped_tokens, report.routed_tokens) == (5, 40)


def test_build_report_measures_routing_skew_over_every_ep_group():
    plan = make_plan(spec=TINY_MOE, dp=4, tp=2, ep=2)
    coords = [{"pp": 0, "dp": r // 2, "cp": 0, "tp": r % 2} for r in range(8)]
    # EP groups {dp 0, 1} and {dp 2, 3}: sums of the slowest rank's and the mean received tokens (routing_load)
    loads = {0: (60.0, 50.0), 1: (60.0, 50.0), 2: (130.0, 100.0), 3: (130.0, 100.0)}
    results = [_result(r, c, (1.0,), losses=(4.0,)).model_copy(update=dict(zip(
        ("routing_slowest_tokens", "routing_mean_tokens"), loads[c["dp"]]))) for r, c in enumerate(coords)]
    report = build_report(plan, results, data="synthetic", warmup_steps=0)
    assert report.routing_skew == pytest.approx((60 + 130) / (50 + 100) - 1)  # each group by its tokens
    assert report.predicted.routing_skew == 0.0  # the plan's model.moe.routing_skew
    assert build_report(plan, [r.model_copy(update={"routing_mean_tokens": 0.0}) for r in results],
                        data="synthetic", warmup_steps=0).routing_skew is None  # no EP dispatch counted


def test_shard_keys_make_per_rank_plain_tensors_distinct_and_reversible():
    keys = ShardKeys(ep_rank=1, ep=2, tp_rank=0, tp=2, manual_tp=True)
    expert = "layers.1.moe.experts.w1"
    assert keys.rename(expert) == "layers.1.moe.experts@ep1of2.w1"
    assert keys.rename("state.layers.0.attention.wq.weight.exp_avg") == "state.layers.0.attention.wq@tp0of2.weight.exp_avg"
    assert keys.rename("layers.0.attention_norm.weight") == "layers.0.attention_norm.weight"
    for key in (expert, "state.layers.0.feed_forward.w2.weight.exp_avg_sq"):
        assert keys.restore(keys.rename(key)) == key


def test_latest_step_ignores_uncommitted_folders(tmp_path):
    for name, committed in (("step-000002", True), ("step-000005", False), (".step-000007.tmp", False)):
        (tmp_path / name).mkdir()
        if committed:
            (tmp_path / name / "planner-step.json").write_text('{"step": 2}')
    assert latest_step(tmp_path) == 2
    assert remove_partial(tmp_path) == [str(tmp_path / ".step-000007.tmp")]
    assert latest_step(tmp_path / "missing") is None


def test_rank_coords_follow_the_plan_map_and_axis_order():
    pytest.importorskip("torch")
    from planner.executor.mesh import rank_coords

    plan = make_plan(dp=2, tp=2, pp=2, axis_order=("pp", "tp", "cp", "dp"))
    assert rank_coords(plan, 1) == {"pp": 0, "tp": 0, "cp": 0, "dp": 1}
    assert rank_coords(plan, 2) == {"pp": 0, "tp": 1, "cp": 0, "dp": 0}
    assert rank_coords(plan.model_copy(update={"ranks": ()}), 5) == {"pp": 1, "tp": 0, "cp": 0, "dp": 1}
