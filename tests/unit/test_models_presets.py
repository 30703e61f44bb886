"""Presets: every one loads, counts within 1% of its published size, and agrees with the validation data; the
precomputed `planner models list` rows (presets/index.json) are fresh, and a stale index is not used."""

import json
from pathlib import Path

import pytest

from planner.errors import BadInputError
from planner.io import load_file
from planner.models import PRESET_DIR, list_presets, load_model, load_preset
from planner.models.counting import active_params, total_params
from planner.models.preset_index import INDEX_PATH, computed_rows, fingerprint, index_text, preset_rows
from planner.models.summary import model_row
from planner.schemas.model import ModelSpec

# Published total parameter counts, with where each comes from.
PUBLISHED_TOTAL = {
    "gpt3-175b": 175e9,  # Brown et al. 2020 Table 2.1 "175.0B" (174.6B by the Megatron-LM formula)
    "llama3-8b": 8.03e9,  # HF meta-llama/Meta-Llama-3-8B model card / Llama 3 paper Table 3: 8.03B
    "llama3-70b": 70.6e9,  # HF meta-llama/Meta-Llama-3-70B: 70.6B
    "llama3-405b": 405.9e9,  # Llama 3 paper (arXiv:2407.21783) / HF Llama-3.1-405B: 405.9B
    "mixtral-8x7b": 46.7e9,  # HF mistralai/Mixtral-8x7B-v0.1: 46.7B (Jiang et al. 2024: "47B")
    "mixtral-8x22b": 140.6e9,  # HF mistralai/Mixtral-8x22B-v0.1: 140.6B ("141B")
    "deepseek-v3": 671e9,  # DeepSeek-V3 report (arXiv:2412.19437) abstract: 671B total (main model, without MTP)
    "gpt-neox-20b": 20.55e9,  # Black et al. 2022 Table 1 / HF EleutherAI/gpt-neox-20b: 20.55B
    "bloom-176b": 176.247e9,  # published_runs.json bloom176b_production params_b 176.247 (BigScience tr11 README)
    "glm-130b": 130e9,  # Zeng et al. 2023 (arXiv:2210.02414): "130B" (rounded; see GLM_TOLERANCE)
    "opt-175b": 175e9,  # Zhang et al. 2022 (arXiv:2205.01068) Table 1: 175B
    "mt-nlg-530b": 530e9,  # Smith et al. 2022 (arXiv:2201.11990): 530B
    "tinyllama-1.1b": 1_100_048_384,  # h100_hf_tinyllama.jsonl "params": 1100048384 (HF LlamaForCausalLM numel)
    "qwen3-30b-a3b": 30.5e9,  # HF Qwen/Qwen3-30B-A3B model card: "30.5B in total and 3.3B activated"
    "qwen3-235b-a22b": 235e9,  # HF Qwen/Qwen3-235B-A22B model card: "235B in total and 22B activated"
    "gpt-oss-120b": 116.83e9,  # OpenAI gpt-oss model card Table 1: 116.83B total, 5.13B active
}
# Published active (per-token) parameter counts of the MoE presets.
PUBLISHED_ACTIVE = {
    "mixtral-8x7b": 12.9e9,  # HF Mixtral model card / Jiang et al. 2024: 12.9B ("13B") active
    "mixtral-8x22b": 39e9,  # Mistral AI Mixtral 8x22B announcement: 39B active of 141B
    "deepseek-v3": 37e9,  # DeepSeek-V3 report abstract: 37B activated per token (two significant digits)
    "qwen3-30b-a3b": 3.3e9,  # HF model card: 3.3B activated (two significant digits)
    "qwen3-235b-a22b": 22e9,  # HF model card: 22B activated (two significant digits)
}
# gpt-oss counts its active parameters without the input embedding (116.83B total, 5.13B active: the embedding's
# 201088 x 2880 = 0.58B is the difference between our per-token count, 5.71B, and theirs).
PUBLISHED_ACTIVE_WITHOUT_EMBEDDING = {"gpt-oss-120b": 5.13e9}
TOLERANCE = 0.01
# GLM-130B: "130B" is a rounded figure; the architecture (70 x 12288, GeGLU 32768, vocab 150528, tied output as
# in SwissArmyTransformer) counts 128.70B, 1.002% below it. DeepSeek-V3's "37B" active has two significant digits
# (rounding alone allows +-1.35%); we count 37.55B including the embedding and output head.
TOLERANCE_OVERRIDE = {("glm-130b", "total"): 0.011, ("deepseek-v3", "active"): 0.02, ("qwen3-30b-a3b", "active"): 0.02}


def test_every_required_preset_is_shipped():
    assert set(list_presets()) == set(PUBLISHED_TOTAL)


@pytest.mark.parametrize("name", sorted(PUBLISHED_TOTAL))
def test_total_params_match_published(name):
    spec = load_preset(name)
    published = PUBLISHED_TOTAL[name]
    tolerance = TOLERANCE_OVERRIDE.get((name, "total"), TOLERANCE)
    counted = total_params(spec)
    assert abs(counted - published) / published <= tolerance, f"{name}: counted {counted:,} vs published {published:,.0f}"
    assert spec.source and spec.name == name


def test_tinyllama_is_exact():
    assert total_params(load_preset("tinyllama-1.1b")) == 1_100_048_384


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE))
def test_moe_active_params_match_published(name):
    spec = load_preset(name)
    published = PUBLISHED_ACTIVE[name]
    tolerance = TOLERANCE_OVERRIDE.get((name, "active"), TOLERANCE)
    counted = active_params(spec)
    assert abs(counted - published) / published <= tolerance, f"{name}: active {counted:,} vs {published:,.0f}"
    assert counted < total_params(spec)


@pytest.mark.parametrize("name", sorted(PUBLISHED_ACTIVE_WITHOUT_EMBEDDING))
def test_moe_active_params_without_embedding_match_published(name):
    spec = load_preset(name)
    counted = active_params(spec) - spec.vocab_size * spec.hidden_size
    published = PUBLISHED_ACTIVE_WITHOUT_EMBEDDING[name]
    assert abs(counted - published) / published <= TOLERANCE, f"{name}: active {counted:,} vs {published:,.0f}"


def test_dense_presets_active_equals_total():
    for name in set(PUBLISHED_TOTAL) - set(PUBLISHED_ACTIVE) - set(PUBLISHED_ACTIVE_WITHOUT_EMBEDDING):
        spec = load_preset(name)
        assert spec.moe is None and active_params(spec) == total_params(spec)


def test_preset_files_are_plain_spec_files():
    for path in sorted(PRESET_DIR.glob("*.yaml")):
        spec = load_file(ModelSpec, path)
        assert spec.name == path.stem
        assert load_model(str(path)) == spec  # a path to a spec file resolves to the same spec


# Architectures from validation/published_runs.json (field "model"), keyed by run id.
PUBLISHED_RUN_MODELS = {
    "bloom176b_production": ("bloom-176b", dict(num_layers=70, hidden=14336, ffn_hidden=57344, num_heads=112,
                             num_kv_heads=112, vocab=250680, seq_len=2048, activation="GeLU", position="ALiBi",
                             tied_embeddings=True)),
    "glm130b_production": ("glm-130b", dict(num_layers=70, hidden=12288, ffn_hidden=32768, num_heads=96,
                           num_kv_heads=96, vocab=150528, seq_len=2048, activation="GeGLU")),
    "opt175b_production": ("opt-175b", dict(num_layers=96, hidden=12288, ffn_hidden=None, num_heads=96,
                           num_kv_heads=96, vocab=None, seq_len=2048, activation="ReLU")),
    "mtnlg530b_2240gpu": ("mt-nlg-530b", dict(num_layers=105, hidden=20480, ffn_hidden=None, num_heads=128,
                          num_kv_heads=128, vocab=None, seq_len=2048, activation=None)),
    "gptneox20b_production": ("gpt-neox-20b", dict(num_layers=44, hidden=6144, ffn_hidden=24576, num_heads=64,
                              num_kv_heads=64, vocab=50257, seq_len=2048, activation="GeLU", untied_embeddings=True)),
}
VALIDATION_FILE = Path(__file__).resolve().parents[2] / "validation" / "published_runs.json"


@pytest.mark.parametrize("run_id", sorted(PUBLISHED_RUN_MODELS))
def test_presets_agree_with_published_runs(run_id):
    name, model = PUBLISHED_RUN_MODELS[run_id]
    spec = load_preset(name)
    assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.kv_heads, spec.seq_len) == (
        model["num_layers"], model["hidden"], model["num_heads"], model["num_kv_heads"], model["seq_len"]
    )
    if model["ffn_hidden"] is not None:
        assert spec.ffn_hidden_size == model["ffn_hidden"]
    if model["vocab"] is not None:
        # Presets carry the embedding-matrix rows (tokenizer vocabulary padded for TP): never fewer, < 0.5% more.
        assert model["vocab"] <= spec.vocab_size <= model["vocab"] * 1.005
    if model["activation"] is not None:
        assert spec.activation == model["activation"].lower()
    if "position" in model:
        assert spec.position == model["position"].lower()
    if "tied_embeddings" in model:
        assert spec.tied_embeddings == model["tied_embeddings"]
    if "untied_embeddings" in model:
        assert spec.tied_embeddings is not model["untied_embeddings"]


@pytest.mark.skipif(not VALIDATION_FILE.is_file(), reason="shared validation data not on this machine")
def test_embedded_published_architectures_match_the_file():
    runs = {run["id"]: run["model"] for run in json.loads(VALIDATION_FILE.read_text())}
    for run_id, (_, model) in PUBLISHED_RUN_MODELS.items():
        for key, value in model.items():
            assert runs[run_id].get(key) == value, (run_id, key)


def test_unknown_preset_suggests_close_names_and_paths():
    with pytest.raises(BadInputError) as err:
        load_model("llama3-8")
    message = str(err.value)
    assert "'llama3-8'" in message and "did you mean llama3-8b" in message and "config.json" in message
    with pytest.raises(BadInputError, match="neither a preset nor an existing file"):
        load_preset("gpt5")


def test_the_preset_index_is_fresh():
    """presets/index.json holds what the presets compute now; if not: python -m planner.models.preset_index."""
    index = json.loads(INDEX_PATH.read_text())
    assert index["fingerprint"] == fingerprint(), "stale presets/index.json: run python -m planner.models.preset_index"
    assert index["rows"] == computed_rows() == [model_row(load_preset(name)) for name in list_presets()]
    assert INDEX_PATH.read_text() == index_text()


def test_a_stale_or_broken_index_is_not_used(tmp_path):
    presets, index_path = tmp_path / "presets", tmp_path / "index.json"
    presets.mkdir()
    for name in ("llama3-8b", "mixtral-8x7b"):
        (presets / f"{name}.yaml").write_text((PRESET_DIR / f"{name}.yaml").read_text())
    index_path.write_text(index_text(presets))
    rows = preset_rows(presets, index_path)
    assert [row["name"] for row in rows] == ["llama3-8b", "mixtral-8x7b"] and rows[0]["num_layers"] == 32
    edited = (presets / "llama3-8b.yaml").read_text().replace("num_layers: 32", "num_layers: 16")
    (presets / "llama3-8b.yaml").write_text(edited)  # the index still says 32 layers
    assert preset_rows(presets, index_path)[0]["num_layers"] == 16
    (presets / "tinyllama-1.1b.yaml").write_text((PRESET_DIR / "tinyllama-1.1b.yaml").read_text())
    assert [row["name"] for row in preset_rows(presets, index_path)][-1] == "tinyllama-1.1b"
    for broken in ("", "[1, 2]", '{"fingerprint": 1}', "{"):
        index_path.write_text(broken)
        assert preset_rows(presets, index_path) == computed_rows(presets)
    index_path.unlink()
    assert preset_rows(presets, index_path) == computed_rows(presets)


HF_SAMPLES = Path(__file__).resolve().parents[1] / "data" / "hf"


def _hf_sample(folder: str, **changes) -> dict:
    return {**json.loads((HF_SAMPLES / folder / "config.json").read_text()), **changes}


# Presets of models whose HF config.json the importer reads: the preset states what the config states (seq_len is
# the pre-training length the preset's comment cites, not max_position_embeddings). gpt-oss-120b is the 20b sample
# with the 120b's depth and experts (openai/gpt-oss-120b config.json: 36 layers, 128 local experts, the same widths)
# and GptOssConfig's attention_dropout default, 0.0 (transformers configuration_gpt_oss.py), which the sample omits.
PRESETS_FROM_HF = {
    "qwen3-30b-a3b": lambda: _hf_sample("qwen3-30b-a3b"),
    "qwen3-235b-a22b": lambda: _hf_sample("qwen3-30b-a3b", hidden_size=4096, intermediate_size=12288,
                                          moe_intermediate_size=1536, num_hidden_layers=94, num_attention_heads=64),
    "gpt-oss-120b": lambda: _hf_sample("gpt-oss-20b", num_hidden_layers=36, num_local_experts=128,
                                       layer_types=["sliding_attention", "full_attention"] * 18, attention_dropout=0.0),
}


@pytest.mark.parametrize("name", sorted(PRESETS_FROM_HF))
def test_preset_is_its_hf_config(name):
    from planner.models.hf import spec_from_hf_config

    preset = load_preset(name).model_dump(exclude={"name", "source", "seq_len"})
    imported = spec_from_hf_config(PRESETS_FROM_HF[name]()).model_dump(exclude={"name", "source", "seq_len"})
    assert {k: v for k, v in preset.items() if imported[k] != v} == {}
