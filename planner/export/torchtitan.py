"""LaunchPlan -> torchtitan job TOML (v0.2 series: `torchtitan/config/job_config.py`).

Keys written: [parallelism] data_parallel_replicate_degree, data_parallel_shard_degree,
fsdp_reshard_after_forward, tensor_parallel_degree, pipeline_parallel_degree, pipeline_parallel_schedule,
pipeline_parallel_microbatch_size, module_fqns_per_model_part (the plan's stages, in virtual-stage order),
context_parallel_degree, expert_parallel_degree; [training] local_batch_size, global_batch_size, seq_len,
mixed_precision_param; [activation_checkpoint] mode, selective_ac_option.

torchtitan's rules checked here (and refused with its reason):
- DP is either replicated (DDP, our ZeRO-0) or sharded (FSDP2): ZeRO-1/2 map to FSDP with
  reshard_after_forward="never" (optimizer states and gradients sharded, parameters kept gathered
  between forward and backward), ZeRO-3 to FSDP with the default resharding.
- Expert parallelism is "dp2ep": ranks are borrowed from data_parallel_shard_degree * context_parallel_degree,
  with context_parallel_degree <= expert_parallel_degree <= data_parallel_shard_degree * context_parallel_degree.
- Pipeline schedules are torch.distributed.pipelining's: GPipe, 1F1B, Interleaved1F1B, InterleavedZeroBubble;
  there is no PipeDream-2BW. Interleaved1F1B needs num_microbatches to be a multiple of its number of
  rounds, max(1, num_microbatches // pp) (torch/distributed/pipelining/schedules.py).
- One activation-checkpoint policy for every block: "full", "selective" (per-op, or full AC on every n-th block).
Batch: torchtitan's global_batch_size / (local_batch_size * dp) is the gradient-accumulation count; with PP
the local batch is split into pipeline_parallel_microbatch_size micro-batches.
"""

from __future__ import annotations

from typing import Any

from planner.export.common import (
    Export,
    axis_order_warning,
    base_recompute,
    check_exportable,
    decoder_layers,
    full_recompute_layers,
    header_lines,
    refuse,
    stage_layer_counts,
)
from planner.export.toml import toml_document
from planner.schemas.plan import LaunchPlan

TARGET = "torchtitan"
SCHEDULES = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": "Interleaved1F1B", "zero-bubble": "InterleavedZeroBubble"}
PRECISION_PARAM = {"bf16": "bfloat16", "amp-bf16": "bfloat16", "fp8": "bfloat16", "fp32": "float32"}


def _data_parallel(plan: LaunchPlan, warnings: list[str]) -> dict[str, Any]:
    par = plan.parallelism
    if par.zero_stage == 0:
        return {"data_parallel_replicate_degree": par.dp, "data_parallel_shard_degree": 1}
    if par.zero_stage in (1, 2):
        if par.zero_stage == 1:
            warnings.append(
                "torchtitan has no ZeRO-1: exported as FSDP2 with reshard_after_forward='never' (ZeRO-2: gradients "
                "sharded too), which needs no more memory than the plan"
            )
        return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": par.dp, "fsdp_reshard_after_forward": "never"}
    return {"data_parallel_replicate_degree": 1, "data_parallel_shard_degree": par.dp, "fsdp_reshard_after_forward": "default"}


def _check_expert_parallel(plan: LaunchPlan, shard: int) -> None:
    par = plan.parallelism
    if par.ep == 1:
        return
    borrow = shard * par.cp
    if not (par.cp <= par.ep <= borrow) or borrow % par.ep:
        raise refuse(
            TARGET,
            f"expert_parallel_degree={par.ep} must satisfy context_parallel_degree={par.cp} <= ep <= "
            f"data_parallel_shard_degree*context_parallel_degree={borrow} and divide it (torchtitan borrows EP "
            f"ranks from the FSDP and CP dimensions, 'dp2ep')",
            "use --zero 1, 2 or 3 so that DP is sharded, or a smaller --ep",
        )


def _pipeline(plan: LaunchPlan, warnings: list[str]) -> dict[str, Any]:
    par, batch = plan.parallelism, plan.batch
    if par.pp == 1:
        return {"pipeline_parallel_degree": 1}
    if plan.schedule not in SCHEDULES:
        raise refuse(
            TARGET,
            f"schedule {plan.schedule!r} is not in torch.distributed.pipelining (it has GPipe, 1F1B, Interleaved1F1B, "
            "InterleavedZeroBubble, ZBVZeroBubble)",
            "re-plan with --schedule 1f1b, interleaved or zero-bubble",
        )
    if plan.schedule == "interleaved":
        rounds = max(1, batch.num_microbatches // par.pp)
        if batch.num_microbatches % rounds:
            raise refuse(
                TARGET,
                f"Interleaved1F1B requires num_microbatches={batch.num_microbatches} to be a multiple of its number "
                f"of rounds max(1, num_microbatches // pp)={rounds}",
                f"choose a global batch that gives a multiple of pp={par.pp} micro-batches",
            )
    if batch.num_microbatches < par.pp * par.vpp:
        warnings.append(
            f"num_microbatches={batch.num_microbatches} < number of stages {par.pp * par.vpp}: torchtitan warns of a large bubble"
        )
    ordered = sorted(plan.stages, key=lambda stage: stage.stage)
    return {
        "pipeline_parallel_degree": par.pp,
        "pipeline_parallel_schedule": SCHEDULES[plan.schedule],
        "pipeline_parallel_microbatch_size": batch.microbatch_size,
        "module_fqns_per_model_part": [list(stage.layers) for stage in ordered],
    }


def _activation_checkpoint(plan: LaunchPlan, warnings: list[str]) -> dict[str, Any]:
    """One policy for all blocks; partial full recompute maps to full AC on every n-th block (never less recompute)."""
    mode = base_recompute(plan)
    full = full_recompute_layers(plan)
    counts = stage_layer_counts(plan)
    if mode == "full" or (any(full) and all(f >= c for f, c in zip(full, counts) if c)):
        return {"mode": "full"}
    if not any(full):
        if mode == "selective":
            warnings.append(
                "selective recompute exported as torchtitan's per-op SAC ('op'), which recomputes non-matmul ops; the "
                "plan assumed Megatron-style selective recompute of the attention core"
            )
            return {"mode": "selective", "selective_ac_option": "op"}
        return {"mode": "none"}
    if mode == "selective":
        raise refuse(
            TARGET,
            "torchtitan applies one activation-checkpoint policy to every block, and this plan fully recomputes some "
            "layers on top of selective recompute",
            "re-plan with --recompute full or --recompute none",
        )
    every = min(c // f for f, c in zip(full, counts) if f)
    warnings.append(
        f"partial full recompute ({sum(full)} of {sum(counts)} layers) exported as full AC on every {every}-th block, "
        "which recomputes at least as many layers as the plan (less memory, possibly slower)"
    )
    return {"mode": "selective", "selective_ac_option": str(every)}


def export_torchtitan(plan: LaunchPlan) -> Export:
    """The torchtitan TOML for this plan; merges with a model's own TOML ([model], [optimizer], ... are left to it)."""
    check_exportable(plan, TARGET)
    par, batch = plan.parallelism, plan.batch
    warnings = axis_order_warning(plan, TARGET, ("pp", "dp", "cp", "tp"), "mesh [pp, dp_replicate, dp_shard, cp, tp] (outermost first)")
    parallelism = _data_parallel(plan, warnings)
    _check_expert_parallel(plan, parallelism["data_parallel_shard_degree"])
    parallelism.update({"tensor_parallel_degree": par.tp, "context_parallel_degree": par.cp, "expert_parallel_degree": par.ep})
    parallelism.update(_pipeline(plan, warnings))
    if par.tp > 1 and not par.sp:
        warnings.append("torchtitan always applies sequence parallelism with TP (less activation memory than the plan)")
    if par.tp_overlap != "none":
        warnings.append(f"tp_overlap={par.tp_overlap!r} has no torchtitan equivalent; the predicted step time assumes it")
    local = batch.microbatch_size * (batch.num_microbatches if par.pp > 1 else 1)
    training = {
        "local_batch_size": local,
        "global_batch_size": batch.global_batch_size,
        "seq_len": batch.seq_len,
        "mixed_precision_param": PRECISION_PARAM[plan.request.precision],
    }
    tables = {
        "job": {"description": f"planner: {plan.request.model.name} on {plan.request.gpus} GPUs"},
        "model": {"converters": ["float8"]} if plan.request.precision == "fp8" else {},
        "training": training,
        "parallelism": parallelism,
        "activation_checkpoint": _activation_checkpoint(plan, warnings),
    }
    header = header_lines(plan, TARGET) + [
        "# Merge with your model's torchtitan TOML: [model] name/flavor, [optimizer], data and checkpoint stay yours.",
        f"# Stage layer names follow torchtitan's Transformer FQNs ({', '.join(_fqn_summary(plan))}).",
    ]
    return Export(target=TARGET, text=toml_document(tables, header=header), suffix=".toml", warnings=tuple(warnings))


def _fqn_summary(plan: LaunchPlan) -> list[str]:
    ordered = sorted(plan.stages, key=lambda stage: stage.stage)
    out = []
    for stage in ordered:
        layers = decoder_layers(stage.layers)
        span = f"layers.{layers[0]}..{layers[-1]}" if layers else "no decoder layers"
        out.append(f"stage {stage.stage}: {span}")
    return out[:8] + (["..."] if len(out) > 8 else [])
