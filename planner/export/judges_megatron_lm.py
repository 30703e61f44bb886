"""The Megatron judge of a Megatron export (planner.export.judges): with $MEGATRON_LM_PATH (a Megatron-LM checkout
at the tag matching megatron-core) its `megatron/training/arguments.py` parse_args + validate_args +
core_transformer_config_from_args, otherwise the megatron-core wheel (planner.export.judges_megatron); then the
interleaved schedule's micro-batch-group rule (schedules.py) and the parameters of the model the flags build.
"""

from __future__ import annotations

import os
import sys

from planner.export.common import Export, stage_layer_counts
from planner.export.judges_megatron import megatron_core_params, megatron_core_verdict, split_verdict
from planner.export.verdicts import JudgeUnavailable, Verdict, device_capability, first_line, quiet, script_array
from planner.schemas.plan import LaunchPlan


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
    from planner.models.counting import mtp_params, total_params

    try:
        built = megatron_core_params(args)
    except ImportError as exc:
        raise JudgeUnavailable(f"megatron-core is not importable: {exc}") from None
    except (AssertionError, ValueError, TypeError, RuntimeError) as exc:
        return Verdict(False, f"GPTModel did not build: {first_line(exc)}")
    expected = total_params(plan.request.model) + mtp_params(plan.request.model)
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
