"""The foundation: strict schemas, canonical JSON, atomic writes, readable errors, no torch in the core."""

import json
import subprocess
import sys

import pytest

from planner.errors import BadInputError
from planner.io import atomic_write_text, canonical_json, load_file, load_structured, validate
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import Parallelism

TINY = dict(name="tiny", num_layers=2, hidden_size=64, ffn_hidden_size=256, num_attention_heads=4, vocab_size=1000, seq_len=128)


def test_model_spec_rejects_unknown_field():
    with pytest.raises(BadInputError, match="hiden_size"):
        validate(ModelSpec, {**TINY, "hiden_size": 3}, source="spec.yaml")


def test_model_spec_missing_field_is_named():
    data = dict(TINY)
    del data["vocab_size"]
    with pytest.raises(BadInputError, match="spec.yaml: vocab_size: Field required"):
        validate(ModelSpec, data, source="spec.yaml")


def test_kv_heads_must_divide_heads():
    with pytest.raises(BadInputError, match="num_kv_heads=3 must divide num_attention_heads=4"):
        validate(ModelSpec, {**TINY, "num_kv_heads": 3}, source="spec")


def test_moe_top_k_checked():
    with pytest.raises(ValueError, match="top_k=3 exceeds"):
        MoESpec(num_experts=2, top_k=3, expert_ffn_hidden_size=8)


def test_moe_layer_pattern():
    spec = ModelSpec(**TINY | {"num_layers": 6}, moe=MoESpec(num_experts=4, top_k=2, expert_ffn_hidden_size=32, first_k_dense=1, moe_every=2))
    assert [spec.is_moe_layer(i) for i in range(6)] == [False, True, False, True, False, True]
    assert spec.num_moe_layers == 3


def test_parallelism_axis_order_must_be_permutation():
    with pytest.raises(ValueError, match="permutation"):
        Parallelism(dp=1, tp=1, pp=1, axis_order=("pp", "dp", "tp", "tp"))
    assert Parallelism(dp=2, tp=4, pp=2, cp=2).world_size == 32


def test_canonical_json_is_deterministic_and_rounded():
    a = canonical_json({"b": 1.0 / 3.0, "a": [0.1 + 0.2, float("nan")]})
    b = canonical_json({"a": [0.30000000000000004, float("nan")], "b": 0.3333333333333333})
    assert a == b
    assert json.loads(a) == {"a": [0.3, None], "b": 0.3333333333}


def test_atomic_write_replaces_whole_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "out" / "plan.json"
    atomic_write_text(target, "first")
    atomic_write_text(target, "second")
    assert target.read_text() == "second"
    assert [p.name for p in target.parent.iterdir()] == ["plan.json"]


def test_malformed_yaml_and_json_name_file_and_line(tmp_path):
    bad_yaml = tmp_path / "m.yaml"
    bad_yaml.write_text("name: x\nnum_layers: [1, 2\n")
    with pytest.raises(BadInputError, match=r"m.yaml: malformed YAML at line \d+"):
        load_structured(bad_yaml)
    bad_json = tmp_path / "m.json"
    bad_json.write_text('{"name": "x",}')
    with pytest.raises(BadInputError, match="m.json: malformed JSON at line 1"):
        load_structured(bad_json)
    with pytest.raises(BadInputError, match="file not found"):
        load_file(ModelSpec, tmp_path / "missing.yaml")


def test_core_imports_without_torch():
    code = "import sys, planner, planner.api, planner.cli, planner.schemas; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True)
