"""JSON Schema (draft 2020-12) of every file format we read or write, from the strict pydantic schemas.

`planner schema plan` documents the LaunchPlan for tools that consume it (editors, CI linters, other
languages); the schemas are generated, so they never drift from what the loaders accept.
"""

from __future__ import annotations

from pydantic import BaseModel

from planner.errors import BadInputError
from planner.schemas.calibration import CalibrationOverlay
from planner.schemas.model import ModelSpec
from planner.schemas.plan import LaunchPlan, PlanRequest
from planner.schemas.profile import Profile
from planner.schemas.runs import MeasuredRuns
from planner.schemas.topology import Topology

FORMATS: dict[str, type[BaseModel]] = {
    "plan": LaunchPlan,
    "model": ModelSpec,
    "topology": Topology,
    "profile": Profile,
    "request": PlanRequest,
    "calibration": CalibrationOverlay,  # written by `planner calibrate`, read by --calibration
    "runs": MeasuredRuns,  # the JSON input of `planner calibrate`
}
DRAFT = "https://json-schema.org/draft/2020-12/schema"


def one_schema(name: str) -> dict:
    """The JSON Schema of one format, with $schema and $id set."""
    if name not in FORMATS:
        raise BadInputError(f"schema {name!r} is not a file format: choose one of {', '.join(FORMATS)}")
    schema = FORMATS[name].model_json_schema(mode="validation")
    return {"$schema": DRAFT, "$id": f"urn:planner:schema:{name}:1", **schema}


def json_schema(name: str | None = None) -> dict:
    """One format's schema, or {name: schema} for all of them when `name` is None."""
    if name is None:
        return {key: one_schema(key) for key in FORMATS}
    return one_schema(name)
