"""Pictures of a plan (matplotlib, Agg, imported lazily): the pipeline schedule as a timeline, memory per
pipeline rank as stacked bars against capacity, and the candidates as throughput vs memory.

The timeline is simulated from the plan's per-stage forward/backward times: each pipeline rank runs its
ops in the schedule's order, an op starts when its rank is free and its dependency is done (forward of
stage s after forward of s-1 for the same micro-batch; backward of s after backward of s+1; the last
stage's backward after its forward). Op orders:
- GPipe: all forwards, then all backwards (Huang et al. 2019).
- 1F1B / PipeDream-Flush: pp - rank - 1 warm-up forwards, then one forward one backward, then the
  remaining backwards (Narayanan et al. 2021, section 2.2); 2BW and zero-bubble are drawn with this order.
- Interleaved 1F1B: Megatron-LM's order, warm-up (pp - rank - 1) * 2 + (vpp - 1) * pp forwards; the k-th
  forward runs chunk (k // pp) % vpp on micro-batch (k // (pp * vpp)) * pp + k % pp, backwards mirror it.
Point-to-point transfer times are not drawn. At most MAX_DRAWN_MICROBATCHES micro-batches are drawn.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from planner.errors import BadInputError
from planner.schedules import GPIPE, INTERLEAVED
from planner.schedules import schedule as schedule_of
from planner.schemas.plan import LaunchPlan

MAX_DRAWN_MICROBATCHES = 8
MEMORY_PARTS = (("params_bytes", "weights", "#4C72B0"), ("grads_bytes", "gradients", "#55A868"),
                ("optimizer_bytes", "optimizer", "#C44E52"), ("activations_bytes", "activations", "#8172B2"),
                ("other_bytes", "other", "#CCB974"))


@dataclass(frozen=True)
class Op:
    """One forward ("F") or backward ("B") of one micro-batch on one virtual stage."""

    kind: str
    microbatch: int
    stage: int


@dataclass(frozen=True)
class Slot:
    rank: int
    op: Op
    start_s: float
    end_s: float


def rank_order(schedule: str, *, rank: int, pp: int, vpp: int, m: int) -> list[Op]:
    """The op order of one pipeline rank (see the module docstring)."""
    if vpp > 1:
        return _interleaved_order(rank=rank, pp=pp, vpp=vpp, m=m)
    if schedule_of(schedule) is GPIPE:  # all forwards, then all backwards
        return [Op("F", i, rank) for i in range(m)] + [Op("B", i, rank) for i in range(m)]
    warmup = min(pp - rank - 1, m)
    ops = [Op("F", i, rank) for i in range(warmup)]
    for i in range(m - warmup):
        ops += [Op("F", warmup + i, rank), Op("B", i, rank)]
    return ops + [Op("B", i, rank) for i in range(m - warmup, m)]


def _interleaved_order(*, rank: int, pp: int, vpp: int, m: int) -> list[Op]:
    total = m * vpp

    def forward(k: int) -> Op:
        return Op("F", (k // (pp * vpp)) * pp + k % pp, ((k // pp) % vpp) * pp + rank)

    def backward(k: int) -> Op:
        return Op("B", (k // (pp * vpp)) * pp + k % pp, (vpp - 1 - (k // pp) % vpp) * pp + rank)

    warmup = min((pp - rank - 1) * 2 + (vpp - 1) * pp, total)
    ops = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        ops += [forward(warmup + k), backward(k)]
    return ops + [backward(k) for k in range(total - warmup, total)]


def simulate(plan: LaunchPlan, *, max_microbatches: int = MAX_DRAWN_MICROBATCHES) -> tuple[list[Slot], int]:
    """(slots, micro-batches drawn): a dependency-driven timeline of the plan's schedule."""
    par = plan.parallelism
    pp, vpp, stages = par.pp, par.vpp, par.pp * par.vpp
    m = min(plan.batch.num_microbatches, max(max_microbatches, pp))
    if vpp > 1:
        m -= m % pp  # Megatron's interleaved order needs whole rounds of pp micro-batches
        if m == 0:
            raise BadInputError(f"interleaved schedule with num_microbatches={plan.batch.num_microbatches} < pp={pp}: the plan is inconsistent")
    times = {s.stage: s.time for s in plan.stages}
    if any(times.get(s) is None for s in range(stages)):
        raise BadInputError("the plan has no per-stage times (stages[].time): regenerate it with `planner plan` or `planner estimate`")
    orders = [rank_order(plan.schedule, rank=r, pp=pp, vpp=vpp, m=m) for r in range(pp)]
    done: dict[Op, float] = {}
    free, cursor, slots = [0.0] * pp, [0] * pp, []
    progress = True
    while progress:
        progress = False
        for rank in range(pp):
            while cursor[rank] < len(orders[rank]):
                op = orders[rank][cursor[rank]]
                dep = _dependency(op, stages)
                if dep is not None and dep not in done:
                    break
                start = max(free[rank], done.get(dep, 0.0) if dep else 0.0)
                duration = times[op.stage].forward_s if op.kind == "F" else times[op.stage].backward_s
                done[op] = free[rank] = start + duration
                slots.append(Slot(rank, op, start, start + duration))
                cursor[rank] += 1
                progress = True
    if any(cursor[r] < len(orders[r]) for r in range(pp)):
        raise BadInputError(f"schedule {plan.schedule!r} with pp={pp} vpp={vpp} m={m} deadlocks: the plan is inconsistent")
    return slots, m


def _dependency(op: Op, stages: int) -> Op | None:
    if op.kind == "F":
        return Op("F", op.microbatch, op.stage - 1) if op.stage > 0 else None
    if op.stage == stages - 1:
        return Op("F", op.microbatch, op.stage)
    return Op("B", op.microbatch, op.stage + 1)


def _draw_timeline(ax, plan: LaunchPlan) -> None:
    slots, m = simulate(plan)
    pp, vpp = plan.parallelism.pp, plan.parallelism.vpp
    colors = {"F": "#4C72B0", "B": "#DD8452"}
    for slot in slots:
        chunk = slot.op.stage // pp
        ax.barh(slot.rank, slot.end_s - slot.start_s, left=slot.start_s, height=0.8, color=colors[slot.op.kind],
                edgecolor="black", linewidth=0.4, alpha=1.0 - 0.35 * chunk / max(vpp - 1, 1) if vpp > 1 else 1.0)
        if slot.end_s - slot.start_s > 0.02 * max(s.end_s for s in slots):
            ax.text((slot.start_s + slot.end_s) / 2, slot.rank, str(slot.op.microbatch), ha="center", va="center", fontsize=6, color="white")
    end = max(s.end_s for s in slots)
    busy = sum(s.end_s - s.start_s for s in slots)
    ax.set_yticks(range(pp), [f"rank {r}" for r in range(pp)])
    ax.invert_yaxis()
    ax.set_xlabel("time (s)")
    shown = f"{m} of {plan.batch.num_microbatches} micro-batches" + (" (capped)" if m < plan.batch.num_microbatches else "")
    note = schedule_of(plan.schedule).drawing_note
    drawn_as = f" (drawn in 1F1B order; {note})" if note and vpp == 1 else ""
    if vpp > 1 and schedule_of(plan.schedule) is not INTERLEAVED:  # zero-bubble / torch's names: their own orders are not drawn
        drawn_as = " (drawn in interleaved 1F1B order, stages looped; its own order and V placement not drawn)"
    kind = "no pipeline (pp=1)" if pp == 1 else f"{plan.schedule} pipeline, pp={pp}" + (f" vpp={vpp}" if vpp > 1 else "") + drawn_as
    ax.set_title(kind +
                 f": {shown}; idle (bubble) {1 - busy / (end * pp):.0%} in this window", fontsize=9)
    from matplotlib.patches import Patch

    handles = [Patch(color=colors["F"], label="forward"), Patch(color=colors["B"], label="backward"),
               Patch(facecolor="white", edgecolor="black", label="white gaps = bubble")]
    if vpp > 1:
        handles.append(Patch(facecolor="#B0B0B0", label="lighter = later virtual stage"))
    ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _draw_memory(ax, plan: LaunchPlan) -> None:
    from planner.units import GiB

    stages = plan.memory.per_stage
    bottoms = [0.0] * len(stages)
    xs = [f"rank {s.stage}" for s in stages]
    for attr, label, color in MEMORY_PARTS:
        values = [getattr(s, attr) / GiB for s in stages]
        ax.bar(xs, values, bottom=bottoms, color=color, label=label)
        bottoms = [b + v for b, v in zip(bottoms, values)]
    cap = plan.memory.capacity_bytes / GiB
    ax.axhline(cap, color="red", linestyle="--", linewidth=1)
    ax.text(len(stages) - 0.5, cap, f" capacity {cap:.0f} GiB", color="red", va="bottom", ha="right", fontsize=7)
    ax.set_ylim(0, max([cap, *bottoms]) * 1.3)  # room above the capacity line for the legend
    ax.set_ylabel("GiB per GPU")
    ax.set_title("memory per pipeline rank", fontsize=9)
    ax.legend(fontsize=7, loc="upper center", ncol=5)


def _draw_candidates(ax, plan: LaunchPlan) -> None:
    """Throughput vs peak memory: the chosen plan (star) and the plan's alternatives, on the same formula."""
    from planner.explain import degrees_text
    from planner.units import GiB

    tokens = plan.batch.global_batch_size * plan.batch.seq_len
    cap = plan.memory.capacity_bytes / GiB
    points = [(alt.peak_bytes / GiB, tokens / alt.step_time_s, degrees_text(alt.parallelism) + f" {alt.schedule}")
              for alt in plan.alternatives if alt.step_time_s > 0]
    chosen = (plan.memory.peak_bytes / GiB, tokens / plan.prediction.step_time_s if plan.prediction.step_time_s > 0 else 0.0)
    for index, (x, y, label) in enumerate(points):
        ax.scatter(x, y, color="#8C8C8C", s=25)
        left = x > 0.5 * cap
        ax.annotate(label, (x, y), fontsize=6, xytext=(-4 if left else 4, 4 + 7 * (index % 3)), textcoords="offset points",
                    ha="right" if left else "left")
    ax.scatter(*chosen, marker="*", s=220, color="#C44E52", edgecolor="black", zorder=3, label="chosen")
    left = chosen[0] > 0.5 * cap
    ax.annotate(degrees_text(plan.parallelism) + f" {plan.schedule} (chosen)", chosen, fontsize=7, xytext=(-6 if left else 6, -14),
                textcoords="offset points", ha="right" if left else "left")
    ax.axvline(cap, color="red", linestyle="--", linewidth=1, label="capacity")
    ys = [y for _, y, _ in points] + [chosen[1]]
    ax.set_ylim(min(ys) * 0.9, max(ys) * 1.1)
    ax.set_xlim(0, cap * 1.08)
    ax.ticklabel_format(axis="y", style="plain", useOffset=False)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("tokens / s")
    count = len(points)
    ax.set_title(f"chosen plan vs {count} recorded alternative{'s' if count != 1 else ''} (plan.alternatives)", fontsize=9)
    ax.legend(fontsize=7, loc="lower left")


def plot_plan(plan: LaunchPlan, output: str | Path) -> Path:
    """Write the three-panel PNG and return its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(13, 8), constrained_layout=True)
    grid = fig.add_gridspec(2, 2, height_ratios=[1.1, 1])
    _draw_timeline(fig.add_subplot(grid[0, :]), plan)
    _draw_memory(fig.add_subplot(grid[1, 0]), plan)
    _draw_candidates(fig.add_subplot(grid[1, 1]), plan)
    from planner.explain import degrees_text

    req = plan.request
    fig.suptitle(f"{req.model.name} on {req.gpus} x {req.topology.device.name}: {degrees_text(plan.parallelism)}, "
                 f"{plan.prediction.step_time_s:.3g} s/step, MFU {plan.prediction.mfu:.1%}", fontsize=11)
    target = Path(output)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp.png")
    try:
        fig.savefig(tmp, dpi=110)
        tmp.replace(target)
    finally:
        plt.close(fig)
        tmp.unlink(missing_ok=True)
    return target
