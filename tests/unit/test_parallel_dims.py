"""ParallelDims (planner.schemas.dims): hostile degrees get one line naming the field, the value and the fix; the
derived sizes agree with their definitions; the records built on it (Candidate, Config, the plan's Parallelism)
read the same degrees; FixedDims checks a request's fixed degrees once."""

from __future__ import annotations

import dataclasses
import time

import pytest

from planner.errors import BadInputError
from planner.schemas import limits as L
from planner.schemas.dims import LAYOUT_AXES, Axis, FixedDims, ParallelDims

HOSTILE = [0, -1, True, False, 2.0, "2", None, 10**30, L.MAX_DEGREE + 1]


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message and message
    return message


@pytest.mark.parametrize("field", [f.name for f in dataclasses.fields(ParallelDims)])
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_hostile_degree_is_one_line_naming_field_and_value(field, value):
    dims = dataclasses.replace(ParallelDims(dp=2, tp=2, pp=2), **{field: value})
    started = time.monotonic()
    with pytest.raises(BadInputError) as exc:
        dims.check()
    message = one_line(exc)
    assert message.startswith(f"{field}={value!r} must be an integer") and f"give {field} >= 1" in message
    assert time.monotonic() - started < 1.0


def test_dp_replicate_must_divide_dp():
    with pytest.raises(BadInputError) as exc:
        ParallelDims(dp=4, tp=1, pp=1, dp_replicate=3).check()
    assert one_line(exc) == "dp_replicate=3 must divide dp=4: choose a divisor of dp, or 1"


def test_world_size_must_equal_gpus():
    dims = ParallelDims(dp=2, tp=2, pp=2)
    assert dims.check(8) is dims
    with pytest.raises(BadInputError) as exc:
        dims.check(16)
    assert one_line(exc).startswith("dp*tp*pp*cp=2*2*2*1=8 must equal gpus=16")


def test_resolve_fills_dp_and_refuses_what_does_not_divide():
    assert ParallelDims.resolve(16, tp=2, pp=2) == ParallelDims(dp=4, tp=2, pp=2)
    assert ParallelDims.resolve(16, dp=2, tp=2, pp=2, cp=2, ep=4).ep == 4
    with pytest.raises(BadInputError) as exc:
        ParallelDims.resolve(16, tp=3)
    assert one_line(exc).startswith("tp*pp*cp=3*1*1=3 does not divide gpus=16")
    with pytest.raises(BadInputError, match="must equal gpus=16"):
        ParallelDims.resolve(16, dp=2, tp=2)
    with pytest.raises(BadInputError, match=r"^pp=0 must be an integer"):
        ParallelDims.resolve(16, pp=0)


def test_expert_fold_inside_dp_cp_folded_over_tp_or_refused():
    assert ParallelDims(dp=4, tp=2, pp=1, ep=4).expert_fold == 1
    assert ParallelDims(dp=2, tp=4, pp=1, cp=2, ep=8).expert_fold == 2  # ep = dp*cp*2, 2 divides tp
    with pytest.raises(BadInputError) as exc:
        ParallelDims(dp=4, tp=2, pp=1, ep=3).expert_fold  # noqa: B018
    assert one_line(exc) == ("ep=3 must divide dp*cp=4 or, folded over tp=2, be dp*cp times a divisor of tp: "
                             "choose ep in {1, 2, 4, 8}")


def test_derived_sizes():
    d = ParallelDims(dp=8, tp=4, pp=2, ep=4, cp=2, dp_replicate=2)
    assert d.world_size == 8 * 4 * 2 * 2 == d.dp * d.model_parallel_size
    assert (d.dp_cp, d.dp_shard, d.zero_shard, d.expert_dp, d.expert_shard) == (16, 4, 8, 4, 2)
    assert d.sizes() == {"dp": 8, "tp": 4, "pp": 2, "cp": 2, "ep": 4}
    assert list(d.layout_sizes()) == list(LAYOUT_AXES) == ["pp", "dp", "cp", "tp"]
    assert [d.degree(axis) for axis in Axis] == [8, 4, 2, 2, 4] and d.degree("ep") == 4
    assert ParallelDims(**d.as_dict()) == d
    assert ParallelDims(dp=1, tp=8, pp=1, ep=2).expert_dp == 1  # ep folded over tp: one expert-data-parallel rank


def test_axis_is_the_degree_fields():
    assert {axis.value for axis in Axis} <= {f.name for f in dataclasses.fields(ParallelDims)}
    assert Axis.TP == "tp" and f"{Axis.TP}" == "tp" and {"tp": 1}[Axis.TP] == 1


def test_records_of_the_degrees_read_them_alike():
    from planner.cost.types import Candidate
    from planner.frameworks import Config
    from planner.schemas.plan import Parallelism

    degrees = dict(dp=4, tp=2, pp=2, ep=2, cp=2, dp_replicate=2)
    cand = Candidate(**degrees, microbatch_size=1, num_microbatches=4)
    par = Parallelism(**degrees, zero_stage=3)
    config = Config(**degrees)
    assert ParallelDims(**cand.as_dict()) == par.dims == ParallelDims(**config.as_dict()) == ParallelDims(**degrees)
    assert cand.world_size == par.world_size == config.world_size == 32
    assert (cand.zero_shard, cand.expert_shard, cand.expert_dp) == (4, 2, 4)


def test_plan_schema_checks_through_parallel_dims():
    from pydantic import ValidationError

    from planner.schemas.plan import Parallelism

    with pytest.raises(ValidationError, match="dp_replicate=3 must divide dp=4: choose a divisor of dp, or 1"):
        Parallelism(dp=4, tp=1, pp=1, dp_replicate=3)


def test_fixed_dims_checked_once():
    fixed = FixedDims.of({"tp": 2, "ep": 3}, gpus=8)
    assert dict(fixed) == {Axis.EP: 3, Axis.TP: 2} and fixed.get("tp") == 2 and fixed[Axis.EP] == 3
    assert fixed.allows(Axis.TP, 2) and not fixed.allows(Axis.TP, 4) and fixed.allows(Axis.PP, 8)
    assert ", ".join(f"{k}={v}" for k, v in sorted(fixed.items())) == "ep=3, tp=2"
    assert not FixedDims() and FixedDims.of(None, 8) == {}
    with pytest.raises(BadInputError) as exc:
        FixedDims.of({"xp": 2}, gpus=8)
    assert one_line(exc) == "fixed degree xp=2: unknown axis; choose among dp, tp, pp, cp, ep"
    with pytest.raises(BadInputError) as exc:
        FixedDims.of({"tp": 3}, gpus=8)
    assert one_line(exc) == "tp=3 must divide gpus=8: choose tp in {1, 2, 4, 8}"
    for value in (0, -2, True, 2.5, 10**30):
        with pytest.raises(BadInputError, match=r"^pp=.* must divide gpus=8"):
            FixedDims.of({"pp": value}, gpus=8)
