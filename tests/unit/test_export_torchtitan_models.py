"""torchtitan exports carry the plan's own model: a registered flavor of the same architecture, or a generated
config module built with torchtitan 0.3's own builders and the model's exact sizes, or a refusal; never a stand-in.

Without torchtitan installed, the generated module is executed against a recording stub of the 0.3 builders it
calls (torchtitan/models/common/config_utils.py make_gqa_config/make_ffn_config, llama3 model_registry,
config_registry.llama3_8b; signatures as in the torchtitan 0.3.0 wheel) and the parameters those sizes give are
counted; with torchtitan installed, planner.export.judges builds torchtitan's model itself on the meta device and
compares its parameter count (test_export_judges.py, framework_acceptance.py)."""

import sys
import types
from pathlib import Path

import pytest

from planner import api
from planner.errors import BadInputError
from planner.export import export_plan
from planner.export.torchtitan_model import GENERATED_MODULE, model_choice
from planner.models import load_model
from planner.models.counting import total_params
from planner.schemas.plan import Configuration, Parallelism

HF = Path(__file__).resolve().parents[1] / "data" / "hf"


@pytest.mark.parametrize(("model", "expected"), [("llama3-8b", ("llama3", "llama3_8b")),
                                                 (str(HF / "llama3-8b"), ("llama3", "llama3_8b")),
                                                 (str(HF / "deepseek-v3"), ("deepseek_v3", "deepseek_v3_671b"))])
def test_a_model_torchtitan_registers_uses_its_flavor(model, expected):
    module, function, generated = model_choice(load_model(model))
    assert (module, function) == expected and generated is None


@pytest.mark.parametrize(("model", "missing"), [(str(HF / "qwen1.5-moe-a2.7b"), "a gated shared expert"),
                                                (str(HF / "qwen2-7b"), "linear biases"),
                                                (str(HF / "smollm3-3b"), "layers without RoPE"),
                                                (str(HF / "glm-4.5-air"), "partial RoPE")])
def test_a_model_torchtitan_cannot_build_is_refused_not_stood_in(model, missing):
    with pytest.raises(BadInputError, match=f"torchtitan 0.3 has no model for .* with {missing}"):
        model_choice(load_model(model))


def test_the_torchtitan_profile_refuses_what_its_models_lack_before_the_search():
    with pytest.raises(BadInputError, match="LayerNorm .* framework 'torchtitan' does not build"):
        api.build_request(model="gpt3-175b", nodes=8, framework="torchtitan")


class Recorder:
    """Stands in for a torchtitan config class: keeps its keyword arguments."""

    def __init__(self, kind, **kwargs):
        self.kind, self.kwargs = kind, kwargs

    def __getattr__(self, name):
        return self.kwargs[name]


def stub_torchtitan(monkeypatch):
    """Modules named as torchtitan 0.3 names them, whose builders record what they are given."""
    def config_class(kind):
        return types.SimpleNamespace(Config=lambda **kw: Recorder(kind, **kw))

    common = types.ModuleType("torchtitan.models.common")
    for kind in ("ComplexRoPE", "Embedding", "Linear", "RMSNorm"):
        setattr(common, kind, config_class(kind))
    utils = types.ModuleType("torchtitan.models.common.config_utils")
    utils.get_attention_config = lambda backend: Recorder("inner", backend=backend)
    utils.make_gqa_config = lambda **kw: Recorder("gqa", **kw)
    utils.make_ffn_config = lambda **kw: Recorder("ffn", **kw)
    llama3 = types.ModuleType("torchtitan.models.llama3")
    registry = types.ModuleType("torchtitan.models.llama3.config_registry")
    registry.llama3_8b = lambda: types.SimpleNamespace(model_spec=None, loss=types.SimpleNamespace(
        loss_fn=types.SimpleNamespace(global_vocab_size=128256)))
    llama3.config_registry = registry
    import dataclasses

    @dataclasses.dataclass
    class Spec:
        name: str
        flavor: str
        model: object

    llama3.model_registry = lambda flavor: Spec(name="llama3", flavor=flavor, model=None)
    model = types.ModuleType("torchtitan.models.llama3.model")
    model.Llama3Model = config_class("Llama3Model")
    model.Llama3TransformerBlock = config_class("Block")
    for name, module in {"torchtitan": types.ModuleType("torchtitan"), "torchtitan.models": types.ModuleType("torchtitan.models"),
                         "torchtitan.models.common": common, "torchtitan.models.common.config_utils": utils,
                         "torchtitan.models.llama3": llama3, "torchtitan.models.llama3.config_registry": registry,
                         "torchtitan.models.llama3.model": model}.items():
        monkeypatch.setitem(sys.modules, name, module)


def counted(model) -> int:
    """Parameters of the recorded Llama3Model.Config as torchtitan's modules hold them (Linear without bias,
    RMSNorm a scale, Embedding a table, a tied lm_head shares the embedding's weight)."""
    h, v = model.dim, model.vocab_size
    params = v * h + model.norm.normalized_shape + (0 if model.enable_weight_tying else v * h)
    for block in model.layers:
        a, kv, d = block.attention.n_heads, block.attention.n_kv_heads, block.attention.head_dim
        qk = block.attention.qk_norm
        params += block.attention_norm.normalized_shape + block.ffn_norm.normalized_shape
        params += h * (a + 2 * kv) * d + a * d * h + (2 * qk.normalized_shape if qk is not None else 0)
        params += 3 * h * block.feed_forward.hidden_dim
    return params


@pytest.mark.parametrize("model", ["tinyllama-1.1b", str(HF / "qwen3-8b"), str(HF / "mistral-7b"), str(HF / "mistral-small-3.1-24b"),
                                   str(HF / "ministral-8b") + "-full"])
def test_the_generated_module_builds_the_plans_model(model, monkeypatch, tmp_path):
    spec = load_model(model.removesuffix("-full"))
    if model.endswith("-full"):  # Ministral without its window: a dense model torchtitan's llama3 family builds
        spec = spec.model_copy(update={"layer_types": None, "sliding_window": None})
    stub_torchtitan(monkeypatch)
    request = api.build_request(model=spec, topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="torchtitan")
    pp = 1 if spec.tied_embeddings else 2  # torchtitan ties embeddings only without PP (decoder.py update_from_config)
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=8 // pp, tp=2, pp=pp, sp=True, zero_stage=3),
                                               schedule="1f1b"))
    script = export_plan(plan, "torchtitan").text
    assert f"--module {GENERATED_MODULE}" in script and "llama3_8b" not in script.split("PLANNER_TORCHTITAN_ARGS=(")[1]
    source = script.split("<<'PLANNER_TORCHTITAN_MODEL'\n")[1].split("\nPLANNER_TORCHTITAN_MODEL\n")[0]
    namespace: dict = {}
    exec(compile(source, f"{GENERATED_MODULE}.py", "exec"), namespace)
    config = namespace["planner_model"]()
    assert config.model_spec.flavor == spec.name and config.loss.loss_fn.global_vocab_size == spec.vocab_size
    built = config.model_spec.model
    assert len(built.layers) == spec.num_layers
    assert counted(built) == total_params(spec)
    if pp == 1:
        return
    # the stage FQNs name the model's real layers, each once, in order
    stages = script.split("--parallelism.module_fqns_per_model_part ")[1].split("\n")[0].replace("'", "").split()
    names = [n for stage in stages for n in stage.split(",")]
    assert names == ["tok_embeddings", *(f"layers.{i}" for i in range(spec.num_layers)), "norm", "lm_head"]


# ---- MoE and MLA models: the qwen3, deepseek_v3 and gpt_oss families' own builders, judged by torchtitan itself ----

@pytest.mark.parametrize(("model", "family"), [
    (str(HF / "qwen3-30b-a3b"), "qwen3"),          # GQA + per-head q/k norm + 128 experts
    ("mixtral-8x7b", "qwen3"),                      # GQA + 8 experts, no q/k norm
    # hunyuan-a13b (q/k norms after RoPE) and granite-3.0-1b-a400m (multipliers): refused, test_hunyuan_and_granite_...
    (str(HF / "deepseek-v2-lite"), "deepseek_v3"),  # MLA with a full Q projection, 1 dense layer, 2 shared experts
    (str(HF / "gpt-oss-20b"), "gpt_oss"),           # sinks, biased QKV/out/router/experts, alternate 128-key windows
])
def test_moe_and_mla_models_export_with_their_familys_builders(model, family):
    """torchtitan builds the exported config's model on the meta device (planner.export.judges_torchtitan.judge_torchtitan):
    its parameters equal planner.models.counting.total_params (which tests tie to transformers), and with PP the
    stage FQNs are the model's own modules, every layer in exactly one stage."""
    pytest.importorskip("torchtitan.config")
    from planner.export.judges import judge

    spec = load_model(model)
    pp = 1 if spec.tied_embeddings else 2
    request = api.build_request(model=spec, topology="dgx-h100", gpus=64, global_batch_size=128, seq_len=4096,
                                framework="torchtitan")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=32 // pp, tp=2, pp=pp, ep=8, sp=True, zero_stage=3),
                                               schedule="1f1b"))
    export = export_plan(plan, "torchtitan")
    assert f"--module {GENERATED_MODULE}" in export.text and f"from torchtitan.models.{family} import" in export.text
    assert f"N_LAYERS = {spec.num_layers}" in export.text
    verdict = judge(plan, export)
    assert verdict.accepted, verdict.reason
    if pp > 1:
        stages = export.text.split("--parallelism.module_fqns_per_model_part ")[1].split("\n")[0].replace("'", "").split()
        names = [n for stage in stages for n in stage.split(",")]
        assert names == ["tok_embeddings", *(f"layers.{i}" for i in range(spec.num_layers)), "norm", "lm_head"]


def test_a_changed_architecture_is_caught_by_torchtitans_parameter_count():
    """The judge is not a formality: one shared expert too many in the generated module fails the count."""
    pytest.importorskip("torchtitan.config")
    from planner.export.common import Export
    from planner.export.judges import judge

    spec = load_model(str(HF / "deepseek-v2-lite"))
    request = api.build_request(model=spec, topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="torchtitan")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=8, tp=2, pp=1, ep=2, sp=True, zero_stage=3)))
    export = export_plan(plan, "torchtitan")
    assert "N_SHARED = 2" in export.text
    broken = Export(target=export.target, text=export.text.replace("N_SHARED = 2", "N_SHARED = 3"), suffix=export.suffix)
    verdict = judge(plan, broken)
    assert not verdict.accepted and "parameters, the plan's" in verdict.reason


def test_gpt_oss_with_context_parallelism_gets_flex_attention_and_varlen_is_caught():
    """torchtitan 0.3's CP wraps FlexAttention and SDPA only (distributed/context_parallel/api.py apply_cp_to_forward):
    the gpt_oss module keeps the family's varlen default without CP and takes flex with it; the judge rejects varlen
    under CP."""
    pytest.importorskip("torchtitan.config")
    from planner.export.common import Export
    from planner.export.judges import judge

    spec = load_model(str(HF / "gpt-oss-20b"))
    exports = {}
    for cp in (1, 2):
        request = api.build_request(model=spec, topology="dgx-h100", gpus=64, global_batch_size=128, seq_len=8192,
                                    framework="torchtitan")
        plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=16 // cp * 2, tp=2, pp=1, cp=cp, ep=8,
                                                                           sp=True, zero_stage=3)))
        exports[cp] = (plan, export_plan(plan, "torchtitan"))
        assert judge(*exports[cp]).accepted
    assert "ATTN_BACKEND = 'varlen'" in exports[1][1].text and "ATTN_BACKEND = 'flex'" in exports[2][1].text
    plan, export = exports[2]
    broken = Export(target=export.target, text=export.text.replace("ATTN_BACKEND = 'flex'", "ATTN_BACKEND = 'varlen'"),
                    suffix=export.suffix)
    verdict = judge(plan, broken)
    assert not verdict.accepted and "Variable-length attention CP" in verdict.reason


@pytest.mark.parametrize(("folder", "piece"), [("hunyuan-a13b", "q/k norms applied after RoPE"),
                                               ("granite-3.0-1b-a400m", "Granite's embedding, residual and attention multipliers")])
@pytest.mark.parametrize("framework", ["torchtitan", "megatron-core"])
def test_hunyuan_and_granite_are_refused_naming_the_piece_the_stack_lacks(folder, piece, framework):
    """Same parameters, another computation: torchtitan's and Megatron-Core's q/k norms run before RoPE (Hunyuan's
    after), and neither has Granite's embedding/residual multipliers or logits scaling. One line, at plan time."""
    from planner.errors import BadInputError

    with pytest.raises(BadInputError, match=piece) as caught:
        api.build_request(model=load_model(str(HF / folder)), gpus=8, framework=framework)
    assert "\n" not in str(caught.value)


def _with_rope_scaling(folder: str, scaling: dict):
    import json

    from planner.models.hf import spec_from_hf_config

    config = {**json.loads((HF / folder / "config.json").read_text()), "rope_scaling": scaling}
    return spec_from_hf_config(config, name=f"{folder}-scaled")


def test_rope_scaling_reaches_the_generated_model_and_torchtitan_builds_it():
    """Qwen3-8B with YaRN (its published long-context recipe: factor 4 over 32,768): the generated module passes
    the scaling to torchtitan's RoPE.Config (scaling='yarn', rope_factor, original_seq_len), and torchtitan itself
    builds it (planner.export.judges)."""
    pytest.importorskip("torchtitan.config")
    from planner.export.judges import judge

    spec = _with_rope_scaling("qwen3-8b", {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    request = api.build_request(model=spec, topology="dgx-h100", gpus=16, global_batch_size=64, seq_len=4096,
                                framework="torchtitan")
    plan = api.estimate(request, Configuration(parallelism=Parallelism(dp=4, tp=2, pp=2, sp=True, zero_stage=3),
                                               schedule="1f1b"))
    export = export_plan(plan, "torchtitan")
    assert "ROPE_SCALING = {'scaling': 'yarn', 'rope_factor': 4.0, 'original_seq_len': 32768}" in export.text
    assert "theta=THETA, **ROPE_SCALING)" in export.text
    verdict = judge(plan, export)
    assert verdict.accepted, verdict.reason


def test_rope_scaling_torchtitan_lacks_is_refused():
    spec = _with_rope_scaling("qwen3-8b", {"rope_type": "linear", "factor": 2.0})
    with pytest.raises(BadInputError, match="RoPE scaling 'linear'"):
        model_choice(spec)
