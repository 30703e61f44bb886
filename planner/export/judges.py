"""Acceptance judges: each framework's own validation code run on an export of a plan.

Used by `benchmarks/framework_acceptance.py` and the judge tests; every framework is optional (the `judges`
extra): a judge whose framework is not importable raises JudgeUnavailable, which tests turn into a skip.

- torchtitan 0.3: `torchtitan.config.ConfigManager.parse_args` on the exported argument list (tyro parsing and
  Trainer.Config.__post_init__), `ParallelDims.from_config(...)` (world = dp_replicate*dp_shard*cp*tp*pp),
  every pp rank's stages as torchtitan's `_pipeline_module_split` assigns them
  (`_get_pp_rank_to_stage_indices_mapping`) and torch's schedule constructor on rank 0's, the module names against
  torchtitan's own `_generate_llm_fqn_per_model_part` (and the config's model depth when it is the plan's model),
  and the checks Trainer.__init__ makes inline (batch divisibility, seq_len vs tp/cp; efsdp = dp_shard*cp*tp // ep);
  when the config is the plan's own model, its `Decoder.Config.update_from_config` (heads vs tp, weight tying vs PP,
  RoPE length vs seq_len, the EP token dispatcher).
- Megatron: with $MEGATRON_LM_PATH (a Megatron-LM checkout at the tag matching megatron-core) its
  `megatron/training/arguments.py` `parse_args` + `validate_args` + `core_transformer_config_from_args`;
  otherwise megatron-core's `TransformerConfig`/`MLATransformerConfig` and `ConstantNumMicroBatchesCalculator`
  (planner.export.judges_megatron); then the interleaved schedule's micro-batch-group rule (schedules.py).

Where a framework asks torch.cuda for the GPU (Float8 converters, validate_args), the judge answers with the plan's
device (its compute capability, `device_capability`): this machine has no GPU. Those patches stay in the process.
- DeepSpeed: `DeepSpeedConfig(config, mpu=...)` in a fake-backend world of the plan's size, the mpu answering
  data-parallel size from `PipeModelDataParallelTopology(num_pp, num_mp, num_dp)`; the PipelineEngine's ZeRO rule.
- planner: our executor's pre-launch check `planner.launch_spec.runnable.check_runnable`, then torch's schedule class
  as the executor builds it (planner/executor/pipeline.py build_schedule) on stub stages.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import sys

from planner.export.common import Export, stage_layer_counts
from planner.export.judges_megatron import megatron_core_params, megatron_core_verdict, split_verdict
from planner.export.verdicts import JudgeUnavailable, Verdict, first_line, quiet
from planner.schemas.plan import LaunchPlan

# NVIDIA compute capability by device-name prefix: the frameworks ask torch.cuda, which this CPU machine lacks.
CAPABILITIES = (("GB200", (10, 0)), ("B200", (10, 0)), ("H100", (9, 0)), ("H200", (9, 0)), ("H800", (9, 0)),
                ("A100", (8, 0)), ("A800", (8, 0)), ("L40", (8, 9)))


def device_capability(plan: LaunchPlan) -> tuple[int, int]:
    """The compute capability of the plan's GPU (its topology's device name); (9, 0) when the name is unknown."""
    name = plan.request.topology.device.name.upper()
    return next((cap for prefix, cap in CAPABILITIES if name.startswith(prefix)), (9, 0))


def script_array(text: str, name: str) -> list[str]:
    """The words of `NAME=( ... )` in an exported bash script, as bash would pass them."""
    body = text.split(f"{name}=(", 1)[1].split("\n)", 1)[0]
    return shlex.split("\n".join(line for line in body.splitlines() if not line.strip().startswith("#")))


def judge(plan: LaunchPlan, export: Export) -> Verdict:
    """The export's own framework's verdict; JudgeUnavailable when that framework is not installed."""
    judges = {"torchtitan": judge_torchtitan, "megatron": judge_megatron, "deepspeed": judge_deepspeed,
              "torchrun": judge_planner, "slurm": judge_planner}
    return judges[export.target](plan, export)


# ---- torchtitan 0.3 ---------------------------------------------------------------------------------------

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
    stages = [_StubStage(i, len(parts), dims.pp, 0) for i in indices]
    schedule_class(stages[0] if single else stages, n_microbatches=n_microbatches)


class _StubStage:
    """What torch's schedule constructors read of a PipelineStage (no model, no process group)."""

    def __init__(self, index: int, stages: int, pp: int, rank: int):
        import torch

        self.stage_index, self.num_stages, self.group_size, self.group_rank = index, stages, pp, rank
        self.is_first, self.is_last, self.group = index == 0, index == stages - 1, None
        self.submod = torch.nn.Module()


# ---- Megatron ---------------------------------------------------------------------------------------------

MEGATRON_USER_ARGS = ["--train-iters", "1", "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer"]


def judge_megatron(plan: LaunchPlan, export: Export) -> Verdict:
    args = script_array(export.text, "PLANNER_MEGATRON_ARGS")
    path = os.environ.get("MEGATRON_LM_PATH")
    if path:
        verdict = _megatron_lm(args, plan, path, "export CUDA_DEVICE_MAX_CONNECTIONS=1" in export.text)
    else:
        verdict = megatron_core_verdict(args, plan.request.gpus, stage_layer_counts(plan))
    if not verdict.accepted:
        return verdict
    verdict = _megatron_interleaved_groups(plan)
    return verdict if not verdict.accepted else _megatron_params(args, plan)


def _megatron_params(args: list[str], plan: LaunchPlan) -> Verdict:
    """The model the flags build (megatron-core's GPTModel on the meta device) has the plan's parameter count, which
    tests/unit/test_models_hf_parity.py ties to transformers' for HF configs."""
    from planner.models.counting import total_params

    try:
        built = megatron_core_params(args)
    except ImportError as exc:
        raise JudgeUnavailable(f"megatron-core is not importable: {exc}") from None
    except (AssertionError, ValueError, TypeError, RuntimeError) as exc:
        return Verdict(False, f"GPTModel did not build: {first_line(exc)}")
    expected = total_params(plan.request.model)
    if built != expected:
        return Verdict(False, f"GPTModel from the flags has {built:,} parameters, the plan's model {expected:,}")
    return Verdict(True)


def _megatron_interleaved_groups(plan: LaunchPlan) -> Verdict:
    """megatron/core/pipeline_parallel/schedules.py forward_backward_pipelining_with_interleaving, checked at the
    first step (not by validate_args): micro-batches run in groups of microbatch_group_size_per_vp_stage (default
    pp, model_parallel_config.py); the group must lie in [pp, M] and M % group be 0 or >= pp."""
    par, m = plan.parallelism, plan.batch.num_microbatches
    if par.pp == 1 or par.vpp == 1:
        return Verdict(True)
    group = par.pp
    if group > m:
        return Verdict(False, f"schedules.py: the number of contiguous micro-batches in a virtual pipeline stage should "
                              f"range in [PP={par.pp}, M={m}]")
    if 0 < m % group < par.pp:
        return Verdict(False, f"schedules.py: the remainder of M={m} divided by N={group} should be 0 or >= pp")
    return Verdict(True)


def _megatron_lm(args: list[str], plan: LaunchPlan, path: str, max_connections_1: bool) -> Verdict:
    """Megatron-LM's parse_args + validate_args + core_transformer_config_from_args on the exported flags.

    The device is the plan's (e.g. an H100: compute capability 9.0) where validate_args asks torch.cuda; the user's
    data, tokenizer and optimizer flags are stand-ins (--mock-data, NullTokenizer); TE's rope fusion is off
    because TransformerEngine is not installed here."""
    import torch

    if path not in sys.path:
        sys.path.insert(0, path)
    _typing_override()
    try:
        import megatron.training.arguments as arguments
    except ImportError as exc:
        raise JudgeUnavailable(f"MEGATRON_LM_PATH={path!r}: megatron.training is not importable: {exc}") from None
    capability = device_capability(plan)
    arguments.get_device_arch_version = lambda: capability[0]
    torch.cuda.get_device_capability = lambda *a, **k: capability
    env = {"WORLD_SIZE": str(plan.request.gpus), "RANK": "0", "LOCAL_RANK": "0"}
    if max_connections_1:  # the script exports it
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = "1"
    saved_env, saved_argv = {k: os.environ.get(k) for k in (*env, "CUDA_DEVICE_MAX_CONNECTIONS")}, sys.argv
    os.environ.pop("CUDA_DEVICE_MAX_CONNECTIONS", None)
    os.environ.update(env)
    sys.argv = ["pretrain_gpt.py", *args, *MEGATRON_USER_ARGS]
    try:
        with quiet() as err:
            parsed = arguments.parse_args()
            arguments.validate_args(parsed, {})
            parsed.apply_rope_fusion = False
            config = arguments.core_transformer_config_from_args(parsed)
    except (SystemExit, Exception) as exc:
        return Verdict(False, f"Megatron-LM: {first_line(exc, err)}")
    finally:
        sys.argv = saved_argv
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return split_verdict(config, plan.parallelism.pp, plan.parallelism.vpp, stage_layer_counts(plan))


def _typing_override() -> None:
    """Megatron-LM from core_v0.17 imports typing.override (Python 3.12); on 3.11 lend typing_extensions' own."""
    import typing

    if not hasattr(typing, "override"):
        import typing_extensions

        typing.override = typing_extensions.override


# ---- DeepSpeed --------------------------------------------------------------------------------------------

class TopologyMpu:
    """The mpu DeepSpeedConfig consults: sizes from DeepSpeed's own PipeModelDataParallelTopology."""

    def __init__(self, topology):
        self.topology = topology

    def get_data_parallel_world_size(self) -> int:
        return self.topology.get_dim("data")

    def get_model_parallel_world_size(self) -> int:
        return self.topology.get_dim("model")

    def get_pipeline_model_parallel_world_size(self) -> int:
        return self.topology.get_dim("pipe")


@contextlib.contextmanager
def fake_world(world: int):
    """torch.distributed's fake backend with `world` ranks (this process rank 0), wrapped by deepspeed.comm."""
    import torch.distributed as tdist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if tdist.is_initialized():
        tdist.destroy_process_group()
    tdist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        import deepspeed.comm as dist

        if not dist.is_initialized():
            dist.init_distributed(dist_backend="fake", auto_mpi_discovery=False, verbose=False)
        yield
    finally:
        tdist.destroy_process_group()


def judge_deepspeed(plan: LaunchPlan, export: Export) -> Verdict:
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
        from deepspeed.runtime.pipe.topology import PipeModelDataParallelTopology
    except ImportError as exc:
        raise JudgeUnavailable(f"deepspeed is not importable: {exc}") from None
    par = plan.parallelism
    config = json.loads(export.text)
    topology = PipeModelDataParallelTopology(num_pp=par.pp, num_mp=par.tp, num_dp=plan.request.gpus // (par.pp * par.tp))
    if topology.world_size() != plan.request.gpus:
        return Verdict(False, f"topology world {topology.world_size()} != {plan.request.gpus} GPUs")
    try:
        with quiet(), fake_world(plan.request.gpus):
            ds = DeepSpeedConfig(config, mpu=TopologyMpu(topology) if par.tp * par.pp > 1 else None)
        if par.pp > 1:  # deepspeed/runtime/pipe/engine.py PipelineEngine.__init__
            assert ds.zero_optimization_stage < 2, "ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism"
        if plan.request.model.moe is not None:  # deepspeed/runtime/engine.py DeepSpeedEngine.__init__ (MoE layers)
            assert ds.zero_optimization_stage < 3, ("Native DeepSpeed MoE is not supported with ZeRO Stage 3. Use AutoEP "
                                                    "or choose ZeRO stage 1/2")
    except (AssertionError, ValueError, KeyError) as exc:
        return Verdict(False, f"DeepSpeedConfig: {first_line(exc)}")
    return Verdict(True)


# ---- our executor -----------------------------------------------------------------------------------------

def judge_planner(plan: LaunchPlan, export: Export) -> Verdict:
    """check_runnable, then torch's schedule class built as planner/executor/pipeline.py build_schedule builds it
    (the class names and the runnable rules live in planner.launch_spec, below both the executor and the exporters)
    (the schedule's executor_class on rank 0's virtual stages, n_microbatches = the plan's): the constructor's
    checks (1F1B: n >= stages; interleaved and zero-bubble: n a multiple of max(1, n // pp)) run before step 1."""
    from planner.errors import BadInputError
    from planner.launch_spec.runnable import check_runnable

    try:
        check_runnable(plan)
    except BadInputError as exc:
        return Verdict(False, f"check_runnable: {exc}")
    par = plan.parallelism
    if par.pp == 1:
        return Verdict(True)
    from torch.distributed import pipelining

    from planner.schedules import schedule as schedule_of

    sched = schedule_of(plan.schedule)
    if sched.executor_class is None:  # 2BW: the executor's own send/recv loop, no torch schedule class
        return Verdict(True)
    cls = getattr(pipelining, sched.executor_class)
    total = par.pp * par.vpp
    v_placement = sched.v_placed
    indices = (0, total - 1) if v_placement else range(0, total, par.pp)  # rank 0's stages (V: first and last)
    stages = [_StubStage(index, total, par.pp, 0) for index in indices]
    try:
        with quiet():
            cls(stages if sched.multi_stage else stages[0], n_microbatches=plan.batch.num_microbatches)
    except (ValueError, AssertionError) as exc:
        return Verdict(False, f"torch {cls.__name__}: {first_line(exc)}")
    return Verdict(True)
