"""Exporters: a LaunchPlan translated to the configuration of a framework people already run.

Each target checks that framework's own validity rules and refuses (BadInputError, exit 2) what it cannot
express, naming the framework's reason and the fix. Pure functions: no I/O here.
"""

from __future__ import annotations

from collections.abc import Callable

from planner.errors import BadInputError
from planner.export.common import Export
from planner.export.deepspeed import export_deepspeed
from planner.export.megatron import export_megatron
from planner.export.scripts import export_slurm, export_torchrun
from planner.export.torchtitan import export_torchtitan
from planner.schemas.plan import LaunchPlan

EXPORTERS: dict[str, Callable[[LaunchPlan], Export]] = {
    "torchtitan": export_torchtitan,
    "megatron": export_megatron,
    "deepspeed": export_deepspeed,
    "torchrun": export_torchrun,
    "slurm": export_slurm,
}
TARGETS = tuple(EXPORTERS)


def export_plan(plan: LaunchPlan, target: str) -> Export:
    """Translate `plan` for `target` (one of TARGETS)."""
    if target not in EXPORTERS:
        raise BadInputError(f"--to {target!r} is not an export target: choose one of {', '.join(TARGETS)}")
    return EXPORTERS[target](plan)


__all__ = ["EXPORTERS", "TARGETS", "Export", "export_plan"]
