"""Peak memory of a plan counted from the code that runs: one rank's training step of the executor, traced under fake
tensors and a fake process group (issue 20, item 2).

`trace_rank(plan, rank)` initialises torch's "fake" process-group backend (FakeStore: collectives are no-ops) as
`rank` of the plan's world, builds the rank's Job with the runtime's own functions (runtime.new_job, build_parts:
meta model, stage cut, EP/TP/AC/DP, optimizer, schedule) with every tensor made under torch's FakeTensorMode
(shapes, dtypes and storages, no memory), and runs runtime.optimizer_step twice (the first step creates the optimizer
state, the second is the steady state) while `LiveBytes` counts the bytes of every live storage. Without a pipeline,
micro-batches after the second one repeat its memory (the gradients are already held), so at most two are traced in
the second step and one in the first.

Fake CUDA tensors cannot run autograd on a CPU-only torch, so the trace runs on fake CPU tensors with the GPU's
contracts stood in (planner.executor.gpu_contracts), each stated here with its source:
- attention: FlashAttention-2 as torch calls it (aten/src/ATen/native/transformers/cuda/flash_attn/flash_api.cpp,
  mha_fwd/mha_bwd): the forward saves q, k, v, the output and the fp32 log-sum-exp (batch, heads, seq), never the
  seq x seq scores; the backward allocates dq, dk, dv, an fp32 dq accumulator the size of q and the fp32 softmax_d
  (batch, heads, seq). `FlashContract` is that autograd function (its values are exact: the gradients come from the
  reference attention, computed out of the count);
- optimizer: what the executor builds on CUDA (parallelize.build_optimizer: AdamW fused=True, no temporaries; the
  bf16 recipe's MasterWeightOptimizer steps fused AdamW on fp32 masters, its chunked grad.float() copies traced as
  they run, the masters counted as optimizer bytes); SGD gets torch's CUDA default (torch/optim/optimizer.py,
  _default_to_fused_or_foreach: foreach for plain tensors, the per-tensor loop for DTensors);
- DDP: torch's C++ Reducer cannot run on fake tensors; DdpContract holds what it holds (one flat gradient buffer per
  25 MiB bucket, torch/csrc/distributed/c10d/reducer.cpp initialize_buckets, kept for the whole run);
- allocator: the CUDA caching allocator rounds every block up to 512 bytes (kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp;
  torch.distributed._tools.mem_tracker uses the same constant) and max_memory_allocated counts the rounded blocks;
  segments (reserved memory, not counted in max_memory_allocated) are rounded to 2 MiB for large allocations (kRoundLarge);
- workspace: cuBLAS takes one workspace per (handle, stream) through the caching allocator (aten/src/ATen/cuda/
  CublasHandlePool.cpp; ":4096:8" = 32 MiB on sm90 and later), counted once for the compute stream; the CUDA context
  and NCCL's own buffers are allocated outside the caching allocator and are not in max_memory_allocated.

Pipeline plans: torch.distributed.pipelining's warm-up vote and shape exchange do not cross a fake process group;
gpu_contracts.pipeline_metadata stands them in, and memtrace_scale.trace_plan traces the ranks in pipeline order,
each in a forked child process (a fresh torch per rank: DeviceMesh compares equal by layout, so a torch-side cache
would otherwise hand the second rank the first one's mesh and its destroyed groups), so a stage receives the shapes
the one before it sent.
MoE layers: the routing's token counts give data-dependent shapes, so the trace assumes balanced routing
(planner.executor.moe_contract, stated in the plan's note); expert parallelism is not traced (trace_rank raises;
planner.memory_trace then says "not verified by trace" and keeps the formula's verdict).
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
import weakref
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

from planner.executor.gpu_contracts import (
    cuda_optimizer_defaults, gpu_contracts, inner_optimizers, master_weights, meshes_outside_fake, pipeline_metadata,
    stand_in_ddp,
)
from planner.executor.moe_contract import balanced_routing
from planner.schemas.plan import LaunchPlan

CUDA_BLOCK_BYTES = 512             # kMinBlockSize, c10/cuda/CUDACachingAllocator.cpp
CUDA_LARGE_SEGMENT_BYTES = 2 << 20  # kRoundLarge (reserved segments; not in max_memory_allocated)
CUBLAS_WORKSPACE_BYTES = 32 << 20  # CublasHandlePool.cpp default ":4096:8" (4096 KiB x 8) on sm90+
PARTS = ("params", "grads", "optimizer", "activations", "transient", "other")


def rounded(nbytes: int, block: int) -> int:
    return -(-nbytes // block) * block if nbytes else 0


class LiveBytes(TorchDispatchMode):
    """Bytes of the storages alive, counted at every op output (a storage once, when first seen; released when torch
    frees it), rounded up to `block_bytes`; the peak, and the live storages at the peak with the phase that made them
    (build, forward, backward, optimizer). DTensor ops are seen as their local ops (NotImplemented lets DTensor
    desugar first, as torch's MemTracker does). UntypedStorage.resize_ (FSDP2 frees its unsharded parameters with it)
    is not an op: it is wrapped while the counter is active."""

    def __init__(self, block_bytes: int = 1):
        super().__init__()
        self.block_bytes = block_bytes
        self.live: dict[int, tuple[int, str]] = {}  # serial -> (bytes, phase)
        self.serial_of: dict[int, int] = {}         # id(storage) -> serial, while the storage lives
        self.refs: dict[int, weakref.ref] = {}
        self.serials = itertools.count()
        self.total = self.peak = 0
        self.at_peak: dict[int, tuple[int, str]] = {}
        self.rising = False
        self.phase_peaks: dict[str, tuple[int, dict]] = {}  # phase -> (its peak, live storages then; {} while rising)
        self.last_phase: str | None = None
        self.phase = "build"
        self.in_optimizer = False
        self.paused = 0
        self.orig_resize = None

    def see(self, t: torch.Tensor) -> None:
        """Count `t`'s storage if it is new (or its size changed)."""
        if t.device.type == "meta":  # shapes only (torch.distributed.pipelining's metadata inference)
            return
        st = t.untyped_storage()
        nbytes = rounded(st.nbytes(), self.block_bytes)
        serial = self.serial_of.get(id(st))
        if serial is not None:
            if nbytes != self.live[serial][0]:
                self.resize(serial, nbytes)
            return
        serial = next(self.serials)
        phase = self.current_phase()
        self.enter(phase)
        self.live[serial] = (nbytes, phase)
        self.serial_of[id(st)] = serial
        self.refs[serial] = weakref.ref(st, lambda _ref, key=id(st), s=serial: self.free(key, s))
        self.grow(nbytes)

    def current_phase(self) -> str:
        if self.phase == "warm-up":  # the optimizer state made before the traced step (trace_rank)
            return self.phase
        if self.in_optimizer:
            return "optimizer"
        return "backward" if torch._C._current_graph_task_id() != -1 else self.phase

    def enter(self, phase: str) -> None:
        """An event in `phase`: when the phase changed, the previous phase's rise (if any) ends here."""
        if phase != self.last_phase:
            self.close_phase()
            self.last_phase = phase

    def close_phase(self) -> None:
        if self.last_phase in self.phase_peaks and not self.phase_peaks[self.last_phase][1]:
            self.phase_peaks[self.last_phase] = (self.phase_peaks[self.last_phase][0], dict(self.live))

    def grow(self, nbytes: int) -> None:
        self.total += nbytes
        if self.total > self.peak:
            self.peak, self.rising = self.total, True
        if self.total > self.phase_peaks.get(self.last_phase, (-1,))[0]:
            self.phase_peaks[self.last_phase] = (self.total, {})

    def mark_fall(self) -> None:
        """The first fall after a new peak: the live storages now are those at the peak (the global one, and the
        current phase's)."""
        if self.rising:
            self.at_peak, self.rising = dict(self.live), False
        self.close_phase()

    def resize(self, serial: int, nbytes: int) -> None:
        size, phase = self.live[serial]
        self.enter(self.current_phase())
        if nbytes < size:
            self.mark_fall()
            self.total -= size - nbytes
        self.live[serial] = (nbytes, phase)
        if nbytes > size:
            self.grow(nbytes - size)

    def free(self, key: int, serial: int) -> None:
        if serial not in self.live:
            return
        self.enter(self.current_phase())
        self.mark_fall()
        self.total -= self.live.pop(serial)[0]
        self.refs.pop(serial, None)
        if self.serial_of.get(key) == serial:
            del self.serial_of[key]

    def reset_peak(self) -> None:
        """Peaks counted from now on only (the storages alive stay counted)."""
        self.peak, self.at_peak, self.rising = self.total, dict(self.live), False
        self.phase_peaks, self.last_phase = {}, None

    def peak_live(self) -> dict[int, tuple[int, str]]:
        return dict(self.live) if self.rising else self.at_peak

    def phase_peak_live(self) -> dict[str, tuple[int, dict[int, tuple[int, str]]]]:
        """Each phase's own peak (the most bytes alive while an op of that phase ran) and the storages then."""
        return {phase: (peak, live if live else dict(self.live)) for phase, (peak, live) in self.phase_peaks.items()}

    def serial(self, t: torch.Tensor) -> int | None:
        return self.serial_of.get(id(t.untyped_storage()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.distributed.tensor import DTensor
        from torch.utils._pytree import tree_map_only

        if any(t is DTensor for t in types):
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            tree_map_only(torch.Tensor, self.see, out)
        return out

    def __enter__(self):
        if self.orig_resize is None:
            self.orig_resize = original = torch.UntypedStorage.resize_

            def resize_(st, size):
                out = original(st, size)
                serial = self.serial_of.get(id(st))
                if serial is not None:
                    self.resize(serial, rounded(st.nbytes(), self.block_bytes))
                return out

            torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        if self.orig_resize is not None:
            torch.UntypedStorage.resize_ = self.orig_resize
            self.orig_resize = None
        return super().__exit__(*exc)

    @contextlib.contextmanager
    def pause(self):
        """Ops run here are not counted (the stand-ins' reference computations)."""
        self.paused += 1
        try:
            yield
        finally:
            self.paused -= 1


# --------------------------------------------------------------------------------------------------- the trace
@dataclass(frozen=True)
class RankTrace:
    """One rank's traced step: the peak (workspace included) and, at the peak, the bytes of each part (PARTS)."""

    rank: int
    coords: dict[str, int]
    peak_bytes: int
    parts: dict[str, int] = field(default_factory=dict)
    workspace_bytes: int = 0
    microbatches: int = 1
    phases: dict[str, dict[str, int]] = field(default_factory=dict)  # phase -> its own peak's parts (workspace in other)


def traced_plan(plan: LaunchPlan, microbatches: int = 2) -> LaunchPlan:
    """The plan the trace runs: without a pipeline, at most `microbatches` micro-batches (module docstring)."""
    par, batch = plan.parallelism, plan.batch
    if par.pp > 1 or batch.num_microbatches <= microbatches:
        return plan
    return plan.model_copy(update={"batch": batch.model_copy(update={
        "num_microbatches": microbatches, "global_batch_size": batch.microbatch_size * microbatches * par.dp})})


def distinct_ranks(plan: LaunchPlan) -> list[int]:
    """One rank per pipeline coordinate, at coordinate 0 of dp, cp and tp: the other ranks of a pipeline stage hold the
    same shapes (FSDP2 and DTensor give coordinate 0 the largest shard of an uneven split: torch.chunk)."""
    from planner.executor.mesh import rank_coords

    par = plan.parallelism
    chosen = {}
    for rank in range(par.world_size):
        coords = rank_coords(plan, rank)
        if all(coords[axis] == 0 for axis in coords if axis != "pp"):
            chosen.setdefault(coords["pp"], rank)
    return [chosen[p] for p in sorted(chosen)]


def trace_rank(plan: LaunchPlan, rank: int, *, target: str = "cuda", fake: bool = True, steps: int = 2,
               sent: dict | None = None, warm_up: bool | None = None) -> RankTrace:
    """Trace `rank`'s optimizer steps of `plan` (module docstring). target "cuda": the GPU contracts and the CUDA
    allocator's rounding and workspace; "cpu": none of them (what a CPU run of the same code allocates). fake=False
    runs the same steps on real tensors (small plans: the CPU check of the trace). warm_up: the first of the two
    steps only makes the optimizer state (zero gradients, the optimizers' step: warm_up_optimizers) and the peak is
    counted from the second step on; its forward and backward hold no optimizer state, so they peak below the second
    step's, and its optimizer step equals the second's (test_memtrace_scale checks both ways give one peak). None: on
    fake tensors only (a real run, the check of the trace, runs the executor's first step as it is)."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from planner.executor import runtime
    from planner.executor.mesh import rank_coords
    from planner.launch_spec.options import RunOptions

    if dist.is_initialized():
        raise RuntimeError("trace_rank needs a process without a process group (it initialises the fake backend)")
    run_plan = traced_plan(plan)
    cuda = target == "cuda"
    counter = LiveBytes(CUDA_BLOCK_BYTES if cuda else 1)
    materialize = tracing(plan, counter, fake=fake, cuda=cuda, sent=sent if sent is not None else {})
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=plan.parallelism.world_size)
    try:
        with warnings.catch_warnings():  # torch's warnings about the traced code are the executor's, not the user's
            warnings.simplefilter("ignore")
            job = runtime.new_job(run_plan, RunOptions(device="cpu"), torch.device("cpu"), "fake")
            runtime.build_parts(job, materialize)
            if cuda:
                cuda_optimizer_defaults(job.optimizers)
            run_steps(job, counter, materialize, steps=steps, warm_up=fake if warm_up is None else warm_up)
        parts = peak_parts(counter, job)
        phases = {phase: peak_parts(counter, job, live) for phase, (_, live) in counter.phase_peak_live().items()}
    finally:
        dist.destroy_process_group()
    workspace = CUBLAS_WORKSPACE_BYTES if cuda else 0
    return RankTrace(rank=rank, coords=rank_coords(plan, rank), peak_bytes=counter.peak + workspace,
                     parts={**parts, "other": parts["other"] + workspace}, workspace_bytes=workspace,
                     microbatches=run_plan.batch.num_microbatches,
                     phases={phase: {**each, "other": each["other"] + workspace} for phase, each in phases.items()})


def tracing(plan: LaunchPlan, counter: LiveBytes, *, fake: bool, cuda: bool, sent: dict):
    """The context every tensor of the traced job is made in (runtime.build_parts' `materialize`, and each step):
    FakeTensorMode (fake), the counter, the stand-ins of what fake tensors cannot run, the GPU contracts (cuda)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else None

    @contextlib.contextmanager
    def materialize():
        with contextlib.ExitStack() as stack:
            if fake_mode is not None:
                stack.enter_context(fake_mode)
            stack.enter_context(counter)
            stack.enter_context(stand_in_ddp())
            stack.enter_context(meshes_outside_fake(counter))
            if plan.request.model.moe is not None and fake:  # real tensors route by their values
                stack.enter_context(balanced_routing())
            stack.enter_context(pipeline_metadata(sent))
            if cuda:
                stack.enter_context(gpu_contracts(counter))
            yield

    return materialize


def run_steps(job, counter: LiveBytes, materialize, *, steps: int, warm_up: bool) -> None:
    """The traced optimizer steps of `job` (trace_rank): the first makes the optimizer state (one micro-batch, or the
    warm-up), the last holds it throughout; the optimizer's own steps are marked for the counter's phases."""
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    from planner.executor import runtime

    run_plan = job.plan
    plans = [traced_plan(run_plan, 1)] * (steps - 1) + [run_plan]
    if warm_up and steps > 1:
        with materialize():
            counter.phase = "warm-up"
            warm_up_optimizers(job)
        counter.reset_peak()
        plans = plans[-1:]
    hooks = [register_optimizer_step_pre_hook(lambda *_: setattr(counter, "in_optimizer", True)),
             register_optimizer_step_post_hook(lambda *_: setattr(counter, "in_optimizer", False))]
    try:
        for job.plan in plans:
            rows, seq_len = job.plan.batch.microbatch_size * job.plan.batch.num_microbatches, job.plan.batch.seq_len
            with materialize():
                counter.phase = "forward"
                vocab = job.plan.request.model.vocab_size
                inputs, targets = torch.randint(0, vocab, (rows, seq_len)), torch.randint(0, vocab, (rows, seq_len))
                runtime.optimizer_step(job, inputs, targets)
                del inputs, targets
    finally:
        for hook in hooks:
            hook.remove()


def warm_up_optimizers(job) -> None:
    """The optimizer state of a first step without its forward and backward: every trainable parameter gets a zero
    gradient shaped like it (a DTensor shard for a DTensor), the optimizers step once (making their state and, for
    the bf16 recipe, nothing else: masters exist from the build), and the gradients are dropped."""
    params = [p for part in job.train_parts for p in part.parameters() if p.requires_grad]
    for param in params:
        param.grad = torch.zeros_like(param)
    for opt in job.optimizers:
        opt.step()
    for opt in job.optimizers:
        opt.zero_grad(set_to_none=True)
    for param in params:
        param.grad = None


def peak_parts(counter: LiveBytes, job, live: dict | None = None) -> dict[str, int]:
    """The live bytes at the peak (or in `live`) by part: the parameters', gradients' and optimizer state's storages
    as the job holds them at the end, the rest by the phase that made it (forward: activations; backward, optimizer:
    transient; build: other, e.g. buffers)."""
    def serials(tensors) -> set[int]:
        found = set()
        for t in tensors:
            if isinstance(t, torch.Tensor):
                local = t.to_local() if hasattr(t, "to_local") else t
                serial = counter.serial(local)
                if serial is not None:
                    found.add(serial)
        return found

    params = [p for part in job.parts for p in part.parameters()]
    owners = {"params": serials(params), "grads": serials(p.grad for p in params if p.grad is not None),
              "optimizer": serials(t for opt in job.optimizers for inner in inner_optimizers(opt)
                                   for state in inner.state.values() for t in state.values())
              | serials(m for opt in job.optimizers for m in master_weights(opt))}
    by_phase = {"forward": "activations", "backward": "transient", "optimizer": "transient", "build": "other",
                "warm-up": "other"}
    parts = dict.fromkeys(PARTS, 0)
    for serial, (nbytes, phase) in (counter.peak_live() if live is None else live).items():
        part = next((name for name, found in owners.items() if serial in found), by_phase[phase])
        parts[part] += nbytes
    return parts
