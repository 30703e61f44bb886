"""A user's calibration overlay (planner.schemas.calibration, written by `planner calibrate`) applied to the cost model.

The overlay holds the two constants benchmarks/accuracy.py --derive derives per (device family, stack) from
published runs, re-derived from the user's own runs: the GEMM ceiling and the per-step loop overhead. It applies
only to the family and stack it was derived for: a plan for another GPU family or another stack is refused rather
than priced with constants that say nothing about it.
"""

from __future__ import annotations

import dataclasses

from planner.cost.calibration import DeviceCalibration, device_calibration
from planner.errors import BadInputError
from planner.schemas.calibration import CalibrationOverlay
from planner.schemas.topology import DeviceSpec


def overlay_mismatch(overlay: CalibrationOverlay, device: DeviceSpec, framework: str) -> str | None:
    """Why the overlay does not apply to a request on `device` run by `framework` (None: it applies)."""
    family = device_calibration(device).family
    if overlay.device_family != family or overlay.framework != framework:
        return (f"calibration was derived for {overlay.framework} on {overlay.device_family} ({overlay.device}); this "
                f"request is {framework} on {family} ({device.name}): pass --framework {overlay.framework} and a "
                f"{overlay.device_family} topology, calibrate from runs of this stack and GPU, or drop --calibration")
    return None


def apply_overlay(cal: DeviceCalibration, overlay: CalibrationOverlay, device: DeviceSpec, framework: str) -> DeviceCalibration:
    """The calibration with the overlay's GEMM ceiling (its step overhead is read by CostModel)."""
    why = overlay_mismatch(overlay, device, framework)
    if why:
        raise BadInputError(why)
    loo = overlay.leave_one_out
    error = f", leave-one-run-out median error {loo.median_abs_error:.1%}" if loo.median_abs_error is not None else ""
    source = (f"calibration overlay from {len(overlay.runs)} measured run(s) of {overlay.framework} on {overlay.device}"
              f"{error} ({overlay.provenance.get('created_by', 'planner calibrate')})")
    return dataclasses.replace(cal, matmul_ceiling_fraction=overlay.matmul_ceiling_fraction, stack=overlay.framework,
                               source=source)
