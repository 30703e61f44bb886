"""HuggingFace config.json importer: real published configs -> specs whose counts match the published sizes."""

import json
from pathlib import Path

import pytest

from planner.errors import BadInputError
from planner.models import load_model
from planner.models.counting import active_params, total_params
from planner.models.hf import MAX_DEFAULT_SEQ_LEN, spec_from_hf_config, supported_model_types

HF_DIR = Path(__file__).resolve().parents[1] / "data" / "hf"

# folder -> (model_type, published total, published active or None, source of the number)
PUBLISHED = {
    "llama3-8b": ("llama", 8_030_261_248, None),  # HF meta-llama/Meta-Llama-3-8B safetensors: 8.03B
    "mistral-7b": ("mistral", 7_241_732_096, None),  # HF mistralai/Mistral-7B-v0.1: 7.24B
    "mixtral-8x7b": ("mixtral", 46.7e9, 12.9e9),  # HF Mixtral-8x7B-v0.1: 46.7B total, 12.9B active
    "qwen2-7b": ("qwen2", 7.62e9, None),  # Qwen2 technical report / HF Qwen/Qwen2-7B: 7.62B (7.07B non-embedding)
    "qwen3-8b": ("qwen3", 8.2e9, None),  # HF Qwen/Qwen3-8B model card: 8.2B
    "qwen3-30b-a3b": ("qwen3_moe", 30.5e9, 3.3e9),  # HF Qwen/Qwen3-30B-A3B model card: 30.5B total, 3.3B activated
    "deepseek-v3": ("deepseek_v3", 671e9, 37e9),  # DeepSeek-V3 report: 671B total, 37B activated
    "gpt2": ("gpt2", 124_439_808, None),  # HF gpt2: 124,439,808 (the "124M" model)
    "gpt-neox-20b": ("gpt_neox", 20.55e9, None),  # Black et al. 2022 Table 1: 20.55B
    "opt-1.3b": ("opt", 1_315_758_080, None),  # HF facebook/opt-1.3b numel (incl. 2 offset position rows)
    "bloom-560m": ("bloom", 559_214_592, None),  # HF bigscience/bloom-560m: 559,214,592
}
# "37B" and "3.3B" have two significant digits: we count 37.55B and 3.353B (embedding and head included).
ACTIVE_TOLERANCE = {"deepseek-v3": 0.02, "qwen3-30b-a3b": 0.02}


def test_every_supported_model_type_has_a_sample():
    assert {model_type for model_type, _, _ in PUBLISHED.values()} == set(supported_model_types())


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_sample_config_counts_match_published(folder):
    model_type, total, active = PUBLISHED[folder]
    path = HF_DIR / folder / "config.json"
    assert json.loads(path.read_text())["model_type"] == model_type
    spec = load_model(str(path))
    assert abs(total_params(spec) - total) / total <= 0.01
    if active is not None:
        assert abs(active_params(spec) - active) / active <= ACTIVE_TOLERANCE.get(folder, 0.01)
    assert spec.source and model_type in spec.source


def _config(folder: str) -> dict:
    return json.loads((HF_DIR / folder / "config.json").read_text())


def test_exact_counts_for_configs_with_exact_published_numbers():
    assert total_params(spec_from_hf_config(_config("llama3-8b"))) == 8_030_261_248
    assert total_params(spec_from_hf_config(_config("gpt2"))) == 124_439_808
    assert total_params(spec_from_hf_config(_config("bloom-560m"))) == 559_214_592
    # OPT: HF allocates 2 extra position rows (offset 2) that the spec does not model: 2 * hidden parameters.
    assert 1_315_758_080 - total_params(spec_from_hf_config(_config("opt-1.3b"))) == 2 * 2048


def test_field_mapping_and_defaults():
    gpt2 = spec_from_hf_config(_config("gpt2"))
    assert (gpt2.ffn_hidden_size, gpt2.position, gpt2.tied_embeddings, gpt2.seq_len) == (4 * 768, "learned", True, 1024)
    qwen3 = spec_from_hf_config(_config("qwen3-30b-a3b"))
    assert qwen3.dim_per_head == 128 and qwen3.hidden_size // qwen3.num_attention_heads == 64  # head_dim respected
    assert qwen3.qk_norm and qwen3.moe.num_experts == 128 and qwen3.num_moe_layers == 48
    qwen2 = spec_from_hf_config(_config("qwen2-7b"))
    assert qwen2.qkv_bias and qwen2.kv_heads == 4
    bloom = spec_from_hf_config(_config("bloom-560m"))
    assert (bloom.position, bloom.embedding_norm, bloom.ffn_hidden_size) == ("alibi", True, 4096)
    opt = spec_from_hf_config(_config("opt-1.3b"))
    assert (opt.ffn_hidden_size, opt.activation, opt.name) == (8192, "relu", "opt-1.3b")
    ds = spec_from_hf_config(_config("deepseek-v3"))
    assert ds.mla.kv_lora_rank == 512 and ds.moe.first_k_dense == 3 and ds.num_moe_layers == 58
    assert ds.moe.num_shared_experts == 1


def test_qwen3_moe_non_embedding_count():
    # HF Qwen/Qwen3-30B-A3B model card: "Number of Parameters (Non-Embedding): 29.9B" (embedding and LM head excluded).
    spec = spec_from_hf_config(_config("qwen3-30b-a3b"))
    non_embedding = total_params(spec) - 2 * spec.vocab_size * spec.hidden_size
    assert abs(non_embedding - 29.9e9) / 29.9e9 <= 0.01


def test_tie_word_embeddings_and_kv_heads_default():
    cfg = {**_config("llama3-8b"), "tie_word_embeddings": True}
    cfg.pop("num_key_value_heads")
    spec = spec_from_hf_config(cfg, name="tied")
    assert spec.tied_embeddings and spec.kv_heads == 32 and spec.name == "tied"
    untied = spec_from_hf_config(_config("llama3-8b"))
    assert total_params(untied) - total_params(spec.model_copy(update={"num_kv_heads": 8})) == 128256 * 4096


def test_seq_len_capped_at_default_maximum():
    assert MAX_DEFAULT_SEQ_LEN == 8192
    assert spec_from_hf_config(_config("qwen2-7b")).seq_len == 8192  # config says 131072
    assert spec_from_hf_config({**_config("llama3-8b"), "max_position_embeddings": 4096}).seq_len == 4096


def test_qwen3_moe_sparse_step_and_leading_dense_layers():
    step2 = spec_from_hf_config({**_config("qwen3-30b-a3b"), "decoder_sparse_step": 2})
    # HF: layer i is sparse when (i + 1) % 2 == 0 -> layers 1, 3, 5, ...
    assert [step2.is_moe_layer(i) for i in range(4)] == [False, True, False, True]
    lead = spec_from_hf_config({**_config("qwen3-30b-a3b"), "mlp_only_layers": [0, 1]})
    assert [lead.is_moe_layer(i) for i in range(3)] == [False, False, True]
    with pytest.raises(BadInputError, match="mlp_only_layers"):
        spec_from_hf_config({**_config("qwen3-30b-a3b"), "mlp_only_layers": [5]})


def test_unknown_model_type_lists_supported(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "t5", "d_model": 512}))
    with pytest.raises(BadInputError) as err:
        load_model(str(path))
    message = str(err.value)
    assert "model_type='t5'" in message and str(path) in message
    assert all(name in message for name in supported_model_types())


def test_missing_field_names_field_and_file(tmp_path):
    cfg = _config("llama3-8b")
    del cfg["intermediate_size"]
    path = tmp_path / "my-llama" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    with pytest.raises(BadInputError) as err:
        load_model(str(path))
    assert "'intermediate_size'" in str(err.value) and str(path) in str(err.value)


def test_invalid_values_become_bad_input():
    with pytest.raises(BadInputError, match="num_kv_heads"):
        spec_from_hf_config({**_config("llama3-8b"), "num_key_value_heads": 5})
    with pytest.raises(BadInputError, match="hidden_act"):
        spec_from_hf_config({**_config("llama3-8b"), "hidden_act": "tanh"})
    with pytest.raises(BadInputError, match="word_embed_proj_dim"):
        spec_from_hf_config({**_config("opt-1.3b"), "word_embed_proj_dim": 512})
    with pytest.raises(BadInputError, match="moe_layer_freq=2"):
        spec_from_hf_config({**_config("deepseek-v3"), "moe_layer_freq": 2})
    with pytest.raises(BadInputError, match="not a number"):
        spec_from_hf_config({**_config("gpt2"), "n_embd": "big"})
    with pytest.raises(BadInputError, match="top_k"):
        spec_from_hf_config({**_config("mixtral-8x7b"), "num_experts_per_tok": 9})


def test_spec_files_and_malformed_input(tmp_path):
    good = tmp_path / "tiny.yaml"
    good.write_text(
        "name: tiny\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 128\nnum_attention_heads: 4\n"
        "vocab_size: 100\nseq_len: 32\n"
    )
    assert load_model(str(good)).num_layers == 2
    missing = tmp_path / "missing.yaml"
    missing.write_text("name: tiny\nnum_layers: 2\nhidden_size: 64\n")
    with pytest.raises(BadInputError) as err:
        load_model(str(missing))
    assert "ffn_hidden_size" in str(err.value) and str(missing) in str(err.value)
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: tiny\nnum_layers: [2\n")
    with pytest.raises(BadInputError, match="malformed YAML at line"):
        load_model(str(broken))
    hf_yaml = tmp_path / "hf.yaml"
    hf_yaml.write_text("model_type: gpt2\nn_layer: 2\nn_embd: 64\nn_head: 4\nvocab_size: 100\nn_positions: 32\n")
    assert load_model(str(hf_yaml)).position == "learned"  # any file with model_type goes through the importer


def test_checkpoint_folder_resolves_to_its_config():
    spec = load_model(str(HF_DIR / "mistral-7b"))
    assert spec.name == "mistral-7b" and total_params(spec) == 7_241_732_096
