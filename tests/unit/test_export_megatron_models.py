"""Megatron exports carry every architecture flag the model needs (flag names of Megatron-LM core_v0.16.1 /
core_v0.19.0 arguments.py and TransformerConfig), and megatron-core's own GPTModel, built from the exported flags on
the meta device, has the plan's parameter count (which test_models_hf_parity.py ties to transformers')."""

from pathlib import Path

import pytest

from planner import api
from planner.export import export_plan
from planner.export.megatron_model import model_arguments
from planner.models import load_model
from planner.models.counting import total_params
from planner.schemas.plan import Configuration, Parallelism

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


def plan_for(folder: str, *, seq_len: int = 4096):
    spec = load_model(str(HF / folder))
    moe = spec.moe is not None
    ep = 8 if moe and spec.moe.num_experts % 8 == 0 else 1
    request = api.build_request(model=spec, topology="dgx-h100", gpus=8, global_batch_size=64, seq_len=seq_len,
                                framework="megatron-core")
    parallelism = Parallelism(dp=8, tp=1, pp=1, ep=ep, zero_stage=1) if moe else Parallelism(dp=2, tp=4, pp=1, sp=True, zero_stage=1)
    return api.estimate(request, Configuration(parallelism=parallelism, schedule="1f1b"))


def model_args(folder: str) -> list[str]:
    """The model half of the export (planner.export.megatron_model) with the smallest parallel half Megatron reads."""
    spec = load_model(str(HF / folder))
    seq_len = min(2048, spec.position_rows)  # a learned position table bounds the training length
    return ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--micro-batch-size", "1",
            "--global-batch-size", "8", *model_arguments(spec, seq_len, [])]


def flags(folder: str) -> dict[str, str | bool]:
    args = model_args(folder)
    out: dict[str, str | bool] = {}
    for index, arg in enumerate(args):
        if arg.startswith("--"):
            value = args[index + 1] if index + 1 < len(args) and not args[index + 1].startswith("--") else True
            out[arg] = value
    return out


def test_rope_base_percent_and_norm_epsilon_are_exported():
    llama = flags("llama3-8b")
    assert llama["--rotary-base"] == "500000" and llama["--norm-epsilon"] == "1e-05"
    glm = flags("glm-4.5-air")
    assert glm["--rotary-percent"] == "0.5" and glm["--rotary-base"] == "1000000" and "--add-qkv-bias" in glm


def test_gpt_oss_sinks_windows_and_biases():
    f = flags("gpt-oss-20b")
    assert f["--softmax-type"] == "learnable"
    assert f["--window-size"] == "127,0" and f["--window-attn-skip-freq"].startswith("[1,0,1,0")
    assert "--disable-bias-linear" not in f  # qkv, proj, experts and router all biased: Megatron's add_bias_linear


def test_deepseek_router_groups_scaling_and_expert_bias():
    f = flags("deepseek-v3")
    assert f["--moe-router-score-function"] == "sigmoid" and f["--moe-router-topk-scaling-factor"] == "2.5"
    assert f["--moe-router-num-groups"] == "8" and f["--moe-router-group-topk"] == "4"
    assert "--moe-router-enable-expert-bias" in f and "--multi-latent-attention" in f and "--qk-layernorm" in f
    lite = flags("deepseek-v2-lite")
    assert "--moe-router-pre-softmax" in lite and "--q-lora-rank" not in lite and "--moe-router-score-function" not in lite


def test_nope_layers_are_exported():
    f = flags("smollm3-3b")  # no_rope_layer_interval 4: layers 3, 7, ... without RoPE
    assert f["--no-rope-freq"].startswith("[0,0,0,1,0,0,0,1") and f["--no-rope-freq"].count("1") == 9


def test_qwen2_moe_shared_expert_gate_is_a_flag():
    f = flags("qwen1.5-moe-a2.7b")
    assert "--moe-shared-expert-gate" in f and f["--moe-shared-expert-intermediate-size"] == "5632"
    assert "--moe-router-pre-softmax" in f  # norm_topk_prob false: softmax over all experts, then top-k


@pytest.mark.parametrize("folder", ["llama3-8b", "qwen3-8b", "qwen2-7b", "mistral-7b", "ministral-8b", "smollm3-3b",
                                    "mistral-small-3.1-24b", "gpt-oss-20b", "granite-3.0-1b-a400m", "deepseek-v2-lite",
                                    "qwen1.5-moe-a2.7b", "qwen3-30b-a3b", "mixtral-8x7b", "phi-3-mini-4k", "glm-4.5-air",
                                    "hunyuan-a13b", "exaone-4.0-32b", "deepseek-v3", "gpt2", "opt-1.3b", "starcoder2-3b"])
def test_megatron_core_builds_the_plans_model(folder):
    pytest.importorskip("megatron.core")
    from planner.export.judges_megatron import megatron_core_params

    assert megatron_core_params(model_args(folder)) == total_params(load_model(str(HF / folder)))


def test_the_judge_rejects_flags_that_build_another_model():
    pytest.importorskip("megatron.core")
    from planner.export.judges import judge

    plan = plan_for("qwen3-8b", seq_len=2048)
    export = export_plan(plan, "megatron")
    assert judge(plan, export).accepted
    wrong = export.__class__(target=export.target, text=export.text.replace("--qk-layernorm", ""), suffix=export.suffix)
    verdict = judge(plan, wrong)
    assert not verdict.accepted and "parameters" in verdict.reason


def _scaled(folder: str, scaling: dict) -> list[str]:
    import json

    from planner.models.hf import spec_from_hf_config

    config = {**json.loads((HF / folder / "config.json").read_text()), "rope_scaling": scaling}
    warnings: list[str] = []
    return model_arguments(spec_from_hf_config(config), 4096, warnings), warnings


def test_rope_scaling_flags_of_core_v0_16_1():
    """llama3: --use-rope-scaling --rope-scaling-factor (Megatron fixes low/high 1/4 and 8192: other values warned);
    integer linear: --rotary-seq-len-interpolation-factor; MLA yarn: --rope-type yarn with the MLA scaling flags;
    yarn without MLA and dynamic NTK have no flag: one warning each, naming it."""
    args, warned = _scaled("llama3-8b", {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    assert args[args.index("--rope-scaling-factor") - 1:args.index("--rope-scaling-factor") + 2] == [
        "--use-rope-scaling", "--rope-scaling-factor", "8.0"] and not warned
    args, warned = _scaled("llama3-8b", {"rope_type": "llama3", "factor": 16.0, "high_freq_factor": 1.0})
    assert "--use-rope-scaling" in args and "high_freq_factor=1.0" in warned[0]
    args, warned = _scaled("llama3-8b", {"rope_type": "linear", "factor": 2.0})
    assert args[args.index("--rotary-seq-len-interpolation-factor") + 1] == "2" and not warned
    f = flags("deepseek-v3")
    assert f["--rope-type"] == "yarn" and f["--rotary-scaling-factor"] == "40.0" and f["--mscale-all-dim"] == "1.0"
    warned = []
    args = model_arguments(load_model(str(HF / "gpt-oss-20b")), 4096, warned)
    assert "--rope-type" not in args and any("rope_scaling yarn (factor 32.0) is not exported" in w for w in warned)
    args, warned = _scaled("llama3-8b", {"rope_type": "dynamic", "factor": 2.0})
    assert "no dynamic-NTK RoPE" in warned[0]


def test_megatron_core_builds_the_scaled_and_positionless_flags():
    """The flags above parse and build in megatron-core (RoPE scaling holds no parameters; Jamba's --position-
    embedding-type none is what its attention uses, though Megatron refuses Jamba's Mamba-1 layers)."""
    pytest.importorskip("megatron.core")
    from planner.export.judges_megatron import megatron_core_params

    args, _ = _scaled("llama3-8b", {"rope_type": "llama3", "factor": 8.0})
    base = ["--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "1", "--micro-batch-size", "1",
            "--global-batch-size", "8"]
    assert megatron_core_params(base + args) == total_params(load_model(str(HF / "llama3-8b")))
    jamba = load_model(str(HF / "jamba-v0.1"))
    assert model_arguments(jamba, 4096, [])[model_arguments(jamba, 4096, []).index("--position-embedding-type") + 1] == "none"
