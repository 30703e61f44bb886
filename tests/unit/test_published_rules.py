"""The conversion rules of benchmarks/published_runs.py for what sources say badly, each on a run shaped as
validation/published_runs.json rows are: negated precision, precision implied by throughput, GPU variants by stated
memory, peak and power, and a sequence length from the named model's own default."""

import copy
import dataclasses
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import published_runs as P  # noqa: E402

from planner.topology import load_topology  # noqa: E402

BASE = {
    "id": "synthetic", "source": {"title": "A source (2024)", "url": ""},
    "model": {"family": "Llama 3", "params_b": 8, "num_layers": 32, "hidden": 4096, "ffn_hidden": 14336,
              "num_heads": 32, "num_kv_heads": 8, "vocab": 128256, "seq_len": 8192, "activation": "SwiGLU"},
    "hardware": {"gpu_model": "NVIDIA H100 80GB", "gpu_memory_gib": 80, "gpus_per_node": 8},
    "training": {"framework": "torchtitan", "precision": "bf16", "micro_batch": 1, "global_batch_seqs": 64},
    "parallel": {"num_gpus": 64, "dp": 64, "tp": 1, "pp": 1},
    "results": {"tokens_per_s_per_gpu": 5000},
}


def run(**changes) -> dict:
    r = copy.deepcopy(BASE)
    for path, value in changes.items():
        section, key = path.split("__")
        r[section][key] = value
    return r


@pytest.mark.parametrize("text", ["BF16; not trained in FP8", "bf16 (no FP8)", "BF16 without FP8 GEMMs", "non-FP8 bf16"])
def test_negated_fp8_is_not_fp8(text):
    assert P.precision_of(run(training__precision=text)) == "bf16"


def test_stated_fp8_is_fp8():
    assert P.precision_of(run(training__precision="FP8 (E4M3) GEMMs")) == "fp8"


def test_throughput_above_the_bf16_peak_implies_fp8_when_no_precision_is_named():
    """6 x 8.0e9 active parameters x 25000 tokens/s = 1204 TFLOP/s per GPU > 989: no bf16 run computes that."""
    fast = run(training__precision=None, results__tokens_per_s_per_gpu=25000)
    assert P.implied_tflops(fast) > 989 and P.precision_of(fast) == "fp8"
    assert P.precision_of(run(training__precision=None)) == "bf16"  # 241 TFLOP/s: bf16
    assert P.precision_of(run(training__precision="BF16", results__tokens_per_s_per_gpu=25000)) == "bf16"  # named


def test_gpu_variant_takes_its_stated_memory_and_peak():
    device = P.device_of(run(hardware__gpu_model="NVIDIA H100 96GB", hardware__gpu_memory_gib=96))
    assert device.memory_bytes == 96 * 2**30 and device.peak_bf16_tflops == 989.0
    h20 = run(hardware__gpu_model="NVIDIA H20", hardware__gpu_memory_gib=96, hardware__peak_tflops_bf16_fp16_dense=148)
    assert P.topology_preset(h20) == "dgx-h100" and P.skip_reason(h20) is None
    assert P.device_of(h20).peak_bf16_tflops == 148.0 and P.device_of(h20).peak_fp8_tflops == pytest.approx(296, rel=0.01)
    assert P.topology(h20).device.peak_bf16_tflops == 148.0
    assert P.device_of(run()) == load_topology("dgx-h100").device  # as stated = the preset: unchanged


def test_gpu_variants_without_a_peak_are_refused_with_a_reason():
    capped = run(hardware__gpu_model="NVIDIA H100 SXM (500 W)")
    assert "500 W" in P.skip_reason(capped)
    assert "H20" in P.skip_reason(run(hardware__gpu_model="NVIDIA H20", hardware__gpu_memory_gib=96))
    assert P.topology_preset(run(hardware__gpu_model="NVIDIA H200")) == "hgx-h200"  # 'h20' does not match H200


def test_missing_sequence_length_is_the_named_models_default():
    """Llama 3 8B names planner/models/presets/llama3-8b.yaml, whose seq_len is its max_position_embeddings."""
    unsaid = run(model__seq_len=None)
    assert P.seq_len_of(unsaid) == 8192 and P.model_spec(unsaid).seq_len == 8192
    nobody = run(model__seq_len=None, model__family="Unknown LM", model__params_b=3)
    assert P.seq_len_of(nobody) is None and "sequence length" in P.skip_reason(nobody)


def test_deepspeed_sources_of_2021_run_the_legacy_profile():
    old = run(training__framework="DeepSpeed ZeRO-3")
    old["source"]["url"] = "https://arxiv.org/abs/2104.04473"
    assert P.stack_of(old) == "deepspeed" and P.profile_of(old, "deepspeed") == "legacy/deepspeed-2021"
    assert P.profile_of(run(training__framework="DeepSpeed"), "deepspeed") == "deepspeed"


# Llama-2 70B shaped (69B parameters): torchtitan's llama3_70b.toml recipe (full) is the nearest, not llama3_8b.toml
LLAMA_70B = dict(model__num_layers=80, model__hidden=8192, model__ffn_hidden=28672, model__num_heads=64,
                 model__params_b=70, model__seq_len=4096)


def test_unsaid_recompute_is_the_torchtitan_recipe_of_that_size():
    """torchtitan train configs (v0.2.2): llama3_8b.toml mode selective, llama3_70b.toml mode full."""
    assert P.recipe_recompute(run(), "torchtitan").recompute == "selective"
    assert P.recipe_recompute(run(**LLAMA_70B), "torchtitan").recompute == "full"
    assert P.settings(run(**LLAMA_70B), "torchtitan").choices["recompute"] == ("full",)
    assert P.settings(run(), "torchtitan").choices["recompute"] == ("selective", "full")  # full where it does not fit


def test_unsaid_recompute_recipes_of_other_stacks():
    """Megatron-Core examples and NeMo's H100 performance configs: none; llm-foundry mpt-1b.yaml none, mpt-7b.yaml
    full; Megatron-LM v2.5 pretrain_gpt3_175B.sh full; a stack recording no recipe keeps the planner's choice."""
    assert P.recipe_recompute(run(**LLAMA_70B), "megatron-core").recompute == "none"
    assert P.recipe_recompute(run(), "pytorch-fsdp").recompute == "full"
    small = run(model__num_layers=24, model__hidden=2048, model__ffn_hidden=8192, model__num_heads=16,
                model__num_kv_heads=16, model__vocab=50368, model__params_b=1.3)
    assert P.recipe_recompute(small, "pytorch-fsdp").recompute == "none"
    assert P.recipe_recompute(run(), "megatron-lm").recompute == "full"
    assert P.recipe_recompute(run(), "deepspeed") is None
    assert P.settings(run(), "deepspeed").choices["recompute"] == ("none", "full")


def test_a_stated_recompute_wins_and_the_rule_can_be_switched_off():
    stated = run(training__recompute="none activation checkpointing", **LLAMA_70B)
    assert "recompute" not in P.settings(stated, "torchtitan").choices
    assert P.settings(stated, "torchtitan").fixed["recompute"] == "none"
    off = P.settings(run(**LLAMA_70B), "torchtitan", ("recompute_unstated_is_recipe",))
    assert off.choices["recompute"] == ("none", "full")


def test_unsaid_recompute_of_an_moe_model_reads_the_moe_recipes():
    """torchtitan deepseek_v3_16b.toml (selective op) is the nearest MoE recipe of a 16B MoE model, whatever the
    dense recipes say."""
    moe = run(model__moe={"num_experts": 64, "top_k": 6, "expert_ffn_hidden": 1408, "shared_experts": 2},
              model__num_layers=27, model__hidden=2048, model__num_heads=16, model__num_kv_heads=16,
              model__ffn_hidden=None, model__params_b=16)
    assert P.recipe_recompute(moe, "torchtitan").recompute == "selective"


def test_torchtitan_selective_layer_is_every_other_layer_fully_recomputed():
    """torchtitan config_manager.py at 613bfd0: selective_ac_option default "2" ("checkpoint every other layer")."""
    layer = run(training__recompute="selective layer activation checkpointing")
    s = P.settings(layer, "torchtitan")
    assert s.fixed["recompute"] == "none" and s.full_every == 2
    op = P.settings(run(training__recompute="selective op activation checkpointing"), "torchtitan")
    assert op.fixed["recompute"] == "selective" and op.full_every is None
    off = P.settings(layer, "torchtitan", ("selective_layer_is_every_other_layer",))
    assert off.fixed["recompute"] == "selective" and off.full_every is None
    assert P.settings(layer, "megatron-core").full_every is None  # a torchtitan option only


def test_every_other_layer_costs_half_a_full_recompute():
    """accuracy.evaluate: 16 of 32 layers fully recomputed: the recompute time is half the full recompute's."""
    import accuracy as A

    case = A.build_case(run(training__recompute="selective layer activation checkpointing"))
    model = A.cost_model(case, None)
    cand = case.candidates[0]
    none, half = model.evaluate(cand), A.evaluate(model, case, cand)
    full = model.evaluate(dataclasses.replace(cand, recompute="full"))
    assert half.step_time_s - none.step_time_s == pytest.approx((full.step_time_s - none.step_time_s) / 2, rel=0.05)


def test_an_unnamed_cp_flavour_is_the_stacks_default():
    """Megatron-Core's --cp-comm-type defaults to ['p2p'] (arguments.py); torchtitan 0.3 runs torch's all-gather."""
    long = run(parallel__cp=4, parallel__dp=16)
    assert P.cp_flavour_of(long, "megatron-core") == ("p2p",)
    assert P.cp_flavour_of(long, "torchtitan") == ("allgather",)
    assert P.cp_flavour_of(run(), "megatron-core") is None
    assert P.cp_flavour_of(long, "megatron-core", ("cp_flavour_unstated_is_default",)) is None
    import accuracy as A

    assert A.build_case(run(parallel__cp=4, parallel__dp=16, training__framework="Megatron-Core")).overrides == \
        {"cp_flavours": ("p2p",)}


def test_moe_fields_under_their_usual_spellings():
    """A run's MoE block: capacity factor (else dropless), MoE every n-th layer, the shared expert's own width, and
    group-limited routing only where the source gives both the groups and how many a token may use."""
    moe = {"num_experts": 64, "top_k": 8, "expert_ffn_hidden": 2560, "shared_expert_intermediate_size": 20480,
           "moe_capacity_factor": 1.25, "moe_layer_freq": 2, "n_group": 8, "topk_group": 4}
    spec = P.model_spec(run(model__moe=moe))
    assert (spec.moe.capacity_factor, spec.moe.moe_every, spec.moe.shared_expert_ffn_hidden_size) == (1.25, 2, 20480)
    assert spec.moe.num_shared_experts == 1 and (spec.moe.num_groups, spec.moe.group_topk) == (8, 4)
    plain = P.model_spec(run(model__moe={"num_routed_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336,
                                         "node_limited_routing_max_nodes": 4, "capacity_factor": 0}))
    assert plain.moe.capacity_factor is None and plain.moe.num_groups is None and plain.moe.moe_every == 1


def test_nemo_runs_are_priced_as_nemo_performance_recipe():
    """NeMo's performance recipe (16-bit gradient buffers for every precision, fp8 parameters gathered in fp8 under
    fp8: NeMo scripts/performance/helpers.py, recipes/precision/mixed_precision.py) for a run whose framework names
    NeMo; the profile's own recipe for other stacks and with the rule switched off. Priced so, NeMo's own
    recommended Llama 3 8B layout on 8 H100 (TP1 PP1 CP2, seq 8192) fits in bf16 and in fp8; the generic recipes
    (fp32 gradient buffers; under fp8 bf16 weights plus an fp8 copy) do not."""
    import accuracy_cases as C

    for text, precision in (("FP8 (delayed scaling)", "fp8"), ("BF16", "bf16")):
        nemo = run(training__framework="NeMo 25.04 (Megatron-Core)", training__precision=text,
                   parallel__dp=4, parallel__cp=2, parallel__num_gpus=8, training__global_batch_seqs=128,
                   training__recompute="none", training__zero_stage=1)
        assert P.stack_of(nemo) == "megatron-core" and P.precision_of(nemo) == precision
        assert P.recipe_bytes_of(nemo, precision) == P.NEMO_RECIPE_BYTES[precision]
        assert P.recipe_bytes_of(nemo, precision, off=("nemo_performance_recipe",)) is None
        shipped, generic = C.build_case(nemo), C.build_case(nemo, off=("nemo_performance_recipe",))
        assert shipped.overrides["recipe_bytes"] == P.NEMO_RECIPE_BYTES[precision]
        assert "recipe_bytes" not in generic.overrides
        assert [C.choose(case)[1].fits for case in (shipped, generic)] == [True, False], precision
    assert P.recipe_bytes_of(run(training__framework="Megatron-Core"), "fp8") is None


def test_v100_runs_are_expressed_on_the_dgx2_node():
    """A V100 run (Megatron-LM 2019, ZeRO and Turing-NLG trained on DGX-2 nodes) converts to the DGX-2 preset (16
    GPUs per node, 32 GB, 125 TFLOP/s fp16) instead of being skipped; a stated 8 GPUs per node is kept."""
    v100 = run(hardware__gpu_model="NVIDIA Tesla V100 SXM3 32GB", hardware__gpu_memory_gib=32,
               hardware__gpus_per_node=None, parallel__num_gpus=512, parallel__dp=512)
    assert P.topology_preset(v100) == "dgx2-v100" and P.skip_reason(v100) is None
    topo = P.topology(v100)
    assert (topo.gpus_per_node, topo.num_nodes, topo.device.peak_bf16_tflops) == (16, 32, 125.0)
    dgx1 = run(hardware__gpu_model="V100 32GB", hardware__gpus_per_node=8, parallel__num_gpus=64, parallel__dp=64)
    assert (P.topology(dgx1).gpus_per_node, P.topology(dgx1).num_nodes) == (8, 8)
    assert P.topology(dgx1).inter_node.nics_per_node == 4  # the DGX-2's one NIC per two GPUs, on 8 GPUs
    gh200 = run(hardware__gpu_model="NVIDIA GH200 H100 96GB", hardware__gpu_memory_gib=96, hardware__gpus_per_node=4)
    assert (P.topology(gh200).gpus_per_node, P.topology(gh200).inter_node.nics_per_node) == (4, 4)


def test_efa_interconnect_runs_on_the_aws_preset():
    """A run whose interconnect is AWS EFA runs on the AWS node of its GPU (p4d: 4 x 100 Gb/s EFA per node), not
    the DGX's 8 InfiniBand NICs; the stated memory still picks the 40 or 80 GB part (device_of)."""
    aws = run(hardware__gpu_model="NVIDIA A100 40GB", hardware__gpu_memory_gib=40,
              hardware__inter_node="AWS EFA, 400 Gbps per p4d instance")
    assert P.topology_preset(aws) == "aws-p4d"
    assert P.topology(aws).inter_node.kind == "efa" and P.topology(aws).inter_node.nics_per_node == 4
    assert P.topology_preset(run(hardware__inter_node="InfiniBand NDR")) == "dgx-h100"
    assert P.topology_preset(run(hardware__inter_node="EFA")) == "aws-p5"


@pytest.mark.parametrize("text, stack", [("OLMo trainer (PyTorch FSDP)", "pytorch-fsdp"), ("Lightning Fabric, FSDP", "pytorch-fsdp"),
                                         ("NeMo 24.07", "megatron-core"), ("Megatron-DeepSpeed", "deepspeed")])
def test_stack_named_by_the_framework_text(text, stack):
    assert P.stack_of(run(training__framework=text)) == stack


@pytest.mark.parametrize("text, compiled", [("torchtitan (torch.compile, FSDP2)", True), ("torchtitan, compiled", True),
                                            ("torchtitan, no torch.compile", False), ("torchtitan (compile: false)", False),
                                            ("torchtitan (early 2024)", False)])
def test_a_run_that_compiled_runs_its_pointwise_ops_fused(text, compiled):
    """torch.compile's inductor fuses norms, activations and RoPE: a run whose text says it compiled drops the
    profile's eager ops (torchtitan's eager SwiGLU and complex RoPE); unsaid or negated, the profile's."""
    import accuracy_cases as C

    r = run(training__framework=text)
    assert (P.eager_ops_of(r) == ()) is compiled and (P.eager_ops_of(r) is None) is (not compiled)
    assert P.eager_ops_of(r, off=("compiled_runs_fuse_pointwise_ops",)) is None
    assert ("eager_ops" in C.build_case(r).overrides) is compiled


@pytest.mark.parametrize("changes, depth", [
    ({"model__family": "DeepSeek-V3 (MLA + DeepSeekMoE, MTP depth 1)"}, 1),
    ({"model__family": "a MoE trained with 2 MTP modules"}, 2),
    ({"model__family": "multi-token prediction (depth 2)"}, 2),
    ({"model__mtp_num_layers": 1}, 1),
    ({"model__num_nextn_predict_layers": 3}, 3),
    ({"training__notes": "--mtp-num-layers 1, fp8"}, 1),
    ({"model__family": "DeepSeek-V3, trained without MTP"}, 0),
    ({"model__family": "DeepSeek-V3 (MTP disabled)"}, 0),
    ({"model__family": "DeepSeek-V3 with MTP"}, 0),  # no depth stated: none
    ({}, 0),
])
def test_mtp_depth_where_the_source_states_it(changes, depth):
    r = run(**changes)
    assert P.mtp_of(r) == depth and P.model_spec(r).mtp_num_layers == depth
    assert P.model_spec(r, off=("mtp_depth_stated",)).mtp_num_layers == 0


def test_a_nemo_run_of_deepseek_v3_trains_its_recipes_mtp_layer():
    nemo = run(model__family="DeepSeek-V3 671B", model__num_layers=61, training__framework="NeMo 25.09")
    assert P.mtp_of(nemo) == 1 and P.mtp_of(nemo, off=("nemo_performance_recipe",)) == 0
    assert P.mtp_of(run(model__family="DeepSeek-V3 671B", model__num_layers=61, training__framework="Megatron-Core")) == 0
    assert P.mtp_of(run(model__family="DeepSeek-V3 671B, without MTP", model__num_layers=61,
                        training__framework="NeMo")) == 0  # the source's word wins


@pytest.mark.parametrize("text, stack, modules", [
    ("selective: recompute_modules mla_up_proj, mlp, moe", "megatron-core", ("mla_up_proj", "mlp", "moe")),
    ("mla_up_proj/mlp/moe", "megatron-core", ("mla_up_proj", "mlp", "moe")),
    ("recompute-modules core_attn moe_act", "megatron-core", ("core_attn", "moe_act")),
    ("selective (moe layers only)", "megatron-core", ()),  # no module name Megatron spells: the stack's selective
    ("recompute RMSNorm and MLA up-projections", "hai-llm", ()),
    ("recompute_modules mlp", "torchtitan", ()),  # torchtitan's selective takes no Megatron modules
])
def test_recompute_modules_named_in_the_text(text, stack, modules):
    r = run(training__recompute=text)
    assert P.recompute_modules_of(r, stack) == modules
    fixed = P.settings(r, stack).fixed
    if modules:
        assert fixed["recompute"] == "selective" and fixed["recompute_modules"] == modules
    else:
        assert "recompute_modules" not in fixed
    assert P.recompute_modules_of(r, stack, ("recompute_modules_named",)) == ()


def _dsv3(gpu: str, gib: int) -> dict:
    return run(model__family="DeepSeek-V3 671B", model__num_layers=61, model__hidden=7168, model__num_heads=128,
               model__num_kv_heads=128, model__vocab=129280, model__ffn_hidden=18432, model__params_b=671,
               model__moe={"num_routed_experts": 256, "top_k": 8, "expert_ffn_hidden": 2048, "shared_experts": 1,
                           "dense_layers_first": 3},
               model__mla={"kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                           "v_head_dim": 128},
               hardware__gpu_model=gpu, hardware__gpu_memory_gib=gib, training__framework="NeMo")


def test_unsaid_recompute_of_deepseek_v3_is_nemos_recipe_for_the_device():
    """NeMo's per-GPU configuration files (megatron-core.yaml recompute_recipes): DeepSeek-V3 recomputes
    mla_up_proj/mlp/moe on H100 80 GB, nothing on B200; the other MoE models of those files nothing."""
    h100 = P.recipe_recompute(_dsv3("NVIDIA H100 80GB", 80), "megatron-core")
    assert (h100.recompute, h100.modules) == ("selective", ("mla_up_proj", "mlp", "moe"))
    settings = P.settings(_dsv3("NVIDIA H100 80GB", 80), "megatron-core")
    assert settings.choices["recompute"] == ("selective", "full")
    assert settings.fixed["recompute_modules"] == ("mla_up_proj", "mlp", "moe")
    assert P.recipe_recompute(_dsv3("NVIDIA B200", 180), "megatron-core").recompute == "none"
    qwen = run(model__moe={"num_experts": 128, "top_k": 8, "expert_ffn_hidden": 1536}, model__num_layers=94,
               model__params_b=235)
    assert P.recipe_recompute(qwen, "megatron-core").recompute == "none"


def test_unstated_expert_parallelism_of_an_moe_run_is_chosen_among_what_its_experts_allow():
    """ep unsaid: the planner's choice among the divisors of the routed experts that divide dp*cp (1 among them,
    the stacks' default); stated: fixed; a dense model: 1, no choice."""
    moe = run(model__moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336})
    assert P.settings(moe, "megatron-core").choices["ep"] == (1, 2, 4, 8)
    assert "ep" not in P.settings(moe, "megatron-core", ("ep_unstated_is_chosen",)).choices
    stated = run(model__moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336}, parallel__ep=4)
    assert "ep" not in P.settings(stated, "megatron-core").choices and P.settings(stated, "megatron-core").fixed["ep"] == 4
    assert "ep" not in P.settings(run(), "megatron-core").choices
    narrow = run(model__moe={"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336}, parallel__dp=6, parallel__num_gpus=6)
    assert P.settings(narrow, "megatron-core").choices["ep"] == (1, 2)


MIXTRAL_MODEL = {"family": "Mixtral 8x7B", "type": "moe", "params_b": 46.7, "num_layers": 32, "hidden": 4096,
                 "ffn_hidden": 14336, "num_heads": 32, "num_kv_heads": 8, "vocab": 32000, "seq_len": 4096,
                 "activation": "SwiGLU", "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden": 14336}}


def _moe_run(framework: str, title: str = "A source (2025)", **changes) -> dict:
    return run(model__family="x", source__title=title, training__framework=framework, **changes) | {
        "model": dict(MIXTRAL_MODEL)}


@pytest.mark.parametrize("framework,title,expected", [
    # unsaid, a 2025 source: what megatron-core's profile runs (no narrowing)
    ("Megatron-Core", "A source (2025)", {}),
    # a 2024 source predates the shared-expert overlap (core_v0.10.0), DeepEP (0.12.0) and the EP overlap (0.14.0)
    ("Megatron-Core", "A source (2024)", {"moe_dispatchers": ("alltoall", "allgather"), "moe_overlap": False,
                                          "moe_shared_overlap": False}),
    # a stated release: r0.12 has DeepEP and the shared-expert overlap, not the EP overlap
    ("Megatron-Core r0.12.0", "A source (2025)", {"moe_overlap": False}),
    ("Megatron-Core 0.15 with --moe-token-dispatcher-type alltoall", "A source (2025)", {"moe_dispatchers": ("alltoall",)}),
    ("NeMo with DeepEP and --overlap-moe-expert-parallel-comm", "A source (2025)",
     {"moe_dispatchers": ("flex",), "moe_shared_overlap": False}),
    ("Megatron-Core 0.16, no DeepEP, --moe-shared-expert-overlap", "A source (2026)",
     {"moe_dispatchers": ("alltoall",), "moe_overlap": False}),
    # a flag set off after its name, as a recipe writes it (Megatron-Bridge qwen3_moe.py: moe_a2a_overlap = False)
    ("Megatron-Bridge: moe_a2a_overlap false", "A source (2026)", {"moe_overlap": False}),
    ("Megatron-Core 0.16 --overlap-moe-expert-parallel-comm=False", "A source (2026)", {"moe_overlap": False}),
    ("Megatron-Bridge: moe_a2a_overlap: true", "A source (2026)",
     {"moe_dispatchers": ("alltoall", "flex"), "moe_shared_overlap": False}),
    # a stack without these settings is not narrowed by text naming them
    ("torchtitan with DeepEP", "A source (2025)", {}),
])
def test_an_moe_runs_dispatcher_and_overlap_as_its_release_and_text_say(framework, title, expected):
    r = _moe_run(framework, title)
    assert P.moe_overrides_of(r, P.stack_of(r), "bf16") == expected
    assert P.moe_overrides_of(r, P.stack_of(r), "bf16", ("moe_settings_stated", "megatron_core_version_features")) == {}


def test_a_dense_run_is_not_narrowed():
    assert P.moe_overrides_of(run(training__framework="Megatron-Core r0.8.0"), "megatron-core", "bf16") == {}


def _evaluated(run_id: str, off: tuple[str, ...] = ()) -> dict:
    import accuracy_cases as C

    r = next(x for x in C.read_runs(C.RUNS_FILE) if x["id"] == run_id)
    return C.evaluate_case(C.build_case(r, off=off))


def test_an_unsaid_uneven_split_is_the_planners_split():
    """DeepSeek-V3's 61 layers and 1 MTP layer do not divide over pp 16: the source ran some uneven split and does not
    say which, so the reading is the planner's (the stage-partition DP). Like Megatron-Bridge's DeepSeek-V3 recipes
    (perf_recipes/deepseek/*/deepseek_v3.py layouts "Et*4|(tttt|)*14tmL", "Et|(tt|)*30mL"), the last stage, which
    holds the MTP layer, the LM head twice and the loss, gets fewer decoder layers than the middle ones."""
    planned = _evaluated("deepseekv3_production_2048xH800")
    balanced = _evaluated("deepseekv3_production_2048xH800", off=("split_unstated_is_planned",))
    assert balanced["split"] == (3,) + (4,) * 14 + (2,) and not balanced["planned"]
    assert sum(planned["split"]) == 61 and planned["split"][-1] < 4 and planned["planned"]
    assert planned["fits"] and planned["predicted_s"] < 0.9 * balanced["predicted_s"]


def test_an_unsaid_even_split_stays_even():
    """80 layers over pp 8 divide evenly: every stack's default split (Megatron-LM get_num_layers: num_layers // pp)."""
    row = _evaluated("megatron2021_t1_145.6B")
    stages = row["cand"].pp * row["cand"].vpp
    assert row["split"] == (80 // stages,) * stages and not row["planned"]


@pytest.mark.parametrize("framework", ["Megatron-Bridge (NeMo 26.04 container)", "Megatron Bridge 0.4", "megatron-bridge"])
def test_megatron_bridge_runs_are_nemo_performance_recipe_on_megatron_core(framework):
    """Megatron-Bridge is NeMo's Megatron-Core trainer and its perf recipes are NeMo's (perf_recipes/_common.py
    `_perf_precision`: grad_reduce_in_fp32 False; mixed_precision.py bf16_with_fp8_*: fp8_param_gather True)."""
    bridge = run(training__framework=framework, training__precision="FP8")
    assert P.stack_of(bridge) == "megatron-core"
    assert P.recipe_bytes_of(bridge, "fp8") == P.NEMO_RECIPE_BYTES["fp8"]
    assert P.recipe_bytes_of(bridge, "fp8", off=("nemo_performance_recipe",)) is None


QWEN3_30B = {"family": "Qwen3 30B-A3B", "params_b": 30.5, "num_layers": 48, "hidden": 2048, "ffn_hidden": None,
             "num_heads": 32, "num_kv_heads": 4, "vocab": 151936, "seq_len": 4096, "activation": "SwiGLU",
             "moe": {"num_experts": 128, "top_k": 8, "expert_ffn_hidden": 768}}


def test_a_stated_head_width_is_read_even_where_hidden_divides_by_heads():
    """Qwen3-30B-A3B: hidden 2048 over 32 heads is 64, its heads are 128 wide (config.json head_dim)."""
    stated = P.model_spec(run(model__family="some MoE", model__num_layers=48, model__hidden=2048, model__num_heads=32,
                              model__head_dim=128))
    assert stated.head_dim == 128
    assert P.model_spec(run(model__kv_channels=64, model__num_heads=32)).head_dim == 64  # Megatron's --kv-channels


def test_a_named_models_attention_is_its_presets():
    """Rule named_model_architecture: the preset's head width and q/k norms for a run naming Qwen3-30B-A3B with the
    preset's shape; its sliding-window layers and sinks for gpt-oss-120b; nothing for a shape the preset does not
    have, or with the rule off."""
    qwen = copy.deepcopy(BASE)
    qwen["model"] = copy.deepcopy(QWEN3_30B)
    spec = P.model_spec(qwen)
    assert (spec.head_dim, spec.qk_norm) == (128, True)
    assert P.model_spec(qwen, off=("named_model_architecture",)).dim_per_head == 64  # hidden / heads
    other = copy.deepcopy(qwen)
    other["model"]["num_layers"] = 24
    assert P.model_spec(other).dim_per_head == 64
    oss = copy.deepcopy(BASE)
    oss["model"] = {"family": "GPT-OSS 120B", "params_b": 116.8, "num_layers": 36, "hidden": 2880, "num_heads": 64,
                    "num_kv_heads": 8, "vocab": 201088, "seq_len": 4096, "activation": "SwiGLU",
                    "moe": {"num_experts": 128, "top_k": 4, "expert_ffn_hidden": 2880}}
    spec = P.model_spec(oss)
    assert (spec.head_dim, spec.sliding_window, spec.attention_sinks) == (64, 128, True)
    assert spec.layer_types[:2] == ("sliding", "full") and len(spec.layer_types) == 36
    assert P.model_spec(oss, off=("named_model_architecture",)).dim_per_head == 45  # 2880 / 64: the generic reading


def test_megatron_bridge_h100_rows_convert_and_fit():
    """benchmarks/bridge_h100_check.py: every DGX-H100 row of Megatron-Bridge's performance summary converts to a
    valid candidate at its published layout and fits (each ran), priced with NeMo's performance recipe (16-bit
    gradient buffers; fp8 parameters under fp8) and with what its recipe states about the MoE overlap."""
    import accuracy_cases as C
    import bridge_h100_check as B

    for row in B.ROWS:
        run_ = B.run_of(row)
        cand, ev = C.choose(C.build_case(run_))
        assert cand is not None and ev.fits, run_["id"]
        assert (cand.tp, cand.pp, cand.cp, cand.ep) == (run_["parallel"]["tp"], run_["parallel"]["pp"],
                                                       run_["parallel"]["cp"], run_["parallel"]["ep"])
        assert C.build_case(run_).overrides["recipe_bytes"] == P.NEMO_RECIPE_BYTES[P.precision_of(run_)]
    qwen = C.build_case(B.run_of(next(row for row in B.ROWS if "qwen3_30b" in row[0])))
    assert qwen.overrides["moe_overlap"] is False  # qwen3_moe.py fp8cs: moe_a2a_overlap = False
    # read as generic Megatron-Core (fp32 gradient buffers, bf16 weights beside their fp8 copies) Llama 3.1 405B at
    # its published TP8 PP8 CP2 VP8 would be a false OOM
    llama405 = B.run_of(next(row for row in B.ROWS if "405b" in row[0]))
    assert not C.choose(C.build_case(llama405, off=("nemo_performance_recipe",)))[1].fits
