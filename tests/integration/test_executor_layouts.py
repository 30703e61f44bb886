"""Layouts the executor refused before issue 14, now run and equal to the single-process reference within
1e-5 relative (fp32): ZeRO-1 with TP (optimizer states of DTensor shards sharded over dp, planner.executor.zero1),
with a checkpoint resumed bit-identically; selective recompute under the zero-bubble schedule (torch 2.13 runs
it; the refusal came from an older torch), with FSDP2 inside the stages; torch's schedule names (ZBV zero-bubble and
DualPipeV with their V stage placement, InterleavedZeroBubble)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from executor_plans import TINY, TINY_GPT, make_plan, write_plan  # noqa: E402
from executor_reference import LR, SEED, assert_close, reference_losses  # noqa: E402

from planner.errors import BadInputError  # noqa: E402
from planner.executor.run import run_plan  # noqa: E402
from planner.launch_spec.options import RunOptions  # noqa: E402
from planner.launch_spec.runnable import check_runnable  # noqa: E402
from planner.schedules import EXECUTOR_CLASSES  # noqa: E402
from planner.schedules import schedule as schedule_of  # noqa: E402


def options(**kw) -> RunOptions:
    return RunOptions(**{"lr": LR, "seed": SEED, "timeout_s": 90, **kw})


def test_zero1_partition_is_balanced_and_deterministic():
    from torch import nn

    from planner.executor.zero1 import partition

    params = [nn.Parameter(torch.zeros(n)) for n in (10, 40, 30, 20, 5)]
    assert partition(params, 2) == [0, 0, 1, 1, 0]  # largest first to the least loaded: 40+10+5 | 30+20
    assert partition(params, 2) == partition(params, 2)


@pytest.mark.slow
def test_zero1_with_tp2_matches_single_process_and_resumes_bit_identically(tmp_path):
    """dp2 x tp2 (SP on), ZeRO-1: 3 steps with a checkpoint at step 2, then a resume from it runs step 3 again."""
    plan = make_plan(TINY, dp=2, tp=2, sp=True, zero_stage=1, num_microbatches=2)
    path, ckpt = write_plan(plan, tmp_path / "plan.json"), tmp_path / "ckpt"
    report = run_plan(path, options=options(steps=3, checkpoint_dir=str(ckpt), checkpoint_every=2))
    ratio = assert_close(report.losses, reference_losses(plan, 3), "zero1 x tp2")
    resumed = run_plan(path, options=options(steps=3, checkpoint_dir=str(ckpt), resume=True))
    assert resumed.first_step == 3 and resumed.losses == report.losses[2:]
    print(f"zero1 x tp2: max |diff| / loss movement = {ratio:.2e}")


@pytest.mark.slow
def test_zero_bubble_with_selective_recompute_and_fsdp_matches_single_process(tmp_path):
    """pp2 x vpp2 InterleavedZeroBubble (split input/weight backward) x dp2 ZeRO-3 (run as ZeRO-2, see the
    run notes), the attention core recomputed in backward (selective)."""
    plan = make_plan(TINY, pp=2, vpp=2, dp=2, zero_stage=3, schedule="zero-bubble", recompute="selective", num_microbatches=4)
    report = run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=3))
    ratio = assert_close(report.losses, reference_losses(plan, 3), "zero-bubble selective")
    print(f"zero-bubble selective: max |diff| / loss movement = {ratio:.2e}")


def test_torch_schedule_names_place_stages_and_refuse_what_they_cannot_run():
    assert [schedule_of("zbv").stage_rank(s, pp=2) for s in range(4)] == [0, 1, 1, 0]  # V: rank 0 holds 0 and 3
    assert [schedule_of("zero-bubble").stage_rank(s, pp=2) for s in range(4)] == [0, 1, 0, 1]  # looped
    assert EXECUTOR_CLASSES["interleaved-zero-bubble"] == EXECUTOR_CLASSES["zero-bubble"] == "ScheduleInterleavedZeroBubble"
    assert (EXECUTOR_CLASSES["zbv"], EXECUTOR_CLASSES["dualpipev"]) == ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")
    with pytest.raises(BadInputError, match="set vpp=2"):
        check_runnable(make_plan(pp=2, schedule="zbv", num_microbatches=4))
    with pytest.raises(BadInputError, match="dualpipev needs num_microbatches=2 >= pp\\*vpp=4"):
        check_runnable(make_plan(pp=2, vpp=2, schedule="dualpipev", num_microbatches=2))


@pytest.mark.slow
@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_schedules_with_tied_embeddings_match_single_process(schedule, tmp_path):
    """pp2 x vpp2 in a V: rank 0 holds the first and the last stage, so the tied embedding's two copies are
    summed on that rank (no embedding group)."""
    plan = make_plan(TINY_GPT, pp=2, vpp=2, schedule=schedule, num_microbatches=4)
    report = run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=3))
    ratio = assert_close(report.losses, reference_losses(plan, 3), schedule)
    print(f"{schedule} tied: max |diff| / loss movement = {ratio:.2e}")


def test_hsdp_field_is_optional_and_omitted_when_plain():
    from planner.schemas.plan import Parallelism

    assert "dp_replicate" not in Parallelism(dp=4, tp=1, pp=1).model_dump()  # old plan files stay byte-identical
    hsdp = Parallelism(dp=4, tp=1, pp=1, zero_stage=3, dp_replicate=2)
    assert Parallelism.model_validate_json(hsdp.model_dump_json()) == hsdp
    with pytest.raises(ValueError, match="dp_replicate=3 must divide dp=4"):
        Parallelism(dp=4, tp=1, pp=1, dp_replicate=3)
    with pytest.raises(BadInputError, match=r"dp_replicate=2 \(HSDP\) shards with FSDP2"):
        check_runnable(make_plan(dp=4, zero_stage=1, dp_replicate=2, num_microbatches=1))


@pytest.mark.slow
def test_hsdp_2x2_matches_single_process_and_shards_over_two_ranks(tmp_path):
    """dp=4 as 2 replicas x 2 shards (FSDP2 on a 2-D mesh): each rank holds half the weights (plain FSDP over
    4 ranks would hold a quarter), and the losses equal a single process's."""
    from planner.nn.model import Transformer, count_parameters

    plan = make_plan(TINY, dp=4, zero_stage=3, dp_replicate=2, num_microbatches=1)
    report = run_plan(write_plan(plan, tmp_path / "plan.json"), options=options(steps=3))
    ratio = assert_close(report.losses, reference_losses(plan, 3), "hsdp 2x2")
    assert all(m.weights_bytes == count_parameters(Transformer(TINY)) * 4 // 2 for m in report.memory)
    print(f"hsdp 2x2: max |diff| / loss movement = {ratio:.2e}")


@pytest.mark.parametrize(("kwargs", "reason"), [
    (dict(cp=2), r"cp=2: framework 'planner' has no context parallelism \(torch 2.13's context_parallel"),
])  # fp8: tests/integration/test_precision_recipes.py
def test_fp8_and_cp_are_refused_with_the_reason(kwargs, reason):
    plan = make_plan(TINY, num_microbatches=1)
    if "precision" in kwargs:
        plan = plan.model_copy(update={"request": plan.request.model_copy(update=kwargs)})
    else:
        plan = plan.model_copy(update={"parallelism": plan.parallelism.model_copy(update=kwargs)})
    with pytest.raises(BadInputError, match=reason):
        check_runnable(plan)


@pytest.mark.slow
def test_torch_context_parallel_still_fails_on_cpu(tmp_path):
    """The CP refusal's premise, re-measured: torch's context_parallel around causal SDPA on 2 gloo ranks raises.
    When a torch release makes this pass, CP can be wired in on CPU and this test tells."""
    import subprocess
    import sys
    import textwrap

    script = tmp_path / "cp.py"
    script.write_text(textwrap.dedent("""
        import torch, torch.distributed as dist, torch.nn.functional as F
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.experimental import context_parallel
        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("cp",))
        x, w = torch.randn(1, 16, 16), torch.randn(16, 48, requires_grad=True)
        try:
            with context_parallel(mesh, buffers=[x], buffer_seq_dims=[1]):
                q, k, v = (x @ w).view(1, 16 // 2, 3, 2, 8).unbind(2)
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
            print("CP-RAN")
        except Exception as exc:
            print("CP-FAILED", type(exc).__name__, exc)
        dist.destroy_process_group()
    """))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
                         capture_output=True, text=True, timeout=120, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert out.stdout.count("CP-FAILED") == 2, out.stdout + out.stderr[-2000:]
    assert "_scaled_dot_product_flash_attention_for_cpu" in out.stdout


def test_estimate_prices_zero_bubble_with_vpp2_which_the_executor_runs():
    """`estimate` refused zero-bubble with vpp=2 although the executor runs it (ScheduleInterleavedZeroBubble)."""
    from executor_plans import CPU

    from planner.api import build_request, estimate
    from planner.schemas.plan import Configuration, Parallelism

    request = build_request(model=TINY, topology=CPU, gpus=2, global_batch_size=4, seq_len=16, precision="fp32")
    config = Configuration(parallelism=Parallelism(dp=1, tp=1, pp=2, vpp=2), microbatch_size=1, schedule="zero-bubble")
    plan = estimate(request, config)
    assert plan.feasible and len(plan.stages) == 4 and plan.schedule == "zero-bubble"
    check_runnable(plan)
