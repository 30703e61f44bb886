"""LaunchPlan -> DeepSpeed config JSON (batch triple, zero_optimization, bf16, tensor_parallel).

DeepSpeed's rules checked here (refused with its reason):
- Batch: train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * dp, where
  dp = world_size / (tp * pp) (deepspeed/runtime/config.py `_batch_assertion`).
- ZeRO with pipeline parallelism: "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
  (deepspeed/runtime/pipe/engine.py), so zero_optimization.stage <= 1 when pp > 1.
- The pipeline engine runs one schedule (TrainSchedule, 1F1B-like), without virtual stages; GPipe is
  exported as it (same bubble, less activation memory); interleaved, zero-bubble and 2BW are refused.
- No ring context parallelism (DeepSpeed-Ulysses is a different, all-to-all sequence parallelism).
Things the JSON cannot carry (the pipeline partition, expert-parallel size) are code-level in DeepSpeed
(PipelineModule(partition_method=...), deepspeed.moe.layer.MoE(ep_size=...)) and come back as usage lines and
warnings: the usage names partition_method='type:transformer' where DeepSpeed's own partition of the decoder layers
(planner.frameworks_split.deepspeed_type_split) is the plan's split, and a warning says what it builds otherwise.

The model-parallel layout must reach DeepSpeed too: `DeepSpeedConfig` checks train_batch_size against the
data-parallel size it reads from the mpu (`mpu.get_data_parallel_world_size()`, deepspeed/runtime/config.py);
without one it counts every rank of the world, so a config with tp or pp > 1 is rejected. The export's `usage`
says how: pp > 1, a PipelineModule built with topology=PipeModelDataParallelTopology(num_pp, num_mp, num_dp)
(deepspeed.initialize then takes `model.mpu()`, and refuses another mpu); tp > 1 alone, `mpu=` a Megatron-style
parallel state (megatron.core.parallel_state after initialize_model_parallel). The plan is first re-checked
against planner/data/frameworks/deepspeed.yaml, whatever framework it was made for.
"""

from __future__ import annotations

import json
from typing import Any

from planner.export.common import Export, base_recompute, check_exportable, check_framework, rank_layer_counts, refuse
from planner.frameworks_split import deepspeed_type_split
from planner.schedules import DEFAULT
from planner.schedules import schedule as schedule_of
from planner.schemas.plan import LaunchPlan

TARGET = "deepspeed"


def _check(plan: LaunchPlan, warnings: list[str]) -> None:
    par = plan.parallelism
    if par.dp_replicate > 1:  # no HSDP spelling written for this stack yet: refused, not exported as plain FSDP
        raise refuse(TARGET, f"dp_replicate={par.dp_replicate} (HSDP): this exporter writes no hybrid-sharding flags yet",
                     "re-plan with --dp-replicate 1, or export to torchtitan")
    if par.pp > 1 and par.zero_stage >= 2:
        raise refuse(
            TARGET,
            f"zero_stage={par.zero_stage} with pp={par.pp}: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
            "re-plan with --zero 0 or 1, or --pp 1",
        )
    if par.cp > 1:
        raise refuse(
            TARGET,
            f"cp={par.cp}: DeepSpeed has no ring context parallelism (Ulysses sequence parallelism is a different algorithm)",
            "re-plan with --cp 1",
        )
    sched = schedule_of(plan.schedule)
    if par.pp > 1 and (par.vpp > 1 or (sched.deepspeed is None and not sched.runs_as)):
        raise refuse(
            TARGET,
            f"schedule {plan.schedule!r} (vpp={par.vpp}): the DeepSpeed pipeline engine runs only its 1F1B TrainSchedule "
            "without virtual stages",
            f"re-plan with --schedule {DEFAULT.name}",
        )
    if par.pp > 1 and sched.runs_as:
        runs = schedule_of(sched.runs_as)
        warnings.append(f"{sched.title} exported as DeepSpeed's {runs.title} {runs.deepspeed}: same bubble, less activation memory")
    counts = rank_layer_counts(plan)
    if par.pp > 1 and tuple(counts) != _type_split(plan):
        warnings.append(
            f"stages {counts} (decoder layers per pipeline rank) cannot be given in the config: DeepSpeed's "
            f"PipelineModule partitions by partition_method; 'type:transformer' builds {list(_type_split(plan))} "
            "(deepspeed/runtime/pipe/module.py _partition_layers), 'parameters' balances parameter counts"
        )
    if par.ep > 1:
        warnings.append(f"expert parallelism is set in code: deepspeed.moe.layer.MoE(..., ep_size={par.ep})")
    if par.sp:
        warnings.append("Megatron-style sequence parallelism is a model-code option in Megatron-DeepSpeed (--sequence-parallel)")


def _recompute(plan: LaunchPlan, warnings: list[str]) -> dict[str, Any] | None:
    mode = base_recompute(plan)
    per_stage = [stage.recompute.full_layers for stage in sorted(plan.stages, key=lambda s: s.stage)]
    full = sum(per_stage)
    if mode == "none" and not full:
        return None
    if full and mode != "full":
        how = (f"checkpoint {max(per_stage)} decoder layers per pipeline stage ({per_stage} in the plan), e.g. "
               f"PipelineModule(activation_checkpoint_interval=...) or deepspeed.checkpointing.checkpoint on those layers")
    else:
        how = "checkpoint every decoder layer (deepspeed.checkpointing.checkpoint / PipelineModule(activation_checkpoint_interval=1))"
    warnings.append(f"activation checkpointing ({mode}, {full} layers fully recomputed) is applied in model code: {how}")
    return {"partition_activations": False, "contiguous_memory_optimization": False, "cpu_checkpointing": False}


def _compression(plan: LaunchPlan, config: dict[str, Any]) -> None:
    """ZeRO++ (deepspeed/runtime/zero/config.py: zero_quantized_weights, zero_hpz_partition_size,
    zero_quantized_gradients) and the 16-bit gradient all-reduce (communication_data_type): what deepspeed's profile
    lists; check_framework refused any other method before this."""
    comp, zero = plan.parallelism.compression, config["zero_optimization"]
    if comp.has("qwz"):
        zero["zero_quantized_weights"] = True
    if comp.has("hpz"):
        zero["zero_hpz_partition_size"] = comp.hpz_partition_size
    if comp.has("qgz"):
        zero["zero_quantized_gradients"] = True
    if comp.has("bf16-grads"):
        config["communication_data_type"] = "bf16"


def build_config(plan: LaunchPlan, warnings: list[str]) -> dict[str, Any]:
    """The DeepSpeed config dict; `warnings` collects what DeepSpeed approximates."""
    par, batch = plan.parallelism, plan.batch
    dp = plan.request.gpus // (par.tp * par.pp)
    config: dict[str, Any] = {
        "train_batch_size": batch.microbatch_size * batch.num_microbatches * dp,
        "train_micro_batch_size_per_gpu": batch.microbatch_size,
        "gradient_accumulation_steps": batch.num_microbatches,
        "zero_optimization": {"stage": par.zero_stage, "overlap_comm": True, "contiguous_gradients": True},
    }
    precision = plan.request.precision
    if precision in ("bf16", "amp-bf16", "fp8"):
        config["bf16"] = {"enabled": True}
    if precision == "fp8":
        warnings.append("fp8 needs Transformer Engine layers in the model code; the config enables bf16 around them")
    if par.tp > 1 and par.pp == 1:
        config["tensor_parallel"] = {"autotp_size": par.tp}
        warnings.append(f"tp={par.tp}: AutoTP shards the model on the mpu's tensor-parallel groups; a model that is already "
                        "tensor-parallel (Megatron-DeepSpeed) drops the tensor_parallel section and passes only mpu=")
    elif par.tp > 1:
        warnings.append(
            f"tp={par.tp} with pp={par.pp}: no tensor_parallel section, as AutoTP would replace the PipelineEngine's mpu "
            "(deepspeed/runtime/engine.py _configure_tensor_parallel_states); the pipeline's layers must be "
            f"tensor-parallel themselves (Megatron-DeepSpeed) on the topology's model-parallel groups (num_mp={par.tp})"
        )
    _compression(plan, config)
    checkpointing = _recompute(plan, warnings)
    if checkpointing is not None:
        config["activation_checkpointing"] = checkpointing
    if config["train_batch_size"] != batch.global_batch_size:
        raise refuse(
            TARGET,
            f"train_batch_size {config['train_batch_size']} != micro {batch.microbatch_size} x gas "
            f"{batch.num_microbatches} x dp {dp} does not equal global_batch_size={batch.global_batch_size}",
            "regenerate the plan",
        )
    return config


def export_deepspeed(plan: LaunchPlan) -> Export:
    """The DeepSpeed JSON config for this plan (pass it as `deepspeed.initialize(config=...)` / `--deepspeed_config`)."""
    check_exportable(plan, TARGET)
    check_framework(plan, TARGET)
    warnings: list[str] = []
    _check(plan, warnings)
    config = build_config(plan, warnings)
    return Export(target=TARGET, text=json.dumps(config, indent=2) + "\n", suffix=".json", warnings=tuple(warnings),
                  usage=usage(plan))


def _type_split(plan: LaunchPlan) -> tuple[int, ...]:
    """Decoder layers per pipeline rank of partition_method='type:transformer' (one embedding spec ahead of the
    decoder layers, norm and head behind: Megatron-DeepSpeed's GPTModelPipe)."""
    return deepspeed_type_split(plan.request.model.num_layers, plan.parallelism.pp)


def _partition_method(plan: LaunchPlan) -> str:
    """'type:transformer' (a regex matched case-insensitively against the layer specs' class names, e.g.
    Megatron-DeepSpeed's ParallelTransformerLayerPipe: module.py _find_layer_type) where it builds the plan's split
    exactly; else 'parameters' (the warning says what 'type:transformer' would build)."""
    return "type:transformer" if tuple(rank_layer_counts(plan)) == _type_split(plan) else "parameters"


def usage(plan: LaunchPlan) -> tuple[str, ...]:
    """How to hand the config and the model-parallel sizes to DeepSpeed (DeepSpeedConfig needs the mpu's dp)."""
    par = plan.parallelism
    dp = plan.request.gpus // (par.tp * par.pp)
    if par.pp > 1:
        return (
            f"from deepspeed.pipe import PipelineModule; from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology",
            f"module = PipelineModule(layers=<your LayerSpecs>, loss_fn=<loss>, topology=PipeModelDataParallelTopology("
            f"num_pp={par.pp}, num_mp={par.tp}, num_dp={dp}), partition_method={_partition_method(plan)!r})",
            "engine, *_ = deepspeed.initialize(model=module, config='ds_config.json')  # no mpu=: the engine uses "
            f"module.mpu(), whose data-parallel size {dp} makes train_batch_size check out",
        )
    if par.tp > 1:
        return (
            f"from megatron.core import parallel_state; parallel_state.initialize_model_parallel("
            f"tensor_model_parallel_size={par.tp})  # or Megatron-DeepSpeed's mpu",
            "engine, *_ = deepspeed.initialize(model=model, config='ds_config.json', mpu=parallel_state)  # "
            f"DeepSpeedConfig reads dp={dp} from mpu.get_data_parallel_world_size(); without mpu it counts all "
            f"{plan.request.gpus} ranks and rejects train_batch_size",
        )
    return ("engine, *_ = deepspeed.initialize(model=model, config='ds_config.json')",)
