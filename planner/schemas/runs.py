"""Measured training runs: the input of `planner calibrate` (what its log parsers produce, or a JSON file of them).

A MeasuredRun is one run on the user's cluster: the configuration it ran, the measured step time and peak memory.
"""

from pydantic import Field

from planner.schemas import limits as L
from planner.schemas.base import InputSchema
from planner.schemas.model import ModelSpec
from planner.schemas.plan import Configuration, Precision

MAX_RUNS = 100  # leave-one-run-out refits per run: time grows with the square of the runs (about 1 s for 20)


class MeasuredRun(InputSchema):
    """One training run as measured on the user's cluster: its configuration, step time and peak memory."""

    name: str = Field(min_length=1, max_length=200, description="a label for reports (default: the file name)")
    model: str | ModelSpec = Field(description="preset name, model spec / HF config.json path, or an inline spec")
    framework: str = Field(min_length=1, description="the stack that ran it (`planner framework list`)")
    gpus: int = Field(gt=0, le=L.MAX_GPUS)
    global_batch_size: int = Field(gt=0, le=L.MAX_GLOBAL_BATCH_SIZE)
    seq_len: int = Field(gt=0, le=L.MAX_SEQ_LEN)
    precision: Precision = "bf16"
    configuration: Configuration
    step_time_s: float = Field(gt=0, le=1e6, description="measured seconds per optimizer step (steady state)")
    peak_memory_gib: float | None = Field(default=None, gt=0, le=1e5, description="measured peak GPU memory (GiB), max over ranks")
    source: str | None = Field(default=None, description="the file and lines the numbers were read from")


class MeasuredRuns(InputSchema):
    """The JSON input of `planner calibrate`: measured runs on one cluster with one stack."""

    topology: str | None = Field(default=None, description="preset name or file of the cluster (or --topology)")
    runs: list[MeasuredRun] = Field(min_length=1, max_length=MAX_RUNS)
