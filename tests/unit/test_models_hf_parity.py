"""Our parameter count against transformers itself: each config is built with AutoModelForCausalLM.from_config on
the meta device (no memory, no weights) and its unique parameters (`model.parameters()` yields a tied weight once,
as `num_parameters()` counts) must equal planner.models.counting.total_params exactly.

Covers every supported model_type through tests/data/hf/tiny_configs.json (tiny sizes, realistic structure) and the
published configs under tests/data/hf/*/config.json. Skipped when transformers (the `hf` extra) or torch is absent;
test_models_hf.py checks the same numbers, recorded, without them.
"""

import json
import warnings
from pathlib import Path

import pytest

from planner.models.counting import total_params
from planner.models.hf import spec_from_hf_config, supported_model_types
from planner.models.hf_recent import WRAPPERS

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

HF_DIR = Path(__file__).resolve().parents[1] / "data" / "hf"
TINY = json.loads((HF_DIR / "tiny_configs.json").read_text())["models"]
SAMPLES = sorted(path.parent.name for path in HF_DIR.glob("*/config.json"))


def hf_num_parameters(config: dict) -> int:
    """Unique parameters of the transformers model `config` describes, built without allocating memory. A multimodal
    wrapper (llama4, mistral3) is counted as its language model (text_config), the part the planner plans."""
    if config["model_type"] in WRAPPERS:
        inner = {**config["text_config"]}
        config = {**inner, "model_type": inner.get("model_type", WRAPPERS[config["model_type"]])}
        config["model_type"] = "llama4_text" if config["model_type"] == "llama4" else config["model_type"]
    kwargs = {key: value for key, value in config.items() if key != "model_type"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = transformers.AutoConfig.for_model(config["model_type"], **kwargs)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(hf_config)
    count = sum(p.numel() for p in model.parameters())
    assert count == model.num_parameters()
    return count


def test_tiny_configs_cover_every_supported_model_type():
    assert {entry["config"]["model_type"] for entry in TINY.values()} == set(supported_model_types())


@pytest.mark.parametrize("name", sorted(TINY))
def test_tiny_config_matches_transformers(name):
    entry = TINY[name]
    hf = hf_num_parameters(entry["config"])
    assert hf == entry["hf_num_parameters"], "recorded count is stale: regenerate tiny_configs.json"
    assert total_params(spec_from_hf_config(entry["config"], name=name)) == hf


@pytest.mark.parametrize("folder", SAMPLES)
def test_published_config_matches_transformers(folder):
    config = json.loads((HF_DIR / folder / "config.json").read_text())
    assert total_params(spec_from_hf_config(config)) == hf_num_parameters(config)


@pytest.mark.parametrize("model_type", ["qwen3_next", "jamba"])
def test_hybrid_stacks_at_their_class_defaults_match_transformers(model_type):
    """Gated DeltaNet (qwen3_next) and Mamba (jamba) layers counted from the configuration class's own defaults
    (the keys a config.json may leave out: planner.models.hf_hybrid.DEFAULTS)."""
    config = {"model_type": model_type, "num_hidden_layers": 8, "vocab_size": 1000, "hidden_size": 256,
              "intermediate_size": 512, "num_attention_heads": 8, "max_position_embeddings": 4096}
    assert total_params(spec_from_hf_config(config)) == hf_num_parameters(config)
