"""HTTP request bodies: strict (unknown fields -> 422 naming the field), named as the CLI options are.

`model` and `topology` take a preset name or an inline spec (the same ModelSpec / Topology schemas the
files use). Server-side file paths (HF config.json, profiles) are not accepted over HTTP.
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.schemas.model import ModelSpec
from planner.schemas.plan import Precision, RecomputeMode, Schedule, TpOverlap
from planner.schemas.topology import Topology


class PlanBody(BaseModel):
    """POST /v1/plan: what `planner plan` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    model: str | ModelSpec = Field(default="llama3-8b", description="preset name or inline model spec")
    topology: str | Topology = Field(default="dgx-h100", description="preset name or inline topology")
    gpus: int | None = Field(default=None, gt=0)
    nodes: int | None = Field(default=None, gt=0)
    global_batch_size: int | None = Field(default=None, gt=0)
    seq_len: int | None = Field(default=None, gt=0)
    precision: Precision = "bf16"
    time_limit_s: float = Field(default=30.0, gt=0)
    top_k: int = Field(default=3, ge=0, le=50)
    framework: str = Field(default="planner", pattern=r"^[a-z0-9][a-z0-9-]{0,63}$",
                           description="shipped framework profile the plan is made for (GET /v1/frameworks lists them)")
    allow_stale_weights: bool = Field(default=False, description="let the search choose PipeDream-2BW where the framework runs it")


class EstimateBody(PlanBody):
    """POST /v1/estimate: `planner estimate`'s fixed configuration on top of the plan fields."""

    dp: int | None = Field(default=None, gt=0, description="None = gpus / (tp * pp * cp)")
    tp: int = Field(default=1, gt=0)
    pp: int = Field(default=1, gt=0)
    ep: int = Field(default=1, gt=0)
    cp: int = Field(default=1, gt=0)
    sp: bool = False
    vpp: int = Field(default=1, gt=0)
    microbatch_size: int = Field(default=1, gt=0)
    zero_stage: Literal[0, 1, 2, 3] = 0
    schedule: Schedule = "1f1b"
    recompute: RecomputeMode = "none"
    tp_overlap: TpOverlap = "none"


def request_key(kind: str, body: BaseModel) -> str:
    """sha256 of the canonical request JSON: identical requests share a key, hence a stored answer."""
    canonical = json.dumps({"kind": kind, "request": body.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
