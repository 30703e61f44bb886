"""The torchtitan 0.3 judge of a torchtitan export (planner.export.judges): `ConfigManager.parse_args` on the
exported argument list, `ParallelDims.from_config`, every pp rank's stages as torchtitan splits them and torch's
schedule constructor on rank 0's, the module names against torchtitan's own, Trainer.__init__'s inline checks, and,
when the config is the plan's own model, its `Decoder.Config.update_from_config` and parameter count (the module
docstring of planner.export.judges has the whole list).
"""

from __future__ import annotations

import contextlib
import sys

from planner.export.common import Export
from planner.export.verdicts import JudgeUnavailable, StubStage, Verdict, device_capability, first_line, quiet, script_array
from planner.schemas.plan import LaunchPlan


def judge_torchtitan(plan: LaunchPlan, export: Export) -> Verdict:
    try:
        import torchtitan.components.quantization.float8 as float8
        from torchtitan.config import ConfigManager
        from torchtitan.distributed.parallel_dims import ParallelDims
    except ImportError as exc:
        raise JudgeUnavailable(f"torchtitan is not importable: {exc}") from None
    capability = device_capability(plan)  # the plan's GPU: Float8 converters check it while the config is built
    float8.has_cuda_capability = lambda major, minor: capability >= (major, minor)
    args = script_array(export.text, "PLANNER_TORCHTITAN_ARGS")
    with quiet() as err, _generated_module_on_path(export.text):
        try:
            config = ConfigManager().parse_args(args)
        except ImportError as exc:  # the model module needs what is not installed here (triton, torchao)
            raise JudgeUnavailable(f"torchtitan's --module {args[1]} is not importable here: {exc}") from None
        except (SystemExit, Exception) as exc:  # tyro reports a bad override by printing and exiting
            return Verdict(False, f"ConfigManager.parse_args: {first_line(exc, err)}")
        try:
            dims = ParallelDims.from_config(config.parallelism, plan.request.gpus)
            _titan_batch(config, dims, plan)
            _titan_pipeline(config, dims, plan)
            config.model_spec.model.update_from_config(config=config)  # heads vs tp, tying vs PP, RoPE vs seq_len
            _titan_context_parallel(config, dims)
            built = _titan_params(config)
        except (AssertionError, ValueError, RuntimeError, NotImplementedError) as exc:
            return Verdict(False, first_line(exc))
    from planner.models.counting import total_params

    if built != total_params(plan.request.model):
        return Verdict(False, f"torchtitan's model from the export has {built:,} parameters, the plan's "
                              f"{total_params(plan.request.model):,}")
    return Verdict(True)

@contextlib.contextmanager
def _generated_module_on_path(script: str):
    """The config module a torchtitan export writes (heredoc PLANNER_TORCHTITAN_MODEL), importable while judged."""
    import importlib
    import tempfile
    from pathlib import Path

    marker = "PLANNER_TORCHTITAN_MODEL"
    lines = script.splitlines()
    start = next((i for i, line in enumerate(lines) if line.endswith(f"<<'{marker}'")), None)
    if start is None:
        yield
        return
    end = lines.index(marker, start + 1)
    name = lines[start].split("/")[-1].split(".py")[0]
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / f"{name}.py").write_text("\n".join(lines[start + 1:end]) + "\n")
        sys.path.insert(0, folder)
        sys.modules.pop(name, None)
        importlib.invalidate_caches()
        try:
            yield
        finally:
            sys.path.remove(folder)
            sys.modules.pop(name, None)

def _titan_context_parallel(config, dims) -> None:
    """distributed/context_parallel/api.py apply_cp_to_forward (run by the models' parallelize functions): CP wraps
    FlexAttention and SDPA only; varlen attention raises "Variable-length attention CP is not yet supported"."""
    from torchtitan.models.common.attention import VarlenAttention

    layers = getattr(config.model_spec.model, "layers", None) or []
    inner = [getattr(getattr(layer, "attention", None), "inner_attention", None) for layer in layers]
    if dims.cp > 1 and any(isinstance(attention, VarlenAttention.Config) for attention in inner):
        raise NotImplementedError("context_parallel_degree > 1 with varlen attention: torchtitan 0.3's "
                                  "apply_cp_to_forward says 'Variable-length attention CP is not yet supported'")

def _titan_params(config) -> int:
    """Unique parameters of torchtitan's own model built from the exported config on the meta device."""
    import torch

    with torch.device("meta"):
        model = config.model_spec.model.build()
    return sum(p.numel() for p in model.parameters())

def _titan_batch(config, dims, plan: LaunchPlan) -> None:
    """trainer.py Trainer.__init__: batch divisibility and the dense sequence-length evenness check."""
    t, p = config.training, config.parallelism
    batch_degree = dims.dp_replicate * dims.dp_shard
    assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0, (
        f"global batch size must be multiple of local batch size times data-parallel degree "
        f"({t.global_batch_size} % ({t.local_batch_size} * {batch_degree}) != 0)")
    accumulation = t.global_batch_size // (t.local_batch_size * batch_degree)
    expected = plan.batch.num_microbatches if dims.pp == 1 else 1
    assert accumulation == expected, f"gradient accumulation {accumulation} != the plan's {expected}"
    divisor = (dims.tp if p.enable_sequence_parallel else 1) * (2 * dims.cp if dims.cp > 1 else 1)
    if t.seq_len % divisor:
        raise ValueError(f"Training sequence length ({t.seq_len}) must be divisible by {divisor}")
    if dims.ep > 1:  # parallel_dims.py build_mesh: efsdp = fsdp * tp // ep over the same ranks
        assert (dims.dp_shard * dims.cp * dims.tp) % dims.ep == 0, "dp_shard * cp * tp must equal efsdp * ep"

def _titan_pipeline(config, dims, plan: LaunchPlan) -> None:
    """pipeline_parallel.py: module names, rank -> stage mapping, and torch's schedule built per rank."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pp_rank_to_stage_indices_mapping,
    )

    p, layers = config.parallelism, plan.request.model.num_layers
    if dims.pp == 1:
        return
    parts = p.module_fqns_per_model_part
    assert parts, "module_fqns_per_model_part is not set: torchtitan would split the model its own way"
    names = _generate_llm_fqn_per_model_part(1, layers)[0]
    placed = [n for part in parts for n in part]
    assert placed == names, (f"the model parts are not torchtitan's modules in order: unknown {sorted(set(placed) - set(names))}, "
                             f"missing {sorted(set(names) - set(placed))}")
    model_layers = getattr(getattr(config.model_spec, "model", None), "layers", None)
    if model_layers is not None:  # the config's model is the plan's (never a stand-in): the FQNs name its layers
        assert len(model_layers) == layers, f"config model has {len(model_layers)} layers, the plan {layers}"
    schedule_class = get_schedule_class(p.pipeline_parallel_schedule)
    n_microbatches = config.training.local_batch_size // p.pipeline_parallel_microbatch_size
    single = issubclass(schedule_class, PipelineScheduleSingle)
    for rank in range(dims.pp):  # torchtitan's own rank -> stage assignment; every rank runs the same count
        indices = _get_pp_rank_to_stage_indices_mapping(rank, dims.pp, p.pipeline_parallel_schedule, len(parts))
        assert not single or len(indices) == 1, f"{p.pipeline_parallel_schedule} runs one stage per rank, rank {rank} has {len(indices)}"
    # torch's schedule constructor on rank 0's stages (the checks are the same on every rank; the multi-stage
    # constructors compute the whole pipeline order, so one rank is enough and keeps 64-rank pipelines fast)
    indices = _get_pp_rank_to_stage_indices_mapping(0, dims.pp, p.pipeline_parallel_schedule, len(parts))
    stages = [StubStage(i, len(parts), dims.pp, 0) for i in indices]
    schedule_class(stages[0] if single else stages, n_microbatches=n_microbatches)
