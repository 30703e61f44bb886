"""Profiling: measured per-operator costs (torch) and communication calibrations.

Torch-free here and in `calibration` / `options`; torch only in `measure*.py` and `comm_bench*.py`,
imported by the CLI when a measurement is asked for, never by planning code.

- `measure.profile_model(spec, ProfileOptions)` -> `planner.schemas.profile.Profile`: one layer per
  type at a time, per TP/EP rank shape, per micro-batch size (see planner/profiling/measure.py).
- `comm_bench.run_comm_benchmark(...)` -> `calibration.CommCalibration`: alpha-beta fits of collectives
  measured with N local processes (gloo on CPU, NCCL on GPU).
- `planner.cost.profiled.profiled_layer_costs(...)` turns a Profile into per-layer times for the cost model.
"""

from planner.profiling.calibration import CommCalibration, CollectiveFit, load_calibration
from planner.profiling.options import ProfileOptions

__all__ = ["CollectiveFit", "CommCalibration", "ProfileOptions", "load_calibration"]
