"""The options `planner estimate` and `planner plan` share for how an MoE or long-context job communicates: the
dispatcher, overlap and context-parallel flavour it runs (Parallelism fields, planner.cost.pins) and the expert load
it plans for (MoESpec fields, planner.api.with_moe_fields). One spelling and one help text for both commands."""

from __future__ import annotations

from typing import Annotated, Optional, get_args

import typer

from planner.schemas.framework import MoeDispatcher
from planner.schemas.plan import MoeOverlap

# The values each stated choice takes (checked by both commands before any request is built).
MOE_CHOICES = {"moe_dispatcher": get_args(MoeDispatcher), "moe_overlap": get_args(MoeOverlap)}


def _option(kind: type, flag: str, text: str):
    """An optional typer option of `kind` (None: not stated)."""
    return Annotated[Optional[kind], typer.Option(flag, help=text)]


MoeDispatcherOption = _option(str, "--moe-dispatcher", (
    "MoE token dispatcher the job runs: alltoall | flex (DeepEP) | allgather, Megatron-Core's "
    "--moe-token-dispatcher-type (default: the fastest the framework runs)."))
MoeOverlapOption = _option(str, "--moe-overlap", (
    "MoE communication overlap the job runs: batch (--overlap-moe-expert-parallel-comm, DualPipe; where the layout "
    "allows it) | shared (--moe-shared-expert-overlap) | none (default: the best the framework runs)."))
CpCommTypeOption = _option(str, "--cp-comm-type", (
    "Context-parallel flavour the job runs, in the framework's spelling (Megatron-Core p2p | all_gather | a2a | "
    "a2a+p2p; default: the fastest it runs)."))
RoutingSkewOption = _option(float, "--routing-skew", (
    "MoE load imbalance to plan for: the slowest expert-parallel rank receives (1 + skew) x the mean routed tokens "
    "(default: the model's, 0 = balanced; `planner run` reports the skew a run saw)."))
CapacityFactorOption = _option(float, "--capacity-factor", (
    "MoE expert capacity factor: buffers padded to it, tokens past it dropped (default: the model's; dropless)."))
