"""`planner profile comm`: time collectives against message size with N local processes, fit alpha-beta.

Processes are spawned with torch.multiprocessing and meet over TCP on 127.0.0.1 (gloo on CPU, NCCL on
GPU, one GPU per process). Each (collective, size) runs `warmup` untimed calls, then `repeats` timed calls
separated by barriers; a call's time is the slowest rank's (an all-reduce MAX of the per-rank times), and
the point is the median call on NCCL and the fastest call on gloo (a shared CPU only ever adds time, as in
measure_timing). Sizes follow nccl-tests: all-gather's size is its output, reduce-scatter's
its input, all-to-all's the buffer each rank sends; send/recv is a ping-pong between ranks 0 and 1 timed
as half the round trip. Rank 0 writes the points to a JSON file the parent reads; the parent fits.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import statistics
import sys
import tempfile
import time
import warnings
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from planner.errors import BadInputError
from planner.profiling.calibration import COLLECTIVES, CommCalibration, CommPoint, fit_collective

ELEMENT_BYTES = 4  # float32 buffers
TIMEOUT_S = 120


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _call(collective: str, size_bytes: int, world: int, rank: int, device: torch.device):
    """A zero-argument function doing one call of `collective` on buffers allocated once."""
    numel = max(world, size_bytes // ELEMENT_BYTES // world * world)
    full = torch.ones(numel, device=device)
    part = torch.ones(numel // world, device=device)
    if collective == "all_reduce":
        return lambda: dist.all_reduce(full)
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(full, part)
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(part, full)
    if collective == "all_to_all":
        out = torch.empty_like(full)
        return lambda: dist.all_to_all_single(out, full)

    def ping_pong() -> None:  # ranks 0 and 1; the others only wait
        if rank == 0:
            dist.send(full, 1)
            dist.recv(full, 1)
        elif rank == 1:
            dist.recv(full, 0)
            dist.send(full, 0)

    return ping_pong


def _time_point(collective: str, size_bytes: int, *, world: int, rank: int, device: torch.device,
                warmup: int, repeats: int) -> float:
    call = _call(collective, size_bytes, world, rank, device)
    for _ in range(warmup):
        call()
    _sync(device)
    samples = []
    for _ in range(repeats):
        dist.barrier()
        start = time.perf_counter()
        call()
        _sync(device)
        samples.append(time.perf_counter() - start)
    slowest = torch.tensor(samples, dtype=torch.float64, device=device if device.type == "cuda" else "cpu")
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    per_call = slowest.cpu().tolist()
    if collective == "send_recv":
        per_call = [t / 2 for t in per_call]
    return statistics.median(per_call) if device.type == "cuda" else min(per_call)


def _worker(rank: int, world: int, port: int, backend: str, sizes: list[int], collectives: list[str],
            warmup: int, repeats: int, out_path: str) -> None:
    device = torch.device("cuda", rank) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=timedelta(seconds=TIMEOUT_S))
    try:
        results: dict[str, list[list[float]]] = {}
        for collective in collectives:
            results[collective] = [[size, _time_point(collective, size, world=world, rank=rank, device=device,
                                                      warmup=warmup, repeats=repeats)] for size in sizes]
        if rank == 0:
            Path(out_path).write_text(json.dumps(results), encoding="utf-8")
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _device_description(backend: str) -> str:
    if backend == "nccl":
        return torch.cuda.get_device_name(0)
    from planner.profiling.measure import device_description

    return device_description(torch.device("cpu")).split(",")[0] + f", {os.cpu_count()} cores, loopback"


def run_comm_benchmark(*, nprocs: int, device: str = "cpu", sizes_bytes: tuple[int, ...],
                       collectives: tuple[str, ...] = COLLECTIVES, warmup: int = 2, repeats: int = 5,
                       command: str = "") -> CommCalibration:
    """Measure and fit; gloo for device='cpu', NCCL for 'cuda' (nprocs <= visible GPUs)."""
    if nprocs < 2:
        raise BadInputError(f"nprocs={nprocs}: a collective needs at least 2 processes")
    unknown = [c for c in collectives if c not in COLLECTIVES]
    if unknown:
        raise BadInputError(f"collectives={unknown} unknown: choose from {', '.join(COLLECTIVES)}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise BadInputError("CUDA requested but torch.cuda.is_available() is False: use --device cpu")
        if torch.cuda.device_count() < nprocs:
            raise BadInputError(f"nprocs={nprocs} exceeds the {torch.cuda.device_count()} visible GPUs: lower --nprocs")
    elif device != "cpu":
        raise BadInputError(f"device={device!r} is unknown: use --device cpu or --device cuda")
    backend = "nccl" if device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "points.json")
        mp.spawn(_worker, args=(nprocs, _free_port(), backend, list(sizes_bytes), list(collectives), warmup, repeats,
                                out_path), nprocs=nprocs, join=True)
        raw = json.loads(Path(out_path).read_text(encoding="utf-8"))
    fits = tuple(
        fit_collective(c, nprocs, [CommPoint(message_bytes=int(size), time_s=t) for size, t in raw[c]])
        for c in collectives
    )
    software = {"python": platform.python_version(), "torch": torch.__version__}
    return CommCalibration(backend=backend, device=_device_description(backend), world_size=nprocs,
                           software=software, command=command or " ".join(sys.argv), fits=fits)
