"""Acceptance judges: each framework's own validation code run on an export of a plan.

Used by `benchmarks/framework_acceptance.py` and the judge tests (one module per framework: judges_torchtitan,
judges_megatron_lm with the megatron-core wheel's judges_megatron, judges_deepspeed; our executor's here); every framework is optional (the `judges`
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

from planner.export.common import Export
from planner.export.judges_deepspeed import judge_deepspeed
from planner.export.judges_megatron_lm import judge_megatron
from planner.export.judges_torchtitan import judge_torchtitan
from planner.export.verdicts import StubStage, Verdict, first_line, quiet
from planner.schemas.plan import LaunchPlan


def judge(plan: LaunchPlan, export: Export) -> Verdict:
    """The export's own framework's verdict; JudgeUnavailable when that framework is not installed."""
    judges = {"torchtitan": judge_torchtitan, "megatron": judge_megatron, "deepspeed": judge_deepspeed,
              "torchrun": judge_planner, "slurm": judge_planner}
    return judges[export.target](plan, export)

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
    stages = [StubStage(index, total, par.pp, 0) for index in indices]
    try:
        with quiet():
            cls(stages if sched.multi_stage else stages[0], n_microbatches=plan.batch.num_microbatches)
    except (ValueError, AssertionError) as exc:
        return Verdict(False, f"torch {cls.__name__}: {first_line(exc)}")
    return Verdict(True)
