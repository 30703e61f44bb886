"""Resume under another layout (issue 24): a checkpoint written at dp=2 continues at pp=2 (DCP reshards the global
tensors into the new placement) with the losses of a run at pp=2 that never stopped (1e-5 relative, fp32); a change
that cannot reshard (ZeRO-1's per-rank optimizer files, ep, 2BW's weight versions, Domino's TP keys) is refused with
the reason before anything starts."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from executor_plans import TINY, honest, make_plan, write_plan  # noqa: E402
from test_executor import options  # noqa: E402

from planner.executor.checkpoint import layout_of  # noqa: E402
from planner.executor.reshard import refusal  # noqa: E402
from planner.executor.run import run_plan  # noqa: E402

REL = 1e-5


@pytest.mark.slow
def test_a_dp2_checkpoint_continues_at_pp2_as_a_pp2_run_that_never_stopped(tmp_path):
    before = write_plan(make_plan(TINY, dp=2, num_microbatches=1), tmp_path / "dp2.json")
    after = write_plan(make_plan(TINY, pp=2, num_microbatches=2), tmp_path / "pp2.json")
    ckpt = str(tmp_path / "ckpt")
    run_plan(before, options=options(steps=2, checkpoint_dir=ckpt, checkpoint_every=2))
    resumed = run_plan(after, options=options(steps=4, checkpoint_dir=ckpt, resume=True))
    straight = run_plan(after, options=options(steps=4))
    assert resumed.first_step == 3 and len(resumed.losses) == 2
    worst = max(abs(g - r) / abs(r) for g, r in zip(resumed.losses, straight.losses[2:]))
    assert worst <= REL, (resumed.losses, straight.losses)


def _layout(**kw) -> dict:
    return layout_of(honest(make_plan(**kw)))


@pytest.mark.parametrize("before, now, words", [
    (dict(spec=TINY, dp=2, num_microbatches=1), dict(spec=TINY, pp=2, num_microbatches=2), None),
    (dict(spec=TINY, dp=2, zero_stage=3, num_microbatches=1), dict(spec=TINY, tp=2, num_microbatches=2), None),
    (dict(spec=TINY, dp=2, zero_stage=1, num_microbatches=1), dict(spec=TINY, pp=2, num_microbatches=2), "ZeRO-1"),
    (dict(spec=TINY, pp=2, schedule="2bw", num_microbatches=2), dict(spec=TINY, pp=2, num_microbatches=2), "2BW"),
    (dict(spec=TINY, tp=2, dp=2, tp_overlap="domino", num_microbatches=1), dict(spec=TINY, tp=4, tp_overlap="domino"), "Domino"),
    (dict(spec=TINY, tp=2, tp_overlap="domino", num_microbatches=2), dict(spec=TINY, dp=2, num_microbatches=1), "tp_overlap"),
])
def test_which_layout_changes_reshard(before, now, words):
    why = refusal(_layout(**before), _layout(**now))
    assert (why is None) if words is None else (words in why), why


def test_ep_and_precision_cannot_change():
    from executor_plans import TINY_MOE

    before = _layout(spec=TINY_MOE, dp=2, ep=2, num_microbatches=1)
    assert "ep=2 -> 1 cannot change" in refusal(before, _layout(spec=TINY_MOE, dp=2, num_microbatches=1))
    assert "precision" in refusal(before | {"precision": "bf16"}, before | {"precision": "fp32"})
