"""The module torchrun launches: one process of a LaunchPlan's training job.

    torchrun --nproc-per-node N -m planner.executor.runtime plan.json --steps 10 --results-dir DIR

Reads only the plan (and the run options). Per rank: check the plan is runnable and that torchrun
started the plan's world size; initialise the process group (NCCL on CUDA, gloo on CPU); build a
DeviceMesh whose named dims are the plan's `axis_order` and whose rank layout is exactly the plan's
`ranks` coordinates; build the reference model on the meta device and materialise only this rank's
pipeline stages (`stages` layer lists, virtual stages for interleaved; two copies of the stage for 2BW),
re-tying a tied LM head to its embedding after `to_empty`; apply EP, TP/SP (or Domino), activation
checkpointing and DP (DDP, ZeRO-1, FSDP2, HSDP on a 2-D dp mesh) per the plan (planner.executor.parallelize);
train with the plan's pipeline schedule, PipeDream-2BW's continuous pipeline (planner.executor.twobw) or plain
gradient accumulation; checkpoint with DCP every K steps; write this rank's
result atomically. A rank that raises writes `rank-<r>.error.json` (rank, cause) and exits 1; torchrun
then stops the others and `planner run` reports that rank and cause.
"""

from __future__ import annotations

import os
import resource
import signal
import sys
import time
import traceback
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torch import nn

from planner.errors import BadInputError
from planner.executor import checkpoint as ckpt
from planner.executor.data import BatchSource, Batches
from planner.executor.lifetime import die_with_agent, exit_now
from planner.executor.mesh import build_mesh, check_world_size, ep_groups, init_distributed, rank_coords
from planner.executor.parallelize import COMM_COUNTER_ATTR
from planner.executor.report import RankFailure, RankResult, TpOverlapTiming
from planner.io import atomic_write_text, load_file
from planner.launch_spec.options import RunOptions
from planner.launch_spec.runnable import check_runnable
from planner.schedules import schedule as schedule_of
from planner.schemas.plan import LaunchPlan

FAIL_RANK_ENV, FAIL_STEP_ENV, FAIL_WHERE_ENV = "PLANNER_FAIL_RANK", "PLANNER_FAIL_STEP", "PLANNER_FAIL_WHERE"
FAIL_SIGNAL_ENV = "PLANNER_FAIL_SIGNAL"  # kill the process with this signal instead of raising (a crash that reports nothing)


@dataclass
class Job:
    """Everything one rank builds from the plan before training."""

    plan: LaunchPlan
    options: RunOptions
    device: torch.device
    backend: str
    mesh: object
    coords: dict[str, int]
    parts: list[nn.Module] = field(default_factory=list)        # unwrapped stage modules (state dicts)
    train_parts: list[nn.Module] = field(default_factory=list)  # what runs (DDP wrapper or the module)
    optimizers: list = field(default_factory=list)
    schedule: object = None
    local_stages: list = field(default_factory=list)
    dp_group: object = None
    autocast_dtype: torch.dtype | None = None
    loss_parallel: bool = False  # vocab-sharded logits, loss under torch's loss_parallel (TP without PP)
    keys: ckpt.ShardKeys = ckpt.ShardKeys()
    tied_group: object = None
    dp_mesh: object = None  # HSDP: the 2-D (dp_replicate, dp_shard) mesh; None = the flat dp axis


# ------------------------------------------------------------------------------------------ model parts
def build_parts(job: Job, materialize: Callable[[], AbstractContextManager] = nullcontext) -> None:
    """Materialise this rank's stage modules, parallelise them, build their optimizers and the schedule. The meta
    model, its stage cuts and the process groups are built outside `materialize`, everything that makes tensors
    inside it (planner.executor.memtrace passes torch's FakeTensorMode: the same code, no memory)."""
    from planner.executor import parallelize as par_fns
    from planner.executor.pipeline import build_schedule, cut_stage, init_tied_head, local_stages, tied_embedding_group
    from planner.executor.precision import autocast_dtype, prepare_module, share_master_weights
    from planner.executor.train import cross_entropy
    from planner.nn.model import Transformer

    plan, par = job.plan, job.plan.parallelism
    with torch.device("meta"):
        full = Transformer(plan.request.model, max_seq_len=plan.batch.seq_len)
    job.local_stages = local_stages(plan, job.coords["pp"]) if par.pp > 1 else sorted(plan.stages, key=lambda s: s.stage)[:1]
    groups = ep_groups(plan, job.mesh) if par.ep > 1 else (None, None)
    job.dp_group = job.mesh["dp"].get_group()
    job.tied_group = tied_embedding_group(plan, job.mesh)
    copies = 2 if is_2bw(plan) else 1  # PipeDream-2BW: two weight versions of the stage
    job.autocast_dtype = autocast_dtype(plan.request.precision)  # amp-bf16 only, on every path
    pp_group = job.mesh["pp"].get_group() if par.pp > 1 else None
    for stage in [s for s in job.local_stages for _ in range(copies)]:
        module = cut_stage(full, stage.layers) if par.pp > 1 else full
        with materialize():
            module.to_empty(device=job.device)
            module.tie_weights()  # to_empty gives the head and the embedding separate new tensors: re-tie
            module.init_weights(job.options.seed)
            init_tied_head(module, job.options.seed)
            prepare_module(module, plan.request.precision, job.device)  # bf16 parameters; fp8: torchao Float8Linear
            train_module = parallelize_part(job, module, stage, groups, par_fns)
            job.parts.append(module)
            job.train_parts.append(train_module)
            job.optimizers.append(par_fns.build_optimizer(
                train_module, zero_stage=par.zero_stage, lr=job.options.lr,
                dp_group=job.dp_group if par.dp > 1 else None, precision=plan.request.precision))
    with materialize():
        if is_2bw(plan):
            from planner.executor.twobw_run import make_2bw_stage

            share_master_weights(job.optimizers[0], job.optimizers[1])  # one fp32 master for the two bf16 versions
            job.schedule = make_2bw_stage(job)
        elif par.pp > 1:
            job.schedule = build_schedule(plan, job.train_parts, job.local_stages, pp_group=pp_group, device=job.device,
                                          loss_fn=cross_entropy)


def is_2bw(plan: LaunchPlan) -> bool:
    return schedule_of(plan.schedule).executor_class is None and plan.parallelism.pp > 1  # PipeDream-2BW's own loop


def parallelize_part(job: Job, module: nn.Module, stage, groups, fns) -> nn.Module:
    """EP, then TP/SP or Domino, then activation checkpointing, then DP (the order that works)."""
    from planner.executor.domino import apply_domino_tp

    plan, par, mesh = job.plan, job.plan.parallelism, job.mesh
    ep_group, replica_group = groups
    if ep_group is not None:
        fns.apply_ep(module, ep_group)
    if par.tp > 1 and par.tp_overlap == "domino":
        apply_domino_tp(module, mesh["tp"].get_group())
    elif par.tp > 1:
        # Without PP the loss is vocab-parallel (torchtitan's loss_parallel, Megatron's vocab-parallel cross entropy):
        # no all-gather of the T x V logits, as the cost model prices TP. Pipeline stages hand the schedule plain
        # tensors, so there the last stage gathers the logits.
        job.loss_parallel = par.pp == 1
        fns.apply_tp(module, mesh["tp"], sp=par.sp, loss_parallel=job.loss_parallel)
    fns.apply_ac(module, stage.recompute.mode, stage.recompute.full_layers)
    precision = plan.request.precision
    zero = 2 if (par.pp > 1 and schedule_of(plan.schedule).splits_backward and par.zero_stage == 3) else par.zero_stage
    if par.dp == 1 and ep_group is None:
        return module
    # use_ddp=False in pipeline stages: DDP's reducer does not follow the schedules' per-micro-batch backwards
    return fns.apply_dp(module, job.dp_mesh if job.dp_mesh is not None else mesh["dp"], zero_stage=zero, precision=precision, expert_dp_group=replica_group,
                        use_ddp=par.pp == 1, compression=par.compression)


# ----------------------------------------------------------------------------------------------- training
def accumulate(job: Job, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """No pipeline: gradient accumulation over num_microbatches, with DP gradient sync on the last only."""
    from torch.distributed.tensor.parallel import loss_parallel

    from planner.executor.parallelize import sync_gradients
    from planner.executor.train import cross_entropy, full_tensor

    model, n = job.train_parts[0], job.plan.batch.num_microbatches
    total = torch.zeros((), dtype=torch.float32, device=job.device)
    chunks = list(zip(inputs.chunk(n), targets.chunk(n)))
    for index, (x, y) in enumerate(chunks):
        last = index == len(chunks) - 1
        _set_grad_sync(model, last)
        context = model.no_sync() if (not last and hasattr(model, "no_sync")) else nullcontext()
        with context:
            with torch.autocast(job.device.type, dtype=job.autocast_dtype, enabled=job.autocast_dtype is not None):
                logits = model(x)
            with loss_parallel() if job.loss_parallel else nullcontext():
                loss = cross_entropy(logits, y) / n
                loss.backward()
        total += full_tensor(loss.detach())
    sync_gradients(model)
    return total


def _set_grad_sync(model: nn.Module, enabled: bool) -> None:
    if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter only after the last micro-batch
        model.set_requires_gradient_sync(enabled)


def pipelined(job: Job, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """One step through the pipeline schedule; the mean micro-batch loss on last-stage ranks, else None."""
    from planner.executor.parallelize import sync_gradients
    from planner.executor.pipeline import pipeline_step, sync_tied_embeddings

    last = job.plan.parallelism.pp * job.plan.parallelism.vpp - 1
    with torch.autocast(job.device.type, dtype=job.autocast_dtype, enabled=job.autocast_dtype is not None):
        losses = pipeline_step(job.schedule, job.local_stages, inputs, targets, last_stage=last)
    for part in job.train_parts:
        sync_gradients(part)
    sync_tied_embeddings(job.parts, job.tied_group)
    return torch.stack([loss.detach().float() for loss in losses]).mean() if losses else None


def train_step(job: Job, step: int, batches: Batches) -> tuple[float | None, float]:
    """(global-batch loss or None off the last stage, wall seconds) of one optimizer step."""
    par = job.plan.parallelism
    inputs, targets = batches.local_batch(step, dp_rank=job.coords["dp"], dp=par.dp)
    inputs, targets = inputs.to(job.device), targets.to(job.device)
    _maybe_fail(step, "step")
    start = time.perf_counter()
    loss = optimizer_step(job, inputs, targets)
    value = float(loss) if loss is not None else None
    if job.device.type == "cuda":
        torch.cuda.synchronize(job.device)
    return value, time.perf_counter() - start


def optimizer_step(job: Job, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor | None:
    """One optimizer step on this rank's batch: gradients cleared, forward and backward (pipelined or accumulated,
    gradient sync included), the optimizers' step, the loss averaged over dp (a tensor; None off the last stage).
    No clock and no host read: planner.executor.memtrace traces exactly this under fake tensors."""
    par = job.plan.parallelism
    for opt in job.optimizers:
        opt.zero_grad(set_to_none=True)
    loss = pipelined(job, inputs, targets) if par.pp > 1 else accumulate(job, inputs, targets)
    for opt in job.optimizers:
        opt.step()
    if loss is not None and par.dp > 1:
        dist.all_reduce(loss, group=job.dp_group)
        loss /= par.dp
    return loss


def _maybe_fail(step: int, where: str) -> None:
    """Fault injection for tests: PLANNER_FAIL_RANK=r [PLANNER_FAIL_STEP=s] [PLANNER_FAIL_WHERE=step|checkpoint]
    [PLANNER_FAIL_SIGNAL=9: die by that signal, writing nothing, as an OOM kill or a segfault does]."""
    target = os.environ.get(FAIL_RANK_ENV)
    if target is None or int(target) != dist.get_rank():
        return
    if int(os.environ.get(FAIL_STEP_ENV, str(step))) == step and os.environ.get(FAIL_WHERE_ENV, "step") == where:
        if os.environ.get(FAIL_SIGNAL_ENV):
            os.kill(os.getpid(), int(os.environ[FAIL_SIGNAL_ENV]))
        raise RuntimeError(f"injected failure ({FAIL_RANK_ENV}={target}) at step {step} ({where})")


def run(job: Job) -> RankResult:
    """Resume if asked, train steps first..options.steps, checkpoint every K steps; returns this rank's result."""
    from planner.executor.parallelize import dropped_tokens, routing_load

    opts, batch = job.options, job.plan.batch
    first = 1
    versions = is_2bw(job.plan)  # 2BW: parts are the stage's two weight versions
    if opts.resume:
        # `planner run` verified every file's checksum before launch; under `planner launch` each node's first rank does
        ckpt.check_resume(opts.checkpoint_dir, job.plan, verify_files=os.environ.get(ckpt.VERIFIED_ENV) != "1"
                          and os.environ.get("LOCAL_RANK", "0") == "0")
        first = ckpt.load(opts.checkpoint_dir, job.parts, job.optimizers, keys=job.keys, versions=versions) + 1
    source = BatchSource(vocab_size=job.plan.request.model.vocab_size, global_batch_size=batch.global_batch_size,
                         seq_len=batch.seq_len, seed=opts.seed, path=opts.data, dtype=opts.data_dtype)
    batches, losses, times, saved = Batches(source), [], [], []

    def save(step: int) -> None:
        folder = ckpt.save(opts.checkpoint_dir, step, job.parts, job.optimizers, keys=job.keys, versions=versions,
                           fail_hook=lambda s=step: _maybe_fail(s, "checkpoint"), layout=ckpt.layout_of(job.plan))
        saved.append(str(folder))

    if versions:  # one continuous pipeline, flushed only at checkpoints
        from planner.executor.twobw_run import reshare, train_2bw

        if opts.resume:
            reshare(job)
        losses, times = train_2bw(job, batches, first, save)
    else:
        for step in range(first, opts.steps + 1):
            loss, seconds = train_step(job, step, batches)
            times.append(seconds)
            if loss is not None:
                losses.append(loss)
            if opts.checkpoint_every and step % opts.checkpoint_every == 0:
                save(step)
    counts = [dropped_tokens(part) for part in job.parts]
    loads = [routing_load(part) for part in job.parts]
    counters = [c for part in job.train_parts if (c := getattr(part, COMM_COUNTER_ATTR, None)) is not None]
    overlap = measure_tp_overlap(job)
    return RankResult(
        rank=dist.get_rank(), coords=job.coords, device=str(job.device), backend=job.backend, first_step=first,
        losses=tuple(losses), step_times_s=tuple(times), peak_memory_bytes=peak_memory_bytes(job.device),
        memory_kind="cuda_max_allocated" if job.device.type == "cuda" else "rss_peak", weights_bytes=weights_bytes(job.parts),
        threads=torch.get_num_threads(),
        dropped_tokens=sum(c[0] for c in counts), routed_tokens=sum(c[1] for c in counts), checkpoints=tuple(saved),
        routing_slowest_tokens=sum(load[0] for load in loads), routing_mean_tokens=sum(load[1] for load in loads),
        tp_overlap=overlap, dp_comm_bytes=tuple(counters[0].per_iteration) if counters else (),
    )


def measure_tp_overlap(job: Job) -> TpOverlapTiming | None:
    """With tp_overlap="domino": time one dense block with plain TP and with Domino on this rank's tp group
    at the plan's micro-batch shape (planner.executor.domino.time_tp_overlap), for the report's gain."""
    par, batch = job.plan.parallelism, job.plan.batch
    if par.tp_overlap != "domino" or par.tp == 1:
        return None
    from planner.executor.domino import time_tp_overlap

    timing = time_tp_overlap(job.plan.request.model, job.mesh["tp"].get_group(), batch_size=batch.microbatch_size,
                             seq_len=batch.seq_len, seed=job.options.seed, device=str(job.device))
    return TpOverlapTiming(none_s=timing["none_s"], domino_s=timing["domino_s"], gain=timing["gain"])


def weights_bytes(parts: list[nn.Module]) -> int:
    """Bytes of the distinct parameter storages of this rank's modules (local shards; every weight version)."""
    storages = {}
    for part in parts:
        for param in part.parameters():
            local = param.to_local() if hasattr(param, "to_local") else param
            storage = local.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: the caching allocator's peak; CPU: the process's peak resident set (Linux reports KiB)."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def make_job(plan: LaunchPlan, options: RunOptions) -> Job:
    device, backend = init_distributed(options)
    job = new_job(plan, options, device, backend)
    build_parts(job)
    return job


def new_job(plan: LaunchPlan, options: RunOptions, device: torch.device, backend: str) -> Job:
    """This rank's Job on an initialised process group (mesh, coordinates, shard keys), before its parts are built."""
    from planner.executor.parallelize import hsdp_mesh

    mesh = build_mesh(plan, device.type)
    par = plan.parallelism
    coords = rank_coords(plan, dist.get_rank())
    keys = ckpt.ShardKeys(ep_rank=coords["dp"] % par.ep, ep=par.ep, tp_rank=coords["tp"], tp=par.tp,
                          manual_tp=par.tp_overlap == "domino")
    return Job(plan=plan, options=options, device=device, backend=backend, mesh=mesh, coords=coords, keys=keys,
               dp_mesh=hsdp_mesh(plan, mesh, device.type) if par.dp_replicate > 1 else None)


def main(argv: list[str] | None = None) -> int:
    die_with_agent()  # a rank never outlives torchrun's agent (planner.executor.lifetime)
    if hasattr(signal, "SIGXFSZ"):  # past the file-size limit a write fails with EFBIG (named), not a silent kill
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    rank = int(os.environ.get("RANK", "0"))
    results_dir = Path("planner-run")
    try:
        plan_path, options = RunOptions.from_argv(sys.argv[1:] if argv is None else argv)
        results_dir = Path(options.results_dir)
        plan = load_file(LaunchPlan, plan_path)
        check_runnable(plan)
        check_world_size(plan, rank)
        if os.environ.get("OMP_NUM_THREADS", "").isdigit():  # the same threads per rank for every world size
            torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        job = make_job(plan, options)
        result = run(job)
        atomic_write_text(results_dir / f"rank-{rank}.json", result.model_dump_json(indent=2))
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except (Exception, CheckpointException) as exc:  # every failure (DCP's is a BaseException) becomes one file naming
        # the rank and the cause, then exit 1
        failure = RankFailure(rank=rank, error_type=type(exc).__name__, message=str(exc),
                              traceback=traceback.format_exc(), time_s=time.time())
        atomic_write_text(results_dir / f"rank-{rank}.error.json", failure.model_dump_json(indent=2))
        sys.stderr.write(f"rank {rank}: {type(exc).__name__}: {exc}\n")
        return 1


if __name__ == "__main__":
    exit_now(main())  # not sys.exit: a gloo worker thread can abort the finalizing interpreter (lifetime.exit_now)
