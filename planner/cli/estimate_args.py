"""Turn `planner estimate` options into a Configuration (validation errors become one-line bad input)."""

from __future__ import annotations

from pydantic import ValidationError

from planner.errors import BadInputError
from planner.io import format_validation_error
from planner.schemas.plan import Configuration, Parallelism, PlanRequest

CHOICES = {
    "recompute": ("none", "selective", "full"),
    "schedule": ("gpipe", "1f1b", "interleaved", "2bw", "zero-bubble"),
    "tp_overlap": ("none", "domino"),
    "zero": (0, 1, 2, 3),
    "precision": ("bf16", "amp-bf16", "fp32", "fp8"),
}


def check_request_flags(*, precision: str, global_batch_size: int | None, seq_len: int | None) -> None:
    """Flags that go into the PlanRequest, checked first so that bad values are one line, not a traceback."""
    if precision not in CHOICES["precision"]:
        raise BadInputError(f"--precision={precision}: choose one of {', '.join(CHOICES['precision'])}")
    for name, value in (("global-batch-size", global_batch_size), ("seq-len", seq_len)):
        if value is not None and value < 1:
            raise BadInputError(f"--{name}={value} must be at least 1")


def configuration(request: PlanRequest, *, dp: int | None, tp: int, pp: int, ep: int, cp: int, sp: bool, vpp: int,
                  zero: int, tp_overlap: str, microbatch_size: int, schedule: str, recompute: str) -> Configuration:
    """The Configuration of the flags; dp defaults to gpus / (tp*pp*cp), which must divide."""
    for name, value in (("recompute", recompute), ("schedule", schedule), ("tp_overlap", tp_overlap), ("zero", zero)):
        if value not in CHOICES[name]:
            raise BadInputError(f"--{name.replace('_', '-')}={value}: choose one of {', '.join(map(str, CHOICES[name]))}")
    for name, value in (("tp", tp), ("pp", pp), ("ep", ep), ("cp", cp), ("vpp", vpp), ("microbatch-size", microbatch_size)):
        if value < 1:
            raise BadInputError(f"--{name}={value} must be at least 1")
    model_parallel = tp * pp * cp
    if dp is None:
        if request.gpus % model_parallel:
            raise BadInputError(
                f"tp*pp*cp={tp}*{pp}*{cp}={model_parallel} does not divide gpus={request.gpus}: choose degrees whose "
                f"product divides {request.gpus}, or pass --gpus as a multiple of {model_parallel}"
            )
        dp = request.gpus // model_parallel
    if dp * model_parallel != request.gpus:
        raise BadInputError(f"dp*tp*pp*cp={dp}*{tp}*{pp}*{cp}={dp * model_parallel} must equal gpus={request.gpus}: drop --dp or fix it")
    try:
        parallelism = Parallelism(dp=dp, tp=tp, pp=pp, ep=ep, cp=cp, sp=sp, vpp=vpp, zero_stage=zero, tp_overlap=tp_overlap)
        return Configuration(parallelism=parallelism, microbatch_size=microbatch_size, schedule=schedule, recompute=recompute)
    except ValidationError as exc:
        raise BadInputError(format_validation_error(exc, "configuration")) from None
