"""Capabilities of the `planner` profile that no other executor test runs: GPipe, and a partial full recompute
(stages[].recompute.full_layers) — each trained through `planner run` and compared with a single process."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor_plans import honest, make_plan  # noqa: E402
from test_executor import assert_close, options, reference_losses  # noqa: E402

from planner.executor.run import run_plan  # noqa: E402
from planner.schemas.plan import Recompute  # noqa: E402


@pytest.mark.slow
def test_gpipe_with_partial_full_recompute_matches_single_process(tmp_path):
    plan = make_plan(pp=2, schedule="gpipe", num_microbatches=2)
    first = plan.stages[0]
    decoder = sum(name.startswith("layers.") for name in first.layers)
    stages = (first.model_copy(update={"recompute": Recompute(mode="none", full_layers=min(1, decoder))}), *plan.stages[1:])
    plan = honest(plan.model_copy(update={"stages": stages}))
    assert plan.stages[0].recompute.full_layers == 1
    report = run_plan(plan, options=options(steps=3), report_path=tmp_path / "run.json")
    assert_close(report.losses, reference_losses(plan, 3), "gpipe pp2 + 1 fully recomputed layer")


# bf16 keeps 8 significand bits: unit roundoff 2**-8. The loss (an fp32 reduction of bf16 matmul outputs) drifts
# from the fp32 run's by about one unit; 2 units (0.78%) bound it, while the loss moves by more than twice that.
BF16_REL_TOL = 2 * 2.0**-8


@pytest.mark.slow
def test_amp_bf16_dp2_tracks_the_fp32_reference_within_bf16_precision(tmp_path):
    plan = make_plan(dp=2, zero_stage=2, num_microbatches=1)
    plan = honest(plan.model_copy(update={"request": plan.request.model_copy(update={"precision": "amp-bf16"})}))
    report = run_plan(plan, options=options(steps=4), report_path=tmp_path / "run.json")
    reference = reference_losses(plan, 4)
    worst = max(abs(g - r) / abs(r) for g, r in zip(report.losses, reference))
    movement = max(abs(r - reference[0]) for r in reference) / abs(reference[0])
    print(f"amp-bf16 vs fp32: largest relative difference {worst:.2e}, loss movement {movement:.2e}")
    assert worst <= BF16_REL_TOL and movement > 2 * BF16_REL_TOL
