"""Exporters: each output parses, carries the plan's degrees, satisfies the target framework's own rules
(checked here by an independent re-implementation of those rules), and refused cases say why."""

from __future__ import annotations

import argparse
import json
import shlex
import tomllib

import pytest

from planner.errors import BadInputError
from planner.export import TARGETS, export_plan
from planner.export.megatron import megatron_arguments
from planner.schemas.model import ModelSpec, MoESpec
from planner.schemas.plan import (
    Batch,
    Breakdown,
    LaunchPlan,
    MemoryReport,
    Parallelism,
    PlanRequest,
    Prediction,
    Recompute,
    Stage,
    StageMemory,
)
from planner.schemas.topology import DeviceSpec, InterNodeFabric, IntraNodeFabric, Topology
from planner.topology.placement import rank_map
from planner.units import GiB

LLAMA = dict(name="llama-ish", num_layers=32, hidden_size=4096, ffn_hidden_size=14336, num_attention_heads=32,
             num_kv_heads=8, vocab_size=128256, seq_len=8192, activation="swiglu", norm="rmsnorm")


def topology(nodes: int) -> Topology:
    return Topology(
        name="dgx-h100", device=DeviceSpec(name="H100", memory_bytes=80 * GiB, peak_bf16_tflops=989, peak_fp32_tflops=67, hbm_bandwidth_GBps=3350),
        gpus_per_node=8, num_nodes=nodes, intra_node=IntraNodeFabric(kind="nvswitch", bandwidth_GBps=360, latency_s=3e-6),
        inter_node=InterNodeFabric(kind="infiniband", nics_per_node=8, nic_bandwidth_GBps=45, latency_s=5e-6),
    )


def make_plan(*, dp=2, tp=4, pp=2, vpp=1, cp=1, ep=1, sp=True, zero=1, schedule="1f1b", mbs=1, gbs=64, seq_len=8192,
              counts=None, recompute="none", full_layers=None, spec=None, precision="bf16") -> LaunchPlan:
    """A hand-built LaunchPlan (stages as executor FQNs, ranks in torchrun order) for exporter tests."""
    model = spec or ModelSpec(**LLAMA)
    world = dp * tp * pp * cp
    stages_n = pp * vpp
    counts = counts or [model.num_layers // stages_n] * stages_n
    stages, start = [], 0
    for index, count in enumerate(counts):
        names = (["tok_embeddings"] if index == 0 else []) + [f"layers.{i}" for i in range(start, start + count)]
        names += ["norm", "output"] if index == stages_n - 1 else []
        start += count
        full = full_layers[index] if full_layers else 0
        stages.append(Stage(stage=index, layers=tuple(names), recompute=Recompute(mode=recompute, full_layers=full)))
    topo = topology(-(-world // 8))
    ranks = tuple(rank_map(topo, {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": ep}))
    request = PlanRequest(model=model, topology=topo, gpus=world, global_batch_size=gbs, seq_len=seq_len, precision=precision)
    memory = StageMemory(stage=0, params_bytes=1, grads_bytes=1, optimizer_bytes=1, activations_bytes=1, other_bytes=1, peak_bytes=5)
    return LaunchPlan(
        kind="estimate", request=request,
        parallelism=Parallelism(dp=dp, tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, sp=sp, zero_stage=zero),
        batch=Batch(global_batch_size=gbs, microbatch_size=mbs, num_microbatches=gbs // (mbs * dp), seq_len=seq_len),
        schedule=schedule, stages=tuple(stages), ranks=ranks,
        prediction=Prediction(step_time_s=1.0, tokens_per_s=1.0, model_tflops_per_gpu=1.0, hardware_tflops_per_gpu=1.0, mfu=0.4, hfu=0.5, breakdown=Breakdown()),
        memory=MemoryReport(peak_bytes=5, capacity_bytes=80 * GiB, fits=True, per_stage=(memory,)),
    )


# ---- torchtitan -------------------------------------------------------------------------------------------

def test_torchtitan_toml_parses_and_carries_degrees():
    plan = make_plan(dp=2, tp=4, pp=2, vpp=2, schedule="interleaved", zero=3, counts=[9, 7, 8, 8], mbs=2, gbs=64)
    doc = tomllib.loads(export_plan(plan, "torchtitan").text)
    par = doc["parallelism"]
    assert par["tensor_parallel_degree"] == 4 and par["pipeline_parallel_degree"] == 2
    assert par["data_parallel_shard_degree"] == 2 and par["data_parallel_replicate_degree"] == 1
    assert par["pipeline_parallel_schedule"] == "Interleaved1F1B"
    parts = par["module_fqns_per_model_part"]
    assert [len(p) for p in parts] == [10, 7, 8, 10] and parts[0][0] == "tok_embeddings" and parts[-1][-2:] == ["norm", "output"]
    assert parts == [list(stage.layers) for stage in plan.stages]
    world = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"] * par["tensor_parallel_degree"] * par["pipeline_parallel_degree"] * par["context_parallel_degree"]
    assert world == plan.request.gpus
    train = doc["training"]
    dp = par["data_parallel_replicate_degree"] * par["data_parallel_shard_degree"]
    assert train["global_batch_size"] == 64 and train["local_batch_size"] * dp == 64 and train["seq_len"] == 8192
    assert train["local_batch_size"] % par["pipeline_parallel_microbatch_size"] == 0


def test_torchtitan_ddp_gradient_accumulation_and_recompute():
    plan = make_plan(dp=8, tp=1, pp=1, zero=0, gbs=64, mbs=2, recompute="full")
    doc = tomllib.loads(export_plan(plan, "torchtitan").text)
    assert doc["parallelism"]["data_parallel_replicate_degree"] == 8 and doc["parallelism"]["data_parallel_shard_degree"] == 1
    assert "module_fqns_per_model_part" not in doc["parallelism"]
    assert doc["training"]["global_batch_size"] // (doc["training"]["local_batch_size"] * 8) == 4  # gradient accumulation
    assert doc["activation_checkpoint"]["mode"] == "full"


def test_torchtitan_partial_full_recompute_never_recomputes_less():
    plan = make_plan(counts=[16, 16], full_layers=[5, 3])
    result = export_plan(plan, "torchtitan")
    every = int(tomllib.loads(result.text)["activation_checkpoint"]["selective_ac_option"])
    assert all(16 // every >= f for f in (5, 3)) and any("every" in w for w in result.warnings)


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(schedule="2bw"), "not in torch.distributed.pipelining"),
        (dict(dp=4, ep=2, zero=0, spec=ModelSpec(**LLAMA, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))), "dp2ep"),
        (dict(recompute="selective", counts=[16, 16], full_layers=[2, 2]), "one activation-checkpoint policy"),
    ],
)
def test_torchtitan_refusals_say_why(kwargs, reason):
    with pytest.raises(BadInputError, match="cannot export to torchtitan: .*" + reason):
        export_plan(make_plan(**kwargs), "torchtitan")


# ---- Megatron-LM ------------------------------------------------------------------------------------------

def megatron_parser() -> argparse.ArgumentParser:
    """The subset of Megatron-LM's arguments we emit, spelled as megatron/training/arguments.py spells them."""
    p = argparse.ArgumentParser(allow_abbrev=False)
    for flag in ("tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size", "expert-model-parallel-size",
                 "micro-batch-size", "global-batch-size", "num-virtual-stages-per-pipeline-rank", "decoder-first-pipeline-num-layers",
                 "decoder-last-pipeline-num-layers", "recompute-num-layers", "num-layers", "hidden-size", "ffn-hidden-size",
                 "num-attention-heads", "seq-length", "max-position-embeddings", "vocab-size", "kv-channels", "num-query-groups",
                 "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size"):
        p.add_argument("--" + flag, type=int, default=None)
    for flag in ("pipeline-model-parallel-layout", "recompute-granularity", "recompute-method", "normalization", "position-embedding-type",
                 "data-parallel-sharding-strategy", "ckpt-format", "fp8-format", "moe-layer-freq", "moe-token-dispatcher-type"):
        p.add_argument("--" + flag, default=None)
    for flag in ("sequence-parallel", "use-distributed-optimizer", "use-megatron-fsdp", "bf16", "overlap-p2p-comm", "swiglu",
                 "group-query-attention", "untie-embeddings-and-output-weights", "disable-bias-linear", "moe-grouped-gemm"):
        p.add_argument("--" + flag, action="store_true")
    return p


def layers_per_virtual_stage(a, pp: int) -> list[int]:
    """Megatron's own reading of the split flags (layout string, first/last, or even)."""
    vpp = a.num_virtual_stages_per_pipeline_rank or 1
    if a.pipeline_model_parallel_layout:
        stages = a.pipeline_model_parallel_layout.split("|")
        expanded = [s.replace("E", "").replace("L", "") for s in stages]
        return [int(s.split("*")[1]) if "*" in s else len(s) for s in expanded]
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if first is None and last is None:
        assert a.num_layers % (pp * vpp) == 0, "Number of layers should be divisible by the pipeline-model-parallel size"
        return [a.num_layers // (pp * vpp)] * (pp * vpp)
    middle_stages = pp - (first is not None) - (last is not None)
    middle = a.num_layers - (first or 0) - (last or 0)
    assert middle % middle_stages == 0
    return [first if first is not None else middle // middle_stages] + [middle // middle_stages] * (pp - 2) + [last if last is not None else middle // middle_stages]


def assert_megatron_valid(args: list[str], world: int, num_microbatches_expected: int) -> argparse.Namespace:
    a = megatron_parser().parse_args(args)
    tp, pp, cp = a.tensor_model_parallel_size, a.pipeline_model_parallel_size, a.context_parallel_size or 1
    assert world % (tp * pp * cp) == 0
    dp = world // (tp * pp * cp)
    assert a.global_batch_size % (a.micro_batch_size * dp) == 0
    num_microbatches = a.global_batch_size // (a.micro_batch_size * dp)
    assert num_microbatches == num_microbatches_expected
    assert a.num_attention_heads % tp == 0 and (a.num_query_groups or a.num_attention_heads) % tp == 0
    if a.sequence_parallel:
        assert tp > 1
    if a.num_experts:
        assert a.num_experts % (a.expert_model_parallel_size or 1) == 0
        assert tp == 1 or a.sequence_parallel
    if a.num_virtual_stages_per_pipeline_rank or (a.pipeline_model_parallel_layout and a.pipeline_model_parallel_layout.count("|") + 1 > pp):
        assert pp > 2 or a.overlap_p2p_comm
        assert num_microbatches % pp == 0
    assert sum(layers_per_virtual_stage(a, pp)) == a.num_layers
    return a


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(dp=2, tp=4, pp=2),
        dict(dp=1, tp=2, pp=4, counts=[7, 9, 9, 7], gbs=32),
        dict(dp=2, tp=2, pp=2, vpp=2, schedule="interleaved", counts=[9, 7, 8, 8], gbs=32),
        dict(dp=2, tp=4, pp=4, vpp=2, schedule="interleaved", gbs=64, mbs=2),
        dict(dp=4, tp=2, pp=1, cp=2, zero=1, recompute="selective", gbs=64),
    ],
)
def test_megatron_arguments_satisfy_megatron_rules(kwargs):
    plan = make_plan(**kwargs)
    args, _ = megatron_arguments(plan)
    a = assert_megatron_valid(args, plan.request.gpus, plan.batch.num_microbatches)
    assert a.tensor_model_parallel_size == plan.parallelism.tp and a.pipeline_model_parallel_size == plan.parallelism.pp
    vstages = layers_per_virtual_stage(a, plan.parallelism.pp)
    assert vstages == [sum(name.startswith("layers.") for name in s.layers) for s in plan.stages]


def test_megatron_uneven_end_stages_use_first_last_flags():
    args, _ = megatron_arguments(make_plan(dp=1, tp=2, pp=4, counts=[7, 9, 9, 7], gbs=32))
    a = megatron_parser().parse_args(args)
    assert (a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers) == (7, 7) and a.pipeline_model_parallel_layout is None


def test_megatron_script_is_sourceable_text_and_moe_flags():
    spec = ModelSpec(**LLAMA, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024, first_k_dense=1))
    plan = make_plan(dp=4, tp=2, pp=1, ep=4, spec=spec, gbs=64, recompute="full")
    text = export_plan(plan, "megatron").text
    body = text.split("PLANNER_MEGATRON_ARGS=(")[1].split(")\n")[0]
    args = shlex.split(body)
    a = assert_megatron_valid(args, plan.request.gpus, plan.batch.num_microbatches)
    assert a.expert_model_parallel_size == 4 and a.num_experts == 8 and a.moe_layer_freq.startswith("[0,1,1")
    assert a.recompute_granularity == "full" and a.use_distributed_optimizer


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        (dict(schedule="zero-bubble"), "implements 1F1B and interleaved 1F1B pipelines only"),
        (dict(dp=2, tp=2, pp=4, vpp=2, schedule="interleaved", gbs=12, counts=[4] * 8), "not divisible by pipeline-model-parallel-size"),
        (dict(dp=4, tp=2, pp=1, sp=False, ep=2, spec=ModelSpec(**LLAMA, moe=MoESpec(num_experts=8, top_k=2, expert_ffn_hidden_size=1024))), "sequence parallelism must be used"),
        (dict(dp=4, tp=2, pp=1, cp=1, seq_len=8190), None),
        (dict(recompute="none", counts=[16, 16], full_layers=[2, 3]), "one number for every virtual stage"),
    ],
)
def test_megatron_refusals_say_why(kwargs, reason):
    if reason is None:  # an odd sequence length is fine without CP
        megatron_arguments(make_plan(**kwargs))
        return
    with pytest.raises(BadInputError, match="cannot export to megatron: .*" + reason):
        megatron_arguments(make_plan(**kwargs))


# ---- DeepSpeed --------------------------------------------------------------------------------------------

def test_deepspeed_batch_triple_and_zero():
    plan = make_plan(dp=4, tp=2, pp=1, zero=3, gbs=64, mbs=2)
    cfg = json.loads(export_plan(plan, "deepspeed").text)
    dp = plan.request.gpus // (plan.parallelism.tp * plan.parallelism.pp)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * dp == 64
    assert cfg["zero_optimization"]["stage"] == 3 and cfg["bf16"]["enabled"] is True


def test_deepspeed_refuses_zero2_with_pipeline():
    with pytest.raises(BadInputError, match="ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"):
        export_plan(make_plan(pp=2, zero=2), "deepspeed")
    cfg = json.loads(export_plan(make_plan(pp=2, zero=1), "deepspeed").text)
    assert cfg["zero_optimization"]["stage"] == 1


# ---- scripts and dispatch ---------------------------------------------------------------------------------

def test_torchrun_and_slurm_scripts_carry_world_layout():
    plan = make_plan(dp=2, tp=8, pp=2, zero=2)  # 32 GPUs on 4 nodes
    torchrun = export_plan(plan, "torchrun").text
    assert "--nnodes 4 --nproc-per-node 8" in torchrun and "-m planner.executor.runtime" in torchrun
    slurm = export_plan(plan, "slurm").text
    assert "#SBATCH --nodes=4" in slurm and "#SBATCH --gpus-per-node=8" in slurm and "$SLURM_NODEID" in slurm
    assert "dp=2 tp=8 pp=2" in slurm  # the provenance header


def test_scripts_refuse_what_the_executor_cannot_run():
    with pytest.raises(BadInputError, match="cannot export to torchrun: the executor cannot run this plan"):
        export_plan(make_plan(dp=2, tp=8, pp=2, zero=1, schedule="2bw"), "torchrun")  # 2BW runs with zero_stage 0 only


def test_unknown_target_and_infeasible_plan_refused():
    with pytest.raises(BadInputError, match="choose one of torchtitan"):
        export_plan(make_plan(), "jax")
    bad = make_plan().model_copy(update={"feasible": False, "infeasible_reasons": ("does not fit by 3.1 GiB",)})
    for target in TARGETS:
        with pytest.raises(BadInputError, match="infeasible"):
            export_plan(bad, target)


# ---- real plans from the cost model -----------------------------------------------------------------------

def test_real_estimates_export_within_each_framework_rules():
    from planner import api
    from planner.schemas.plan import Configuration

    request = api.build_request(model="llama3-70b", topology="dgx-h100", nodes=4, global_batch_size=256, seq_len=4096,
                                framework="megatron-core")
    config = Configuration(parallelism=Parallelism(dp=1, tp=8, pp=4, vpp=2, sp=True, zero_stage=1), schedule="interleaved", recompute="selective")
    plan = api.estimate(request, config)
    args, _ = megatron_arguments(plan)
    a = assert_megatron_valid(args, plan.request.gpus, plan.batch.num_microbatches)
    assert a.num_virtual_stages_per_pipeline_rank == 2 or a.pipeline_model_parallel_layout
    doc = tomllib.loads(export_plan(plan, "torchtitan").text)
    assert doc["parallelism"]["pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert doc["parallelism"]["module_fqns_per_model_part"] == [list(s.layers) for s in sorted(plan.stages, key=lambda s: s.stage)]
    with pytest.raises(BadInputError, match="DeepSpeed pipeline engine runs only its 1F1B"):
        export_plan(plan, "deepspeed")
    flat = api.estimate(request, Configuration(parallelism=Parallelism(dp=8, tp=4, pp=1, sp=True, zero_stage=3), recompute="full"))
    cfg = json.loads(export_plan(flat, "deepspeed").text)
    assert cfg["train_batch_size"] == cfg["train_micro_batch_size_per_gpu"] * cfg["gradient_accumulation_steps"] * 8 == 256
    assert cfg["zero_optimization"]["stage"] == 3


def test_axis_order_other_than_the_frameworks_is_warned():
    plan = make_plan()
    assert not export_plan(plan, "megatron").warnings
    moved = plan.model_copy(update={"parallelism": plan.parallelism.model_copy(update={"axis_order": ("cp", "pp", "dp", "tp")})})
    for target in ("megatron", "torchtitan"):
        assert any("axis_order is cp>pp>dp>tp" in w for w in export_plan(moved, target).warnings)
