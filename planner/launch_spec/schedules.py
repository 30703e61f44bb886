"""Pipeline schedule geometry of the executor: which torch schedules it runs by torch's own name, which place two
virtual stages per rank in a V, which split the backward (zero bubble), and which rank holds a virtual stage.

What the executor runs at all is the `planner` framework profile (planner/data/frameworks/planner.yaml); this module only
says where stages sit, for the runtime, the run report and the tests.
"""

from __future__ import annotations

# torch.distributed.pipelining schedules the executor also runs by torch's name (plan files, `planner run`):
# ScheduleInterleavedZeroBubble (= zero-bubble), ScheduleZBVZeroBubble and ScheduleDualPipeV (V placement:
# pipeline rank r holds virtual stages r and 2*pp-1-r, so vpp must be 2).
TORCH_SCHEDULES = ("interleaved-zero-bubble", "zbv", "dualpipev")
V_SCHEDULES = ("zbv", "dualpipev")
ZERO_BUBBLE_SCHEDULES = ("zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev")
# The torch.distributed.pipelining class each schedule name builds (planner/executor/pipeline.py build_schedule builds
# it; the `planner` judge constructs it too), and those that take several stages per rank. 2bw has no class: it runs
# on the executor's own send/recv loop (planner/executor/twobw.py).
SCHEDULE_CLASSES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved": "ScheduleInterleaved1F1B",
    "zero-bubble": "ScheduleInterleavedZeroBubble",
    "interleaved-zero-bubble": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}
MULTI_STAGE = ("interleaved", "zero-bubble", "interleaved-zero-bubble", "zbv", "dualpipev")


def stage_rank(stage: int, *, pp: int, schedule: str) -> int:
    """Pipeline rank of virtual stage `stage`: looped (s % pp), or V-shaped for zbv/dualpipev."""
    if schedule in V_SCHEDULES:
        return stage if stage < pp else 2 * pp - 1 - stage
    return stage % pp
