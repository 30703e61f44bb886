"""The 2025-26 model types beyond their parameter counts (test_models_hf*.py): the attention work of sliding-window
and chunked layers, what the executor refuses, and the published samples planned end to end."""

from pathlib import Path

import pytest

from planner import api
from planner.errors import BadInputError
from planner.models import load_model
from planner.models.support import reference_refusal
from planner.schemas.plan import Configuration, Parallelism

HF_DIR = Path(__file__).resolve().parents[1] / "data" / "hf"


def causal_keys(seq_len: int, kind: str, size: int) -> float:
    """Brute force: mean keys a causal query attends to, times 2 (the non-causal convention attended_keys uses)."""
    total = 0
    for i in range(seq_len):
        if kind == "sliding":
            total += min(i + 1, size)
        else:  # chunked: the keys of its own chunk up to itself
            total += i % size + 1
    return 2 * total / seq_len


@pytest.mark.parametrize(("kind", "size", "seq_len"), [("sliding", 128, 4096), ("sliding", 4096, 8192), ("sliding", 512, 512),
                                                       ("chunked", 8192, 32768), ("chunked", 1024, 4096)])
def test_attended_keys_match_a_brute_force_count_of_the_mask(kind, size, seq_len):
    spec = load_model(str(HF_DIR / ("gpt-oss-20b" if kind == "sliding" else "llama-4-scout")))
    spec = spec.model_copy(update={"sliding_window": size} if kind == "sliding" else {"attention_chunk": size})
    layer = spec.layer_types.index(kind)
    # the closed forms drop the +1 of the diagonal (w(w+1)/2): within 2/size of the mask's count
    assert spec.attended_keys(layer, seq_len) == pytest.approx(causal_keys(seq_len, kind, size), rel=2 / size + 1e-9)
    assert spec.attended_keys(spec.layer_types.index("full"), seq_len) == seq_len


def test_gpt_oss_layer_kinds_and_attention_share():
    spec = load_model(str(HF_DIR / "gpt-oss-20b"))
    assert spec.layer_types[:2] == ("sliding", "full") and spec.sliding_window == 128 and spec.attention_sinks
    # half the layers full, half a 128-token window: at 8192 tokens about 51.5% of full causal attention
    assert spec.attention_fraction(8192) == pytest.approx((1 + (256 - 128 * 128 / 8192) / 8192) / 2)


def _attention_core_s(spec, seq_len=32768):
    request = api.build_request(model=spec, topology="dgx-h100", gpus=8, global_batch_size=8, seq_len=seq_len,
                                framework="megatron-core")
    config = Configuration(parallelism=Parallelism(dp=1, tp=8, pp=1, sp=True, ep=1), schedule="1f1b")
    return api.estimate(request, config)


def test_windowed_attention_costs_less_time_than_full_attention():
    """Ablation of the window term: the same model with every layer full is slower at a long sequence."""
    spec = load_model(str(HF_DIR / "ministral-8b")).model_copy(update={"sliding_window": 4096})
    full = spec.model_copy(update={"layer_types": None, "sliding_window": None})
    windowed_plan, full_plan = _attention_core_s(spec), _attention_core_s(full)
    assert windowed_plan.feasible and full_plan.feasible
    assert windowed_plan.prediction.step_time_s < 0.9 * full_plan.prediction.step_time_s


def test_the_executor_refuses_windowed_layers_and_builds_the_rest():
    assert "layer_types with ['sliding'] attention layers" in reference_refusal(load_model(str(HF_DIR / "gpt-oss-20b")))
    assert "['chunked']" in reference_refusal(load_model(str(HF_DIR / "llama-4-scout")))
    assert "qk_norm_scope='projection' (OLMo2)" in reference_refusal(load_model(str(HF_DIR / "olmoe-1b-7b")))
    for folder in ("deepseek-v2-lite", "dbrx", "phi-3.5-moe", "glm-4.5-air", "smollm3-3b", "hunyuan-a13b", "ernie-4.5-21b-a3b"):
        assert reference_refusal(load_model(str(HF_DIR / folder))) is None, folder


def test_planner_run_refuses_a_windowed_model_in_one_line():
    """Planned for our executor: refused before the search (profile unsupported_models); a plan made for another stack
    is refused by `planner run`'s pre-launch check."""
    from planner.launch_spec.runnable import check_runnable

    spec = load_model(str(HF_DIR / "ministral-8b"))
    with pytest.raises(BadInputError, match="sliding-window attention layers, which framework 'planner' does not build"):
        api.build_request(model=spec, gpus=8, framework="planner")
    plan = _attention_core_s(spec, seq_len=4096)
    with pytest.raises(BadInputError, match="not built by the executor's reference decoder"):
        check_runnable(plan)


@pytest.mark.parametrize(("patch", "message"), [
    ({"layer_types": ["linear_attention"] * 24}, "layer_types=\\['linear_attention'\\] .* layer kinds \\['linear_attention'\\] are not modelled"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types=3 .* 3 entries for 24 layers"),
    ({"sliding_window": None}, "missing field 'sliding_window'"),
])
def test_a_layer_layout_the_planner_cannot_express_is_one_line(patch, message):
    import json

    from planner.models.hf import spec_from_hf_config

    config = {**json.loads((HF_DIR / "gpt-oss-20b" / "config.json").read_text()), **patch}
    with pytest.raises(BadInputError, match=message) as caught:
        spec_from_hf_config(config)
    assert "\n" not in str(caught.value)


def test_multimodal_wrappers_are_planned_as_their_language_model():
    spec = load_model(str(HF_DIR / "llama-4-scout"))
    assert "language model of llama4" in spec.source and spec.layer_types.count("chunked") == 36
    assert spec.nope_layers == tuple(range(3, 48, 4)) and spec.moe.score_function == "sigmoid"
