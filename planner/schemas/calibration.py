"""A calibration overlay: the cost model's constants re-derived from a user's own measured runs.

`planner calibrate` writes one (planner.calibrate) from Megatron-LM or torchtitan logs or a JSON of measured runs;
`plan`/`estimate --calibration FILE` read it. It replaces, for one device family and one software stack, the two
constants benchmarks/accuracy.py --derive derives from published runs for calibration.yaml: the achieved GEMM ceiling
(median of the runs' implied ceilings, planner.cost.derivation) and the per-step loop overhead. It carries its own
evidence: every run with its measured and predicted step time, the leave-one-run-out error, and its provenance.
The measured runs themselves (the input) are planner.schemas.runs.
"""

from typing import Literal

from pydantic import Field

from planner.schemas import limits as L
from planner.schemas.base import InputSchema

OVERLAY_SCHEMA_VERSION = "1"


class RunFit(InputSchema):
    """One run in the overlay: what was measured, what the shipped and the overlay constants predict."""

    name: str
    measured_step_s: float = Field(gt=0)
    predicted_shipped_s: float = Field(gt=0)
    predicted_overlay_s: float = Field(gt=0)
    leave_one_out_s: float | None = Field(default=None, gt=0, description="predicted with constants derived from the other runs")
    implied_ceiling: float = Field(gt=0, le=1)
    measured_peak_gib: float | None = None
    predicted_peak_gib: float = Field(ge=0)


class LeaveOneOut(InputSchema):
    runs: int = Field(ge=0)
    median_abs_error: float | None = Field(default=None, ge=0)
    max_abs_error: float | None = Field(default=None, ge=0)


class CalibrationOverlay(InputSchema):
    """Constants for one (device family, software stack), derived from the user's runs."""

    schema_version: Literal["1"] = OVERLAY_SCHEMA_VERSION
    kind: Literal["calibration-overlay"] = "calibration-overlay"
    device_family: str = Field(min_length=1, description="calibration.yaml family the runs' GPU belongs to (hopper, ampere, ...)")
    device: str = Field(min_length=1, description="the GPU the runs ran on")
    framework: str = Field(min_length=1, description="the stack the runs ran on")
    matmul_ceiling_fraction: float = Field(gt=0, le=1, description="achieved GEMM rate / datasheet peak (median implied)")
    step_overhead_s: float = Field(ge=0, le=1e3, description="per-step loop overhead outside the micro-batches")
    shipped: dict[str, float] = Field(default_factory=dict, description="the shipped values these replace")
    leave_one_out: LeaveOneOut
    runs: list[RunFit] = Field(min_length=1)
    provenance: dict[str, str | list[str]] = Field(default_factory=dict)
