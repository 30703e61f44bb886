"""From a measured Profile to the compute costs of one layer type at one shape (the cost model's bridge).

A profile holds entries per (layer_type, tp, ep, seq_len) at a few micro-batch sizes. For a requested
micro-batch size b:
- if b was measured, its numbers are returned as measured;
- else each quantity q (forward, backward, both recompute extras, the three saved-bytes figures) is fitted
  over the measured sizes by least squares, q(b) = alpha + beta * tokens with tokens = b * seq_len: a fixed
  cost per call (kernel launches, under-filled GEMM waves) plus a cost per token (Galvatron, Miao et al.
  2022, sec. 4.1, and Alpa's profiler interpolate the same way). With alpha < 0 the fit is redone through
  the origin, with beta < 0 (noise) q is the mean; one measured size scales proportionally to tokens.
  Saved bytes are exactly linear in tokens at fixed seq_len, so their fit is exact.
- Fits reach from micro-batch 1 to EXTRAPOLATION_LIMIT x the largest measured size; outside that range, for
  a seq_len, tp or ep never measured, or where every entry is "oom"/"error", the answer is None and the
  analytic model fills in (the plan's notes say which shapes did).
Parameter bytes do not depend on the micro-batch size and are taken as measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from planner.errors import BadInputError
from planner.profiling.calibration import fit_line
from planner.schemas.profile import LayerProfile, Profile

EXTRAPOLATION_LIMIT = 2.0  # largest micro-batch served = this x the largest measured one
TIME_FIELDS = ("forward_s", "backward_s", "recompute_selective_s", "recompute_full_s")
BYTE_FIELDS = ("saved_bytes", "saved_bytes_selective", "saved_bytes_full")


@dataclass(frozen=True, kw_only=True)
class ProfiledLayer:
    """One layer of one type on one GPU for one micro-batch, from measurement (seconds, bytes)."""

    forward_s: float
    backward_s: float
    recompute_selective_s: float  # extra backward time with selective recompute
    recompute_full_s: float  # extra backward time with full recompute
    saved_bytes: int  # saved for backward without recompute
    saved_bytes_selective: int
    saved_bytes_full: int  # the layer input only
    params_bytes: int  # in the profile's dtype, this rank's shard
    dtype: str  # the profile's dtype ("fp32", "bf16", "amp-bf16", ...)
    fit: str  # "measured", "least-squares", "proportional"
    measured_microbatch_sizes: tuple[int, ...]


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file (BadInputError naming the file and field on any problem)."""
    from planner.io import load_file

    return load_file(Profile, path)


def matching_entries(profile: Profile, *, layer_type: str, tp: int, ep: int, seq_len: int) -> list[LayerProfile]:
    """Entries measured ("ok") for this layer type and shape, one per micro-batch size, sorted by it."""
    by_size: dict[int, LayerProfile] = {}
    for entry in profile.entries:
        if (entry.status == "ok" and entry.layer_type == layer_type and entry.tp == tp and entry.ep == ep
                and entry.seq_len == seq_len):
            by_size[entry.microbatch_size] = entry
    return [by_size[size] for size in sorted(by_size)]


def _from_entry(entry: LayerProfile, dtype: str, sizes: tuple[int, ...]) -> ProfiledLayer:
    fields = {name: getattr(entry, name) for name in (*TIME_FIELDS, *BYTE_FIELDS)}
    return ProfiledLayer(**fields, params_bytes=entry.params_bytes, dtype=dtype, fit="measured",
                         measured_microbatch_sizes=sizes)


def profiled_layer_costs(profile: Profile, *, layer_type: str, tp: int, ep: int = 1, microbatch_size: int,
                         seq_len: int) -> ProfiledLayer | None:
    """Measured costs of `layer_type` at (tp, ep, microbatch_size, seq_len), interpolated over micro-batch
    sizes; None where the profile does not cover the shape (the analytic model fills in)."""
    entries = matching_entries(profile, layer_type=layer_type, tp=tp, ep=ep, seq_len=seq_len)
    if not entries:
        return None
    sizes = tuple(e.microbatch_size for e in entries)
    exact = next((e for e in entries if e.microbatch_size == microbatch_size), None)
    if exact is not None:
        return _from_entry(exact, profile.dtype, sizes)
    if microbatch_size < 1 or microbatch_size > EXTRAPOLATION_LIMIT * sizes[-1]:
        return None
    tokens = np.array([s * seq_len for s in sizes], dtype=np.float64)
    target = float(microbatch_size * seq_len)
    values = {}
    for name in (*TIME_FIELDS, *BYTE_FIELDS):
        alpha, beta = fit_line(tokens, np.array([getattr(e, name) for e in entries], dtype=np.float64))
        values[name] = max(0.0, alpha + beta * target)
    byte_values = {name: int(round(values.pop(name))) for name in BYTE_FIELDS}
    return ProfiledLayer(**values, **byte_values, params_bytes=entries[-1].params_bytes, dtype=profile.dtype,
                         fit="least-squares" if len(sizes) > 1 else "proportional", measured_microbatch_sizes=sizes)


def coverage(profile: Profile) -> list[str]:
    """Readable list of what the profile measured, e.g. 'decoder tp=1 ep=1 seq_len=2048 mbs 1,2,4'."""
    groups: dict[tuple[str, int, int, int], list[int]] = {}
    for entry in profile.entries:
        if entry.status == "ok":
            groups.setdefault((entry.layer_type, entry.tp, entry.ep, entry.seq_len), []).append(entry.microbatch_size)
    return [f"{kind} tp={tp} ep={ep} seq_len={seq} mbs {','.join(map(str, sorted(sizes)))}"
            for (kind, tp, ep, seq), sizes in sorted(groups.items())]


def require_profile_matches(profile: Profile, *, model_name: str) -> None:
    """A profile of another model cannot price this one: bad input naming both."""
    if profile.model_name != model_name:
        raise BadInputError(
            f"profile model_name={profile.model_name!r} does not match model {model_name!r}: "
            f"profile this model with `planner profile --model {model_name}`"
        )


PROFILE_DTYPE_OF_PRECISION = {"bf16": ("bf16", "amp-bf16"), "amp-bf16": ("amp-bf16",), "fp32": ("fp32",), "fp8": ("bf16", "amp-bf16")}


def precision_note(profile: Profile, precision: str) -> str | None:
    """A note for the plan when the profile's dtype is not the request's precision (its times then price
    another recipe); None when they agree."""
    if profile.dtype in PROFILE_DTYPE_OF_PRECISION.get(precision, (precision,)):
        return None
    return (f"profile dtype {profile.dtype} differs from precision {precision}: measured times are those of {profile.dtype}; "
            f"profile with --dtype {precision if precision != 'fp8' else 'bf16'} to match")
