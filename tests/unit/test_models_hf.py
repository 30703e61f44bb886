"""HuggingFace config.json importer: real published configs -> specs whose counts match the published sizes."""

import json
from pathlib import Path

import pytest

from planner.errors import BadInputError
from planner.models import load_model
from planner.models.counting import active_params, total_params
from planner.models.hf import MAX_DEFAULT_SEQ_LEN, spec_from_hf_config, supported_model_types
from planner.models.hf_recent import WRAPPERS

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
    "gemma-2-2b": ("gemma2", 2_614_341_888, None),  # HF google/gemma-2-2b safetensors: 2,614,341,888
    "gemma-3-1b": ("gemma3_text", 999_885_952, None),  # HF google/gemma-3-1b-pt safetensors: 999,885,952
    "phi-3-mini-4k": ("phi3", 3_821_079_552, None),  # HF microsoft/Phi-3-mini-4k-instruct: 3,821,079,552 ("3.8B")
    "olmo-2-7b": ("olmo2", 7_298_617_344, None),  # HF allenai/OLMo-2-1124-7B safetensors: 7,298,617,344
    "qwen1.5-moe-a2.7b": ("qwen2_moe", 14.3e9, 2.7e9),  # HF Qwen/Qwen1.5-MoE-A2.7B card: 14.3B total, 2.7B activated
    "granite-3.0-2b": ("granite", 2.5e9, None),  # HF ibm-granite/granite-3.0-2b-base card: "# Parameters 2.5B"
    "falcon-7b": ("falcon", 6_921_720_704, None),  # HF tiiuae/falcon-7b safetensors: 6,921,720,704
    "starcoder2-3b": ("starcoder2", 3_030_371_328, None),  # HF bigcode/starcoder2-3b safetensors: 3,030,371,328
    # 2025-26 model types (model cards of the repositories named in each config's _name_or_path)
    "gpt-oss-20b": ("gpt_oss", 21e9, None),  # openai/gpt-oss-20b card: 21B parameters (3.6B active, embeddings excluded)
    "llama-4-scout": ("llama4", 109e9, 17e9),  # meta-llama/Llama-4-Scout-17B-16E card: 109B total (with vision), 17B active
    "glm-4.5-air": ("glm4_moe", 106e9, None),  # zai-org/GLM-4.5-Air card: 106B total (12B active, embeddings excluded)
    "deepseek-v2-lite": ("deepseek_v2", 15.7e9, None),  # DeepSeek-V2 report / deepseek-ai/DeepSeek-V2-Lite card: 15.7B (2.4B active)
    "ernie-4.5-21b-a3b": ("ernie4_5_moe", 21e9, None),  # baidu/ERNIE-4.5-21B-A3B card: 21B total (3B active)
    "ministral-8b": ("ministral", 8.02e9, None),  # mistralai/Ministral-8B-Instruct-2410: 8.02B
    "mistral-small-3.1-24b": ("mistral3", 24e9, None),  # mistralai/Mistral-Small-3.1-24B card: 24B (with the vision encoder)
    "olmoe-1b-7b": ("olmoe", 6.9e9, 1.3e9),  # Muennighoff et al. 2024 (OLMoE): 6.9B total, 1.3B active
    "dbrx": ("dbrx", 132e9, 36e9),  # databricks/dbrx-base card: 132B total, 36B active
    "granite-3.0-1b-a400m": ("granitemoe", 1.33e9, None),  # ibm-granite/granite-3.0-1b-a400m-base card: 1.3B total (400M active)
    "command-r7b": ("cohere2", 8.03e9, None),  # CohereLabs/c4ai-command-r7b-12-2024 safetensors: 8.03B
    "smollm3-3b": ("smollm3", 3.08e9, None),  # HuggingFaceTB/SmolLM3-3B safetensors: 3.08B
    "exaone-4.0-32b": ("exaone4", 32e9, None),  # LGAI-EXAONE/EXAONE-4.0-32B card: 32B
    "hunyuan-a13b": ("hunyuan_v1_moe", 80e9, 13e9),  # tencent/Hunyuan-A13B card: 80B total, 13B active
    "phi-3.5-moe": ("phimoe", 41.9e9, 6.6e9),  # microsoft/Phi-3.5-MoE-instruct card: 41.9B total, 6.6B active
    "qwen3-next-80b-a3b": ("qwen3_next", 80e9, None),  # Qwen/Qwen3-Next-80B-A3B-Instruct card: 80B total (3B activated)
    "jamba-v0.1": ("jamba", 52e9, 12e9),  # ai21labs/Jamba-v0.1 card: 52B total, 12B active
}
# "37B", "3.3B" and "2.5B" have two significant digits: we count 37.55B, 3.353B and 2.534B (embedding included).
ACTIVE_TOLERANCE = {"jamba-v0.1": 0.02, "deepseek-v3": 0.02, "qwen3-30b-a3b": 0.02, "olmoe-1b-7b": 0.02, "hunyuan-a13b": 0.02,
                    "dbrx": 0.02, "llama-4-scout": 0.02}
# Llama-4 Scout and Mistral-Small 3.1 are planned as their language model: the cards count the vision encoder too.
TOTAL_TOLERANCE = {"granite-3.0-2b": 0.02, "llama-4-scout": 0.02, "mistral-small-3.1-24b": 0.02, "ernie-4.5-21b-a3b": 0.04,
                   "gpt-oss-20b": 0.01, "glm-4.5-air": 0.01, "qwen3-next-80b-a3b": 0.01}

# sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()) on the meta device, transformers
# 5.23.0 (re-checked by test_models_hf_parity.py when transformers is installed): our count equals it exactly.
HF_NUMEL = {
    "bloom-560m": 559_214_592, "deepseek-v3": 671_026_404_352, "falcon-7b": 6_921_720_704, "gemma-2-2b": 2_614_341_888,
    "gemma-3-1b": 999_885_952, "gpt-neox-20b": 20_554_567_680, "gpt2": 124_439_808, "granite-3.0-2b": 2_533_531_648,
    "llama3-8b": 8_030_261_248, "mistral-7b": 7_241_732_096, "mixtral-8x7b": 46_702_792_704, "olmo-2-7b": 7_298_617_344,
    "opt-1.3b": 1_315_758_080, "phi-3-mini-4k": 3_821_079_552, "qwen1.5-moe-a2.7b": 14_315_784_192,
    "qwen2-7b": 7_615_616_512, "qwen3-30b-a3b": 30_532_122_624, "qwen3-8b": 8_190_735_360, "starcoder2-3b": 3_030_371_328,
    # transformers 5.24.0; multimodal wrappers (llama4, mistral3) counted as the language model of text_config
    "gpt-oss-20b": 20_914_757_184, "llama-4-scout": 107_769_861_120, "glm-4.5-air": 106_852_245_504,
    "deepseek-v2-lite": 15_706_484_224, "ernie-4.5-21b-a3b": 21_825_437_888, "ministral-8b": 8_019_808_256,
    "mistral-small-3.1-24b": 23_572_403_200, "olmoe-1b-7b": 6_919_161_856, "dbrx": 131_596_523_520,
    "granite-3.0-1b-a400m": 1_334_628_352, "command-r7b": 8_028_033_024, "smollm3-3b": 3_075_098_624,
    "exaone-4.0-32b": 32_003_216_384, "hunyuan-a13b": 80_393_183_232, "phi-3.5-moe": 41_873_153_344,
    "qwen3-next-80b-a3b": 79_674_391_296, "jamba-v0.1": 51_570_323_328,  # hybrid stacks (planner.models.hf_hybrid)
}
TINY = json.loads((HF_DIR / "tiny_configs.json").read_text())["models"]


def test_every_supported_model_type_has_a_sample_and_a_tiny_config():
    sampled = {model_type for model_type, _, _ in PUBLISHED.values()}
    assert sampled | {WRAPPERS[t] for t in sampled if t in WRAPPERS} == set(supported_model_types())  # llama4 holds llama4_text
    assert {entry["config"]["model_type"] for entry in TINY.values()} == set(supported_model_types())
    assert {"qwen3_next", "jamba"} <= set(supported_model_types())  # hybrid stacks: Gated DeltaNet and Mamba layers
    assert set(HF_NUMEL) == set(PUBLISHED) == {path.parent.name for path in HF_DIR.glob("*/config.json")}


@pytest.mark.parametrize("folder", sorted(HF_NUMEL))
def test_sample_config_counts_equal_transformers_exactly(folder):
    assert total_params(load_model(str(HF_DIR / folder))) == HF_NUMEL[folder]


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_config_counts_equal_transformers_exactly(name):
    entry = TINY[name]
    assert total_params(spec_from_hf_config(entry["config"], name=name)) == entry["hf_num_parameters"]


@pytest.mark.parametrize("folder", sorted(PUBLISHED))
def test_sample_config_counts_match_published(folder):
    model_type, total, active = PUBLISHED[folder]
    path = HF_DIR / folder / "config.json"
    assert json.loads(path.read_text())["model_type"] == model_type
    spec = load_model(str(path))
    assert abs(total_params(spec) - total) / total <= TOTAL_TOLERANCE.get(folder, 0.01)
    if active is not None:
        assert abs(active_params(spec) - active) / active <= ACTIVE_TOLERANCE.get(folder, 0.01)
    assert spec.source and model_type in spec.source


def _config(folder: str) -> dict:
    return json.loads((HF_DIR / folder / "config.json").read_text())


def test_exact_counts_for_configs_with_exact_published_numbers():
    assert total_params(spec_from_hf_config(_config("llama3-8b"))) == 8_030_261_248
    assert total_params(spec_from_hf_config(_config("gpt2"))) == 124_439_808
    assert total_params(spec_from_hf_config(_config("bloom-560m"))) == 559_214_592
    # OPT: the learned position table has max_position_embeddings + 2 rows (OPTLearnedPositionalEmbedding offset)
    opt = spec_from_hf_config(_config("opt-1.3b"))
    assert opt.num_positions == 2050 and opt.seq_len == 2048 and total_params(opt) == 1_315_758_080


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


def test_new_families_map_to_their_layouts():
    gemma2 = spec_from_hf_config(_config("gemma-2-2b"))
    assert (gemma2.norms_per_layer, gemma2.tied_embeddings, gemma2.dim_per_head, gemma2.activation) == (4, True, 256, "geglu")
    gemma3 = spec_from_hf_config(_config("gemma-3-1b"))
    assert gemma3.qk_norm and gemma3.qk_norm_scope == "head" and gemma3.kv_heads == 1 and gemma3.seq_len == 8192
    olmo = spec_from_hf_config(_config("olmo-2-7b"))
    assert olmo.qk_norm and olmo.qk_norm_scope == "projection" and olmo.norms_per_layer == 2
    moe = spec_from_hf_config(_config("qwen1.5-moe-a2.7b"))
    assert moe.qkv_bias and not moe.out_bias and moe.moe.shared_expert_gate
    assert (moe.moe.num_experts, moe.moe.top_k, moe.moe.shared_ffn_hidden_size, moe.num_moe_layers) == (60, 4, 5632, 24)
    falcon = spec_from_hf_config(_config("falcon-7b"))
    assert (falcon.kv_heads, falcon.norms_per_layer, falcon.ffn_hidden_size, falcon.seq_len) == (1, 1, 4 * 4544, 2048)
    assert falcon.tied_embeddings and not falcon.linear_bias and falcon.activation == "gelu"
    coder = spec_from_hf_config(_config("starcoder2-3b"))
    assert (coder.norm, coder.activation, coder.linear_bias, coder.tied_embeddings) == ("layernorm", "gelu", True, True)
    granite = spec_from_hf_config(_config("granite-3.0-2b"))
    assert granite.kv_heads == 8 and granite.tied_embeddings and not (granite.qkv_bias or granite.mlp_bias)
    phi3 = spec_from_hf_config(_config("phi-3-mini-4k"))
    assert phi3.activation == "swiglu" and not phi3.tied_embeddings


def test_llama_attention_and_mlp_bias_switches():
    both = spec_from_hf_config({**_config("llama3-8b"), "attention_bias": True, "mlp_bias": True})
    assert both.qkv_bias and both.out_bias and both.mlp_bias and not both.linear_bias
    mlp_only = spec_from_hf_config({**_config("llama3-8b"), "mlp_bias": True})
    assert mlp_only.mlp_bias and not (mlp_only.qkv_bias or mlp_only.out_bias)
    # Mistral's attention has no bias switch (modeling_mistral: bias=False): the key is ignored
    assert not spec_from_hf_config({**_config("mistral-7b"), "attention_bias": True}).has_qkv_bias


def test_falcon_layouts():
    base = _config("falcon-7b")
    new_arch = spec_from_hf_config({**base, "new_decoder_architecture": True, "num_kv_heads": 8, "num_attention_heads": 128,
                                    "hidden_size": 8192})
    assert (new_arch.kv_heads, new_arch.norms_per_layer) == (8, 2)  # Falcon-40B style: ln_attn and ln_mlp
    mha = spec_from_hf_config({**base, "multi_query": False, "parallel_attn": False, "alibi": True})
    assert (mha.kv_heads, mha.norms_per_layer, mha.position) == (71, 2, "alibi")
    legacy = {k: v for k, v in base.items() if k not in ("num_attention_heads", "num_hidden_layers")}
    legacy.update(n_head=71, n_layer=32)  # the 4.x attribute_map spellings
    assert total_params(spec_from_hf_config(legacy)) == HF_NUMEL["falcon-7b"]


def test_transformers_5_key_spellings():
    v4 = _config("qwen3-30b-a3b")
    v5 = {k: v for k, v in v4.items() if k not in ("num_experts", "rope_theta", "rope_scaling")}
    v5.update(num_local_experts=128, rope_parameters={"rope_type": "default", "rope_theta": 1e6}, dtype="bfloat16")
    assert spec_from_hf_config(v5, name="x") == spec_from_hf_config(v4, name="x")
    mixtral = {k: v for k, v in _config("mixtral-8x7b").items() if k != "num_local_experts"}
    assert spec_from_hf_config({**mixtral, "num_experts": 8}).moe.num_experts == 8  # MixtralConfig attribute_map
    deepseek = {k: v for k, v in _config("deepseek-v3").items() if k != "n_routed_experts"}
    assert spec_from_hf_config({**deepseek, "num_local_experts": 256, "head_dim": 64}).moe.num_experts == 256
    gemma = {k: v for k, v in _config("gemma-2-2b").items() if k not in ("hidden_act", "hidden_activation")}
    assert spec_from_hf_config({**gemma, "hidden_activation": "gelu_pytorch_tanh"}).activation == "geglu"


def test_family_defaults_follow_the_transformers_config_classes():
    gemma = {k: v for k, v in _config("gemma-2-2b").items() if k not in ("head_dim", "tie_word_embeddings")}
    spec = spec_from_hf_config(gemma)
    assert spec.dim_per_head == 256 and spec.tied_embeddings  # Gemma2Config: head_dim 256, tied
    coder = {k: v for k, v in _config("starcoder2-3b").items() if k != "use_bias"}
    assert spec_from_hf_config(coder).linear_bias  # Starcoder2Config.use_bias defaults to true
    deepseek = {k: v for k, v in _config("deepseek-v3").items() if k != "q_lora_rank"}
    assert spec_from_hf_config(deepseek).mla.q_lora_rank == 1536  # class default; an explicit null means full rank
    assert spec_from_hf_config({**deepseek, "q_lora_rank": None}).mla.q_lora_rank is None


@pytest.mark.parametrize(
    "folder, change, named",
    [
        ("opt-1.3b", {"do_layer_norm_before": False}, "do_layer_norm_before=False"),
        ("opt-1.3b", {"layer_norm_elementwise_affine": False}, "layer_norm_elementwise_affine=False"),
        ("gpt2", {"add_cross_attention": True}, "add_cross_attention=True"),
        ("deepseek-v3", {"attention_bias": True}, "attention_bias=True"),
        ("qwen1.5-moe-a2.7b", {"mlp_only_layers": [3]}, "mlp_only_layers"),
        ("starcoder2-3b", {"hidden_act": "tanh"}, "hidden_act='tanh'"),
    ],
)
def test_inexpressible_values_are_refused_in_one_line(folder, change, named):
    with pytest.raises(BadInputError, match=named) as err:
        spec_from_hf_config({**_config(folder), **change}, source=f"{folder}/config.json")
    message = str(err.value)
    assert "\n" not in message and f"{folder}/config.json" in message


@pytest.mark.parametrize("folder, key", [("falcon-7b", "hidden_size"), ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size"),
                                          ("gemma-3-1b", "vocab_size"), ("qwen3-30b-a3b", "num_experts")])
def test_missing_required_key_names_it_and_its_spellings(folder, key):
    cfg = {k: v for k, v in _config(folder).items() if k != key}
    with pytest.raises(BadInputError, match=f"missing field '{key}'") as err:
        spec_from_hf_config(cfg, source="c.json")
    assert "c.json" in str(err.value) and "add it to the config.json" in str(err.value)
    if key == "num_experts":
        assert "'num_local_experts'" in str(err.value)
