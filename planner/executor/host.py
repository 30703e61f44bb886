"""How busy the host's CPUs were around a run: a run on a loaded CPU measures the contention, not the plan.

`planner run` on CPU (gloo) times steps by the wall clock; other processes on the same cores (or more rank threads
than cores) stretch them, and the report's error then says nothing about the cost model (an "error -83%" on a box
with load 3.9 on 2 cores). The 1-minute load average (os.getloadavg) before and after the run, the usable cores
(the process's CPU affinity) and the run's own threads (ranks x threads per rank) decide `loaded`; the CLI prints
it beside the error.
"""

from __future__ import annotations

import os

from pydantic import Field

from planner.schemas.base import Schema

BUSY_FRACTION = 0.5  # other work above half the cores counts as a loaded CPU


class HostLoad(Schema):
    cores: int = Field(gt=0, description="CPUs this process may run on (affinity)")
    load_average_before: float = Field(ge=0, description="1-minute load average when the run started")
    load_average_after: float = Field(ge=0, description="1-minute load average when it ended (includes the run itself)")
    ranks: int = Field(gt=0)
    threads_per_rank: int = Field(gt=0)
    loaded: bool = Field(description="other work or the run's own threads exceeded the cores: timings unreliable")
    summary: str = Field(description="one line for reports, e.g. 'CPU loaded: load average 3.9 on 2 cores; timings unreliable'")


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> float:
    try:
        return float(os.getloadavg()[0])
    except (AttributeError, OSError):
        return 0.0


def host_load(*, before: float, after: float, cores: int, ranks: int, threads_per_rank: int) -> HostLoad:
    """The verdict: loaded when the load not ours (before the run, or after less the run's own threads) passes
    BUSY_FRACTION of the cores, or when the run alone asks for more threads than there are cores."""
    own = ranks * threads_per_rank
    others = max(before, after - min(own, cores))
    oversubscribed = own > cores
    loaded = others > BUSY_FRACTION * cores or oversubscribed
    summary = f"load average {max(before, after):.1f} on {cores} core{'s' if cores != 1 else ''}"
    if oversubscribed:
        summary += f", {ranks} ranks x {threads_per_rank} threads"
    summary = f"CPU loaded: {summary}; timings unreliable" if loaded else f"CPU idle enough: {summary}"
    return HostLoad(cores=cores, load_average_before=before, load_average_after=after, ranks=ranks,
                    threads_per_rank=threads_per_rank, loaded=loaded, summary=summary)
