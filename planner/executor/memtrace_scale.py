"""A rank's traced memory at its real depth and micro-batch count from traces of shallow stages (issue 20, item 2: fast
enough to verify every plan of the `planner` stack by default).

Where the time goes (cProfile of trace_rank): every op of the step runs under FakeTensorMode (0.1-0.5 ms of Python
per op), so a trace costs layers x micro-batches x distinct ranks, plus about 1,000 module imports per forked rank
(memtrace.preload now does them once). A pipeline rank's step ran all its micro-batches (128 for Llama-3 8B on 8
GPUs, x 16 layers, twice). The layers of a stage are identical (same widths, same recompute), and past the
schedule's warm-up a pipeline's micro-batches repeat, so each rank is traced with its real widths, sequence length,
embedding/head, recompute and schedule but with BASE = 2 and 3 decoder layers per stage, and each phase's peak
(planner.executor.memtrace.LiveBytes.phase_peaks: forward, backward, optimizer) and its parts are extended linearly to
the rank's real layer count L:

    peak_phase(L) = peak_phase(2) + (L - 2) * (peak_phase(3) - peak_phase(2)),   peak = max over phases

Exact when each layer adds the same bytes to the phase's peak (its weights, gradients, optimizer state, saved
activations; a phase peaks at a layer boundary). Extending each phase apart, not the step's peak, keeps this when the
deep step peaks in another phase than the shallow ones. The base is 2 layers, not 1: the first layer next to the
embedding can add different bytes (Llama-3 70B, FSDP2 ZeRO-3, full recompute: the backward peak grows 2.08 GiB from
1 to 2 layers, then 1.95, 2.05 GiB per layer; from 2 and 3 layers the extension is within about 2% there, from 1 and
2 it was 6% over). tests/unit/test_memtrace_scale.py compares this with full traces: DDP, ZeRO-1, FSDP2, TP, pipelines
(1F1B, GPipe, interleaved, zero-bubble, ZBV, DualPipeV), recompute none/selective/full/partial, both bf16 recipes.

Partial full recompute (`full_layers` of a stage's layers checkpointed, the rest not) makes two kinds of layer: each
kind is extended on its own (traces at (2, 2), (3, 2), (2, 3) layers of each kind). A pipeline's step also grows with
its micro-batches past the warm-up (torch.distributed.pipelining allocates each micro-batch's receive buffers for the
whole step and the runtime schedules hold their sends to the end; GPipe holds every micro-batch's activations): two
micro-batch counts n1 < n2 past the warm-up (2 x pp x the stages a rank holds, and that plus pp) are traced and each
phase extended linearly in n as well; GPipe's per-layer slope is traced at both (activations per layer and
micro-batch), the other schedules' at n1 only (what a micro-batch adds there is not per layer: tested). Virtual
stages of one rank with unequal depths are extended at the deepest (an upper bound by at most one layer per virtual
stage). Models whose layers differ (MoE every n-th layer, dense first layers, per-layer attention types, NoPE layers)
and plans as shallow as the traces are traced in full (trace_plan).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

from planner.executor.memtrace import PARTS, RankTrace, distinct_ranks, trace_rank
from planner.schedules import schedule as schedule_of
from planner.schemas.plan import LaunchPlan

TRACE_TIMEOUT_S = 600.0  # one rank's trace in a child process (seconds at the real sizes; this bounds a hang)
LAYER = re.compile(r"^layers\.\d+$")
BASE = 2  # layers of each kind in the base trace: the first layer next to the embedding may differ (module docstring)
WARMUP_ROUNDS = 2  # n1 = WARMUP_ROUNDS x pp x virtual stages per rank: past every schedule's warm-up (module docstring)
Point = tuple[int, int, int]  # (layers of the full-recompute kind, layers of the other kind, micro-batches) per stage


def layers_of(stage) -> list[str]:
    return [name for name in stage.layers if LAYER.match(name)]


def kinds(stage) -> tuple[int, int]:
    """(fully recomputed layers, other layers) of a stage: apply_ac checkpoints its first `full_layers` blocks."""
    count = len(layers_of(stage))
    full = count if stage.recompute.mode == "full" else min(stage.recompute.full_layers, count)
    return full, count - full


def uniform_layers(plan: LaunchPlan) -> bool:
    """Every decoder layer of the model is built the same (planner.nn.model.TransformerBlock by its index)."""
    spec = plan.request.model
    if spec.moe is not None and (spec.moe.first_k_dense or spec.moe.moe_every != 1):
        return False
    if spec.layer_types is not None and len(set(spec.layer_types)) > 1:
        return False
    return not spec.nope_layers


def microbatch_points(plan: LaunchPlan) -> tuple[int, int] | None:
    """(n1, n2): two micro-batch counts past a pipeline's warm-up, or None when the plan's own count is as small."""
    par = plan.parallelism
    if par.pp == 1:
        return None
    held = max(1, len(plan.stages) // par.pp)  # virtual stages per pipeline rank (vpp, or 2 for V schedules)
    n1 = WARMUP_ROUNDS * par.pp * held
    n2 = n1 + par.pp
    return (n1, n2) if plan.batch.num_microbatches > n2 else None


def reduced_plan(plan: LaunchPlan, full: int, other: int, microbatches: int | None) -> LaunchPlan:
    """`plan` with each stage's decoder layers cut to `full` fully recomputed ones (where the stage has that kind)
    and `other` ones (where it has those), renumbered in stage order; its embedding, norm and head as they were."""
    stages, index = [], 0
    for stage in sorted(plan.stages, key=lambda s: s.stage):
        real_full, real_other = kinds(stage)
        count = (full if real_full else 0) + (other if real_other else 0)
        names = list(stage.layers)
        layer_at = [i for i, name in enumerate(names) if LAYER.match(name)]
        new_layers = [f"layers.{index + i}" for i in range(count)]
        if layer_at:
            names = names[:layer_at[0]] + new_layers + names[layer_at[-1] + 1:]
        index += count
        recompute = stage.recompute.model_copy(update={"full_layers": full if (real_full and real_other) else 0})
        stages.append(stage.model_copy(update={"layers": tuple(names), "recompute": recompute}))
    model = plan.request.model.model_copy(update={"num_layers": index})
    update = {"request": plan.request.model_copy(update={"model": model}), "stages": tuple(stages)}
    if microbatches is not None:
        batch = plan.batch
        update["batch"] = batch.model_copy(update={"num_microbatches": microbatches, "global_batch_size":
                                                   batch.microbatch_size * microbatches * plan.parallelism.dp})
    return plan.model_copy(update=update)


def scalable(plan: LaunchPlan) -> bool:
    """Whether tracing shallow stages saves anything (and is exact: uniform layers)."""
    if not uniform_layers(plan):
        return False
    deepest = max((sum(kinds(s)) for s in plan.stages), default=0)
    return deepest > BASE + 1 or microbatch_points(plan) is not None


def trace_plan_scaled(plan: LaunchPlan, *, target: str = "cuda") -> list[RankTrace]:
    """Each distinct rank's trace of `plan`, extended from shallow traces (module docstring); a plan where that saves
    nothing, or whose layers differ, is traced in full."""
    if not scalable(plan):
        return trace_plan(plan, target=target)
    points = design(plan)
    traced: dict[Point, list[RankTrace]] = {}
    for point in points:
        full, other, n = point
        traced[point] = trace_plan(reduced_plan(plan, full, other, n if microbatch_points(plan) else None), target=target)
    ranks = distinct_ranks(plan)
    return [extend(plan, rank, {point: traces[i] for point, traces in traced.items()}) for i, rank in enumerate(ranks)]


def design(plan: LaunchPlan) -> list[Point]:
    """The shallow traces: BASE layers of each kind the plan has, one more of each kind, at n1 (and at n2 with a
    pipeline)."""
    has_full = any(kinds(s)[0] for s in plan.stages)
    has_other = any(kinds(s)[1] for s in plan.stages)
    steps = microbatch_points(plan) or (plan.batch.num_microbatches,)
    points = []
    for n in steps:
        points.append((BASE, BASE, n))
        # GPipe holds every micro-batch: each one adds its activations, per layer
        if n != steps[0] and not schedule_of(plan.schedule).holds_every_microbatch:
            continue  # what a micro-batch adds past the warm-up is not per layer: the layers' slope is n1's
        if has_full:
            points.append((BASE + 1, BASE, n))
        if has_other:
            points.append((BASE, BASE + 1, n))
    return points


def extend(plan: LaunchPlan, rank: int, traces: dict[Point, RankTrace]) -> RankTrace:
    """`rank`'s trace at its real depth and micro-batch count from its shallow traces (module docstring)."""
    from planner.executor.pipeline import local_stages
    from planner.executor.mesh import rank_coords

    coords = rank_coords(plan, rank)
    mine = local_stages(plan, coords["pp"]) if plan.parallelism.pp > 1 else sorted(plan.stages, key=lambda s: s.stage)[:1]
    real_full = max((kinds(s)[0] for s in mine), default=0) or BASE  # a kind the rank lacks: no change
    real_other = max((kinds(s)[1] for s in mine), default=0) or BASE
    steps = microbatch_points(plan) or (plan.batch.num_microbatches,)
    n = plan.batch.num_microbatches
    base = traces[(BASE, BASE, steps[0])]
    phases = set.intersection(*(set(t.phases) for t in traces.values()))

    def at(phase: str, part: str, m: int) -> Fraction:
        value = Fraction(traces[(BASE, BASE, m)].phases[phase][part])
        for full, other, real in ((BASE + 1, BASE, real_full), (BASE, BASE + 1, real_other)):
            at_m = (full, other, m) if (full, other, m) in traces else (full, other, steps[0])
            base_m = m if at_m[2] == m else steps[0]
            if at_m in traces:
                value += (real - BASE) * (traces[at_m].phases[phase][part] - traces[(BASE, BASE, base_m)].phases[phase][part])
        return value

    def extended(phase: str, part: str) -> int:
        value = at(phase, part, steps[0])
        if len(steps) == 2:
            value += (at(phase, part, steps[1]) - value) * Fraction(n - steps[0], steps[1] - steps[0])
        return max(0, math.ceil(value))

    by_phase = {phase: {part: extended(phase, part) for part in PARTS} for phase in sorted(phases)}
    top = max(by_phase, key=lambda phase: sum(by_phase[phase].values()))
    parts = by_phase[top]
    return RankTrace(rank=rank, coords=base.coords, peak_bytes=sum(parts.values()), parts=parts,
                     workspace_bytes=base.workspace_bytes, microbatches=n if len(steps) == 2 else base.microbatches,
                     phases=by_phase)


# ------------------------------------------------------------------ every distinct rank, each in a child
def trace_plan(plan: LaunchPlan, *, target: str = "cuda") -> list[RankTrace]:
    """Every distinct rank's trace (distinct_ranks), in pipeline order, each in a forked child process where fork is
    available: each rank gets a fresh torch (no DTensor or DeviceMesh state left by the rank before, the stand-ins'
    patches of torch never in the caller's process); the pipeline metadata a stage sent goes on to the next child."""
    import multiprocessing

    sent: dict = {}  # pipeline metadata a stage sent, for the stages traced after it (gpu_contracts.pipeline_metadata)
    if "fork" not in multiprocessing.get_all_start_methods():
        return [trace_rank(plan, rank, target=target, sent=sent) for rank in distinct_ranks(plan)]
    preload()
    traces = []
    for rank in distinct_ranks(plan):
        trace, news = in_child(plan, rank, target, sent)
        sent.update(news)
        traces.append(trace)
    return traces


PRELOADED = ("planner.executor.runtime", "planner.executor.parallelize", "planner.executor.pipeline",
             "planner.executor.precision", "planner.executor.train", "planner.executor.zero1", "planner.executor.domino",
             "planner.executor.twobw_run", "planner.nn.model", "planner.nn.moe", "torch._subclasses.fake_tensor",
             "torch.testing._internal.distributed.fake_pg", "torch.distributed.fsdp", "torch.distributed.tensor.parallel",
             "torch.distributed.pipelining", "torch.distributed.algorithms._checkpoint.checkpoint_wrapper",
             "torch.distributed._composable.replicate", "torch._dynamo")


def preload() -> None:
    """Import, once in the caller, what every traced rank imports (about 1,000 modules, a second or more): the
    forked children inherit them instead of importing them each. Imports only: no state of torch's is touched."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)


def in_child(plan: LaunchPlan, rank: int, target: str, sent: dict) -> tuple[RankTrace, dict]:
    """trace_rank in a forked child; its result (or its error, raised here as RuntimeError) comes back by a pipe."""
    import multiprocessing

    context = multiprocessing.get_context("fork")
    receiver, sender = context.Pipe(duplex=False)

    def child() -> None:
        try:
            mine = dict(sent)
            trace = trace_rank(plan, rank, target=target, sent=mine)
            sender.send(("ok", trace, {k: v for k, v in mine.items() if k not in sent}))
        except BaseException as exc:  # every failure goes back as one line
            sender.send(("error", f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}", None))

    process = context.Process(target=child, daemon=True)
    process.start()
    sender.close()
    try:
        if not receiver.poll(TRACE_TIMEOUT_S):
            process.kill()
            raise RuntimeError(f"the trace of rank {rank} took over {TRACE_TIMEOUT_S:.0f} s: stopped")
        status, value, news = receiver.recv()
    except EOFError:
        process.join()
        status, value, news = "error", f"the trace of rank {rank} died (exit code {process.exitcode})", None
    process.join()
    if status != "ok":
        raise RuntimeError(value)
    return value, news
