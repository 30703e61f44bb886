"""The executor trains what a LaunchPlan says: each layout's per-step losses equal a single process's.

Every test launches real torchrun jobs (gloo, CPU, fp32) through `planner.executor.run.run_plan`, the
function behind `planner run`, and compares with the same seeded model trained in this process on the same
global batches. Start-up dominates on this box (~2 s per process), so each launch checks several things.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from executor_plans import TINY, TINY_GPT, honest, make_plan, write_plan  # noqa: E402

from planner.executor.run import RunFailedError, run_plan  # noqa: E402
from planner.launch_spec.options import RunOptions  # noqa: E402

LR, SEED, REL_TOL = 1e-2, 0, 1e-4


def reference_losses(plan, steps: int) -> list[float]:
    """Single process, no process group: the full model on the whole global batch of each step."""
    from planner.executor.data import Batches, BatchSource
    from planner.executor.parallelize import build_optimizer
    from planner.executor.train import train_steps
    from planner.nn import Transformer

    spec, batch = plan.request.model, plan.batch
    model = Transformer(spec, max_seq_len=batch.seq_len)
    model.init_weights(SEED)
    opt = build_optimizer(model, zero_stage=0, lr=LR)
    source = BatchSource(vocab_size=spec.vocab_size, global_batch_size=batch.global_batch_size, seq_len=batch.seq_len, seed=SEED)
    batches = Batches(source)
    return [train_steps(model, opt, [batches.global_batch(step)])[0] for step in range(1, steps + 1)]


def assert_close(got, ref, name):
    assert len(got) == len(ref), f"{name}: {len(got)} losses, expected {len(ref)}"
    bad = [f"step {i + 1}: got {g:.8f}, single process {r:.8f}" for i, (g, r) in enumerate(zip(got, ref)) if abs(g - r) > REL_TOL * abs(r)]
    assert not bad, f"{name}: " + "; ".join(bad)


def options(**kw) -> RunOptions:
    return RunOptions(lr=LR, seed=SEED, timeout_s=60, **kw)


@pytest.fixture(scope="module")
def pp2_1f1b(tmp_path_factory):
    """PP2 with 1F1B, 4 steps, uninterrupted, through the real `planner run` command: shared by the
    equality and the resume tests."""
    from typer.testing import CliRunner

    from planner.cli import app
    from planner.executor.report import RunReport

    folder = tmp_path_factory.mktemp("pp2")
    plan = honest(make_plan(pp=2, schedule="1f1b", num_microbatches=2))  # as write_plan writes it: its predictions
    path = write_plan(plan, folder / "plan.json")
    args = ["run", str(path), "--steps", "4", "--lr", str(LR), "--seed", str(SEED), "--timeout-s", "60", "--report", str(folder / "run.json")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "step time (s)" in result.output and "predicted" in result.output
    return plan, path, RunReport.model_validate_json((folder / "run.json").read_text())


def test_pp2_1f1b_matches_single_process_and_reports(pp2_1f1b):
    plan, _, report = pp2_1f1b
    ref = reference_losses(plan, 4)
    assert_close(report.losses, ref, "pp2 1f1b")
    assert ref[0] != ref[-1]  # training moves the loss: the comparison is not vacuous
    assert report.world_size == 2 and len(report.memory) == 2 and all(m.peak_bytes > 0 for m in report.memory)
    assert len(report.step_times_s) == 4 and report.step_time_s > 0
    assert report.tokens_per_s == pytest.approx(plan.batch.global_batch_size * plan.batch.seq_len / report.step_time_s)
    assert report.errors.step_time_rel == pytest.approx((plan.prediction.step_time_s - report.step_time_s) / report.step_time_s)


def test_pp2_interleaved_vpp2_with_tied_embeddings_matches_single_process(tmp_path):
    """Interleaved 1F1B (4 virtual stages on 2 ranks) on a GPT-style model whose LM head is tied to the
    embedding: the two copies live on different ranks and their gradients are summed (embedding group)."""
    plan = make_plan(TINY_GPT, pp=2, vpp=2, schedule="interleaved", num_microbatches=4)
    report = run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=3))
    assert_close(report.losses, reference_losses(plan, 3), "pp2 interleaved vpp2, tied embeddings")


def test_uneven_stages_match_single_process(tmp_path):
    """Uneven pipeline stages as the stacks run them: pp 3 with a heavier first stage (1F1B), and interleaved pp 2 x
    vpp 2 whose end chunks hold no decoder layer, only the embedding and only norm + head + loss (Llama 3's 405B
    split; Megatron's --account-for-embedding/loss-in-pipeline-split at one layer a chunk)."""
    three = make_plan(pp=3, schedule="1f1b", num_microbatches=3, stage_layers=[2, 1, 1])
    report = run_plan(write_plan(three, tmp_path / "pp3.json"), options=options(steps=3))
    assert_close(report.losses, reference_losses(three, 3), "pp3 1f1b [2, 1, 1]")
    ends = make_plan(pp=2, vpp=2, schedule="interleaved", num_microbatches=4, stage_layers=[0, 2, 2, 0])
    assert ends.stages[0].layers == ("tok_embeddings",) and ends.stages[-1].layers == ("norm", "output")
    report = run_plan(write_plan(ends, tmp_path / "ends.json"), options=options(steps=3))
    assert_close(report.losses, reference_losses(ends, 3), "pp2 x vpp2 [0, 2, 2, 0]")


def test_dp2_tp2_pp2_on_eight_processes_matches_single_process(tmp_path):
    """The 3-D layout in one 8-process job: FSDP2 ZeRO-3 x TP2 with sequence parallelism x PP2 (1F1B),
    full activation checkpointing, axis order pp-dp-tp (tp innermost)."""
    plan = make_plan(dp=2, tp=2, pp=2, sp=True, zero_stage=3, recompute="full", num_microbatches=2)
    report = run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=3))
    assert_close(report.losses, reference_losses(plan, 3), "dp2 x tp2 x pp2")
    assert report.world_size == 8



@pytest.mark.parametrize("spec,sp", [(TINY, False), (TINY_GPT, True)], ids=["llama-tp2", "gpt-tied-tp2-sp"])
def test_tp2_without_pp_uses_the_vocab_parallel_loss_and_matches_single_process(spec, sp, tmp_path):
    """TP without PP: vocab-sharded logits and the loss under loss_parallel (no T x V all-gather), with
    gradient accumulation over 2 micro-batches; a tied GPT head shares the vocab-sharded embedding."""
    plan = make_plan(spec, tp=2, sp=sp, num_microbatches=2)
    report = run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=3))
    assert_close(report.losses, reference_losses(plan, 3), f"tp2 sp={sp}")

def test_failure_leaves_no_report_and_no_partial_checkpoint_then_resume_matches(pp2_1f1b, tmp_path):
    """A rank raising while checkpoint step 3 is being written: one error naming the rank and the cause,
    no report, steps 1-2 committed and nothing of step 3. Resuming from step 2 gives the uninterrupted
    run's losses for steps 3-4."""
    _, path, uninterrupted = pp2_1f1b
    ckpt, report_path = tmp_path / "ckpt", tmp_path / "run.json"
    env = {"PLANNER_FAIL_RANK": "1", "PLANNER_FAIL_STEP": "3", "PLANNER_FAIL_WHERE": "checkpoint"}
    with pytest.raises(RunFailedError, match=r"rank 1 failed: RuntimeError: injected failure \(PLANNER_FAIL_RANK=1\) at step 3"):
        run_plan(path, options=options(steps=4, checkpoint_dir=str(ckpt), checkpoint_every=1), report_path=report_path, env=env)
    assert not report_path.exists()
    assert sorted(p.name for p in ckpt.iterdir()) == ["step-000001", "step-000002"]
    resumed = run_plan(path, options=options(steps=4, checkpoint_dir=str(ckpt), resume=True), report_path=report_path)
    assert resumed.first_step == 3 and resumed.steps == 4
    assert_close(resumed.losses, uninterrupted.losses[2:], "resumed from step 2")
    assert report_path.is_file()


def test_world_size_mismatch_is_refused_by_every_rank(tmp_path):
    plan = make_plan(pp=2, num_microbatches=2)
    with pytest.raises(RunFailedError, match=r"rank 0 failed: BadInputError: the plan needs 2 processes .* torchrun started 1"):
        run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=1), nproc=1, report_path=tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()


def test_unrunnable_schedule_is_refused_before_launch(tmp_path):
    from planner.errors import BadInputError

    plan = make_plan(pp=2, dp=2, zero_stage=3, schedule="2bw", num_microbatches=2)
    with pytest.raises(BadInputError, match="schedule=2bw with zero_stage=3"):
        run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=1))


def test_token_file_data(tmp_path: Path):
    """--data: a flat uint16 .bin file; windows are taken in order and checked against the vocabulary."""
    import numpy as np

    from planner.errors import BadInputError
    from planner.executor.data import Batches, BatchSource

    tokens = (np.arange(1000) % TINY.vocab_size).astype(np.uint16)
    path = tmp_path / "tokens.bin"
    tokens.tofile(path)
    batches = Batches(BatchSource(vocab_size=TINY.vocab_size, global_batch_size=2, seq_len=16, path=str(path)))
    inputs, targets = batches.global_batch(2)
    assert inputs[0].tolist() == (np.arange(32, 48) % 64).tolist()
    assert targets[0].tolist() == (np.arange(33, 49) % 64).tolist()
    small = Batches(BatchSource(vocab_size=10, global_batch_size=2, seq_len=16, path=str(path)))
    with pytest.raises(BadInputError, match="outside the model's vocabulary"):
        small.global_batch(1)
