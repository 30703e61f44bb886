"""Communication calibration: measured collective times fitted by the alpha-beta model (schema version 1).

`planner profile comm` times each collective at several message sizes with N local processes and fits,
by least squares, t(bytes) = alpha + bus_bytes(bytes) / bandwidth, where bus_bytes follows the nccl-tests
convention (PERFORMANCE.md, "bus bandwidth"): all-reduce moves 2(n-1)/n of the buffer over each link,
all-gather / reduce-scatter / all-to-all (n-1)/n of it, point-to-point all of it. The fitted bandwidth is
therefore comparable with a topology's `bandwidth_GBps` (achieved per-GPU per-direction bus bandwidth), and
alpha divided by the ring's step count (2(n-1) for all-reduce, n-1 for the others, 1 for p2p; Thakur et
al. 2005, sec. 4) with its `latency_s`. A topology references a calibration file via `comm_calibration`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import Field

from planner.schemas.base import Schema

CALIBRATION_SCHEMA_VERSION = "1"
Collective = Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
COLLECTIVES: tuple[str, ...] = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def bus_factor(collective: str, world_size: int) -> float:
    """Bytes over each link per byte of message (nccl-tests bus-bandwidth factors)."""
    n = world_size
    if collective == "all_reduce":
        return 2 * (n - 1) / n
    if collective == "send_recv":
        return 1.0
    return (n - 1) / n


def ring_steps(collective: str, world_size: int) -> int:
    """Latency-bound steps of the ring algorithm (Thakur et al. 2005): 2(n-1), n-1, or 1 for p2p."""
    if collective == "send_recv":
        return 1
    return (2 if collective == "all_reduce" else 1) * (world_size - 1)


class CommPoint(Schema):
    """One measured size: median seconds per call over the repeats (slowest rank)."""

    message_bytes: int = Field(gt=0, description="nccl-tests 'size': the full buffer (all-gather output, reduce-scatter input)")
    time_s: float = Field(ge=0)


class CollectiveFit(Schema):
    collective: Collective
    world_size: int = Field(gt=0)
    alpha_s: float = Field(ge=0, description="fixed time per call")
    bus_bandwidth_GBps: float = Field(gt=0, description="fitted per-rank bus bandwidth, GB/s (1e9)")
    latency_s: float = Field(ge=0, description="alpha_s / ring steps: comparable with a fabric's latency_s")
    points: tuple[CommPoint, ...]

    def predict_s(self, message_bytes: float) -> float:
        """alpha + bus_bytes / bandwidth."""
        return self.alpha_s + bus_factor(self.collective, self.world_size) * message_bytes / (self.bus_bandwidth_GBps * 1e9)


class CommCalibration(Schema):
    schema_version: Literal["1"] = CALIBRATION_SCHEMA_VERSION
    kind: Literal["comm"] = "comm"
    backend: Literal["gloo", "nccl"]
    device: str
    world_size: int = Field(gt=1)
    software: dict[str, str] = Field(default_factory=dict)
    command: str = ""
    fits: tuple[CollectiveFit, ...]

    def fit(self, collective: str) -> CollectiveFit | None:
        return next((f for f in self.fits if f.collective == collective), None)


def fit_line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Least squares y = alpha + beta * x with alpha, beta >= 0: with alpha < 0 refit through the origin,
    with beta < 0 (noise, or one distinct x) y is the mean, or proportional to x for a single x."""
    if len(np.unique(x)) < 2:
        return 0.0, float(y.mean() / x.mean()) if x.mean() > 0 else 0.0
    design = np.column_stack([np.ones_like(x), x])
    (alpha, beta), *_ = np.linalg.lstsq(design, y, rcond=None)
    if beta <= 0:
        return float(y.mean()), 0.0
    if alpha < 0:
        return 0.0, float(x @ y / (x @ x))
    return float(alpha), float(beta)


def fit_collective(collective: str, world_size: int, points: list[CommPoint]) -> CollectiveFit:
    """Alpha-beta fit of one collective's points (in bus bytes). Relative least squares (each point weighted
    by 1/time) so that small messages, whose times are microseconds, still shape alpha."""
    factor = bus_factor(collective, world_size)
    x = np.array([p.message_bytes * factor for p in points], dtype=np.float64)
    y = np.array([p.time_s for p in points], dtype=np.float64)
    weights = 1.0 / np.maximum(y, 1e-9)
    alpha, beta = _weighted_fit(x, y, weights)
    bandwidth = 1.0 / beta / 1e9 if beta > 0 else float("inf")
    return CollectiveFit(
        collective=collective, world_size=world_size, alpha_s=alpha,
        bus_bandwidth_GBps=min(bandwidth, 1e6), latency_s=alpha / ring_steps(collective, world_size),
        points=tuple(points),
    )


def _weighted_fit(x: np.ndarray, y: np.ndarray, w: np.ndarray) -> tuple[float, float]:
    """Weighted least squares of y = alpha + beta x (weights w), clamped like fit_line."""
    design = np.column_stack([w, x * w])
    (alpha, beta), *_ = np.linalg.lstsq(design, y * w, rcond=None)
    if beta <= 0:
        return float(y.mean()), 0.0
    if alpha < 0:
        xw, yw = x * w, y * w
        return 0.0, float(xw @ yw / (xw @ xw))
    return float(alpha), float(beta)


def load_calibration(path: str | Path) -> CommCalibration:
    """Read and validate a calibration file."""
    from planner.io import load_file

    return load_file(CommCalibration, path)


def calibrated_topology(topology, calibration: CommCalibration):
    """The topology with its intra-node fabric replaced by the measured fits: bandwidth_GBps and latency_s from
    the all-reduce fit (the fitted bus bandwidth, alpha per ring step), and every measured collective's own
    rates in `collectives` (on gloo a reduce-scatter runs ~3x slower than an all-reduce's bus bandwidth
    suggests, point-to-point ~4x faster). A calibration measures processes on one node, so the inter-node
    fabric is left as it is. Returns a new (frozen) Topology."""
    from planner.schemas.topology import CollectiveRate

    fit = calibration.fit("all_reduce") or calibration.fits[0]
    rates = {f.collective: CollectiveRate(bandwidth_GBps=f.bus_bandwidth_GBps, latency_s=f.latency_s) for f in calibration.fits}
    intra = topology.intra_node.model_copy(update={"bandwidth_GBps": fit.bus_bandwidth_GBps, "latency_s": fit.latency_s,
                                                   "collectives": rates})
    return topology.model_copy(update={"intra_node": intra})


def resolve_comm_calibration(topology, *, relative_to: str | Path | None = None):
    """Apply the topology's `comm_calibration` file, if it names one (a relative path is taken from
    `relative_to`, the folder of the topology file, else the working directory); unchanged otherwise."""
    if topology.comm_calibration is None:
        return topology
    path = Path(topology.comm_calibration)
    if not path.is_absolute() and relative_to is not None and not path.is_file():
        path = Path(relative_to) / path
    return calibrated_topology(topology, load_calibration(path))
