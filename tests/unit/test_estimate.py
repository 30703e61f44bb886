"""planner.api.estimate: Configuration -> LaunchPlan (stages, ranks, groups, prediction, memory, errors)."""

import pytest

from planner import api
from planner.errors import BadInputError, InfeasibleError
from planner.io import canonical_json
from planner.schemas.plan import Configuration, LaunchPlan, Parallelism


def _request(**kw):
    base = dict(model="llama3-8b", topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096, framework="megatron-core")
    base.update(kw)
    return api.build_request(**base)


def _config(**kw):
    par = dict(dp=2, tp=4, pp=2, sp=True, zero_stage=1)
    par.update(kw.pop("par", {}))
    return Configuration(parallelism=Parallelism(**par), **kw)


def test_plan_stages_ranks_and_groups():
    plan = api.estimate(_request(), _config(recompute="selective"))
    assert plan.kind == "estimate" and plan.feasible and plan.memory.fits
    assert plan.stages[0].layers[0] == "tok_embeddings" and plan.stages[-1].layers[-2:] == ("norm", "output")
    decoder = [name for stage in plan.stages for name in stage.layers if name.startswith("layers.")]
    assert decoder == [f"layers.{i}" for i in range(32)]
    assert len(plan.ranks) == 16 and plan.ranks[5].coords == {"pp": 0, "dp": 1, "cp": 0, "tp": 1}
    assert {g.axis for g in plan.process_groups} == {"tp", "dp", "pp"}
    assert plan.batch.num_microbatches == 32 and plan.prediction.tokens_per_s > 0
    assert any("analytic" in note for note in plan.notes)


def test_plan_is_deterministic_json():
    one = canonical_json(api.estimate(_request(), _config()))
    two = canonical_json(api.estimate(_request(), _config()))
    assert one == two
    assert LaunchPlan.model_validate_json(one).prediction.step_time_s > 0


def test_uneven_stage_layers_and_interleaved():
    plan = api.estimate(_request(), _config(stage_layers=(12, 20)))
    assert [sum(n.startswith("layers.") for n in s.layers) for s in plan.stages] == [12, 20]
    inter = api.estimate(_request(), _config(schedule="interleaved", par=dict(vpp=2)))
    assert len(inter.stages) == 4 and inter.prediction.breakdown.bubble_s > 0


def test_does_not_fit_is_a_plan_with_reasons():
    plan = api.estimate(_request(gpus=8, global_batch_size=8, seq_len=8192), _config(microbatch_size=8, par=dict(dp=1, tp=8, pp=1, sp=False)))
    assert not plan.feasible and plan.infeasible_reasons and "activations" in plan.infeasible_reasons[0]


def test_batch_that_does_not_divide_is_bad_input():
    with pytest.raises(BadInputError, match="global_batch_size=63 is not divisible by dp\\*microbatch_size"):
        api.estimate(_request(global_batch_size=63), _config())


def test_heads_that_do_not_divide_are_bad_input():
    with pytest.raises(BadInputError, match="tp=3 must divide num_attention_heads=32"):
        api.estimate(_request(gpus=6, global_batch_size=64), _config(par=dict(dp=1, tp=3, pp=2, sp=False)))


def test_more_gpus_than_the_topology_is_bad_input():
    with pytest.raises(BadInputError):
        api.build_request(model="llama3-8b", topology="dgx-h100", nodes=1, gpus=16)
