"""HTTP request bodies: strict (unknown fields -> 422 naming the field), named as the CLI options are.

`model` and `topology` take a preset name or an inline spec (the same ModelSpec / Topology schemas the
files use). Server-side file paths (HF config.json, profiles) are not accepted over HTTP.
"""

from __future__ import annotations

import hashlib
import json
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.schemas import limits as L
from planner.schemas.model import ModelSpec
from planner.schedules import DEFAULT as DEFAULT_SCHEDULE
from planner.schemas.plan import (Precision, RecomputeMode, RecomputeModule, Schedule, StatedCpCommType, StatedDispatcher,
                                   StatedMoeOverlap, TpOverlap)
from planner.schemas.topology import Topology


PresetName = Annotated[str, Field(min_length=1, max_length=200)]


class PlanBody(BaseModel):
    """POST /v1/plan: what `planner plan` takes."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=(), allow_inf_nan=False)

    model: PresetName | ModelSpec = Field(default="llama3-8b", description="preset name (GET /v1/models) or inline model spec")
    topology: PresetName | Topology = Field(default="dgx-h100", description="preset name (GET /v1/topologies) or inline topology")
    gpus: int | None = Field(default=None, gt=0, le=L.MAX_GPUS, description="also bounded by the service's --max-gpus")
    nodes: int | None = Field(default=None, gt=0, le=L.MAX_NODES)
    global_batch_size: int | None = Field(default=None, gt=0, le=L.MAX_GLOBAL_BATCH_SIZE, description="sequences per step")
    seq_len: int | None = Field(default=None, gt=0, le=L.MAX_SEQ_LEN)
    precision: Precision = "bf16"
    time_limit_s: float = Field(default=30.0, gt=0, le=L.MAX_TIME_LIMIT_S,
                                description="the whole solve stops by then (+ the service's grace); also bounded by the service's limit")
    top_k: int = Field(default=3, ge=0, le=L.MAX_TOP_K)
    framework: str = Field(default="planner", pattern=r"^[a-z0-9][a-z0-9-]{0,63}$",
                           description="shipped framework profile the plan is made for (GET /v1/frameworks lists them)")
    allow_stale_weights: bool = Field(default=False, description="let the search choose PipeDream-2BW where the framework runs it")
    prefer_practice: bool = Field(default=True, description="within the ranking band of the fastest plan, prefer one inside "
                                  "the framework's practice; false: the fastest predicted (`planner plan --fastest`)")
    routing_skew: float | None = Field(default=None, ge=0, le=100, description=(
        "MoE load imbalance to plan for: the slowest expert-parallel rank receives (1 + skew) x the mean routed "
        "tokens; None = the model's (`--routing-skew`)"))
    capacity_factor: float | None = Field(default=None, gt=0, le=L.MAX_CAPACITY_FACTOR, description=(
        "MoE expert capacity factor, tokens past it dropped; None = the model's (`--capacity-factor`)"))
    moe_dispatcher: StatedDispatcher = None  # a plan prices only what is stated (SearchLimits)
    moe_overlap: StatedMoeOverlap = None
    cp_comm_type: StatedCpCommType = None
    compression: str = Field(default="none", max_length=200, pattern=r"^[a-z0-9:,+ -]+$", description=(
        "communication compression, as `--compression` spells it: none | auto (plan only) | zeropp | a comma list of "
        "qwz, hpz[:N], qgz, powersgd:RANK, bf16-grads, fp16-grads, fp8-dispatch"))


class EstimateBody(PlanBody):
    """POST /v1/estimate: `planner estimate`'s fixed configuration on top of the plan fields."""

    dp: int | None = Field(default=None, gt=0, le=L.MAX_DEGREE, description="None = gpus / (tp * pp * cp)")
    tp: int = Field(default=1, gt=0, le=L.MAX_DEGREE)
    pp: int = Field(default=1, gt=0, le=L.MAX_DEGREE)
    ep: int = Field(default=1, gt=0, le=L.MAX_DEGREE)
    cp: int = Field(default=1, gt=0, le=L.MAX_DEGREE)
    sp: bool = False
    vpp: int = Field(default=1, gt=0, le=L.MAX_LAYERS)
    microbatch_size: int = Field(default=1, gt=0, le=L.MAX_GLOBAL_BATCH_SIZE)
    zero_stage: Literal[0, 1, 2, 3] = 0
    schedule: Schedule = DEFAULT_SCHEDULE.name
    recompute: RecomputeMode = "none"
    recompute_modules: tuple[RecomputeModule, ...] = Field(default=(), max_length=7, description=(
        "with recompute selective: what it reruns, Megatron-Core --recompute-modules names; () = the framework's own"))
    tp_overlap: TpOverlap = "none"
    stage_layers: tuple[Annotated[int, Field(ge=0, le=L.MAX_LAYERS)], ...] | None = Field(
        default=None, max_length=L.MAX_LAYERS + 2,
        description="decoder layers per virtual stage (pp*vpp entries, stage = v*pp + r); None = balanced; a split the "
                    "framework cannot build is refused with its rule (planner.frameworks_split)")


class FieldError(BaseModel):
    """One problem of a request body: where (`loc`), what (`msg`, `type`) and the value given (`input`)."""

    loc: list[str | int]
    msg: str
    type: str
    input: object | None = None


class ErrorBody(BaseModel):
    """Every error answer: `detail` is one line (the field, the value and the fix), or for a body that does not
    match the schema (422) the list of field problems."""

    detail: str | list[FieldError]


def request_key(kind: str, body: BaseModel) -> str:
    """sha256 of the canonical request JSON: identical requests share a key, hence a stored answer."""
    canonical = json.dumps({"kind": kind, "request": body.model_dump(mode="json")}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
