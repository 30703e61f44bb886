"""Strict, versioned pydantic schemas for every file format: model spec, topology, profile, launch plan.

The names below are loaded on first use (PEP 562), not when the package is: importing one schema module
(`planner.schemas.model`, for `planner models list`) then builds only that module's pydantic classes, not the
launch plan's and the topology's as well (about 25 ms of a CLI call's start-up; benchmarks/cli_startup.py).
"""

import importlib

# public name -> the module under planner.schemas that defines it
EXPORTS = {"MLASpec": "model", "ModelSpec": "model", "MoESpec": "model", "LaunchPlan": "plan", "Parallelism": "plan",
           "PlanRequest": "plan", "DeviceSpec": "topology", "Topology": "topology"}


def __getattr__(name: str):
    """`planner.schemas.ModelSpec` and `from planner.schemas import ModelSpec`: import the defining module now."""
    if name not in EXPORTS:
        raise AttributeError(f"module 'planner.schemas' has no attribute {name!r}")
    return getattr(importlib.import_module(f"planner.schemas.{EXPORTS[name]}"), name)


__all__ = sorted(EXPORTS)
