"""The service's solver pool: long-lived worker processes that a time limit can stop.

Why not concurrent.futures.ProcessPoolExecutor: a running task there cannot be cancelled, so two solves past
their time limit held both workers and every later request timed out until a restart. Here each worker is a
`python -m planner.service.worker` subprocess that solves one request at a time over a pipe (one JSON line in,
one out); a solve past its deadline gets its worker killed (SIGKILL) and a fresh worker started in its place.

Each worker also limits its own address space (RLIMIT_AS, `memory_bytes`: a solve that needs more fails with
MemoryError and is answered 422), is replaced when a solve leaves it holding over `recycle_bytes`, and dies
with the server (PR_SET_PDEATHSIG plus a parent watch), so a `kill -9` of the server leaves no solver running.
A worker joins the pool only once it says it is ready (its imports done), so no deadline pays for a start. A worker
that dies (an operator's or the OOM killer's kill -9) is replaced at once by a watch on it, and a solve it was running
is answered 503 (the app adds Retry-After): the request may be fine, so the client retries on the fresh worker. `ThreadPool` is the in-process variant (`--threads`): the
same interface, no kill, no memory limit; for tests and debugging only.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LINE_LIMIT_BYTES = 512 << 20  # the longest answer line read from a worker (a 16384-GPU plan is ~5 MB)
START_TIMEOUT_S = 120.0
WORKER_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def _worker_env() -> dict[str, str]:
    """The server's environment, one BLAS thread, and this `planner` package first on the path: a worker runs
    the same code as the server even where another copy is installed."""
    import planner

    source = str(Path(planner.__file__).resolve().parents[1])
    path = os.pathsep.join(p for p in (source, os.environ.get("PYTHONPATH", "")) if p)
    return os.environ | WORKER_ENV | {"PYTHONPATH": path}


WORKER_LOST = 503  # answered with Retry-After by the app: the request itself may be fine, a fresh worker is coming


def _exit_of(code: int | None) -> str:
    import signal

    if code is not None and code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _detail(message: str) -> str:
    return json.dumps({"detail": message})


class ProcessPool:
    """`size` worker subprocesses; `solve` runs one request on an idle one, killing it past the deadline."""

    def __init__(self, size: int, *, memory_bytes: int | None = None):
        self.size, self.memory_bytes = size, memory_bytes
        # a worker left holding more than this after a solve is replaced (CPython rarely returns freed memory)
        self.recycle_bytes = min(1 << 30, memory_bytes // 2) if memory_bytes else 1 << 30
        self._idle: asyncio.Queue | None = None
        self._live: set[asyncio.subprocess.Process] = set()
        self._spawning: set[asyncio.Task] = set()
        self.replaced = 0  # workers killed at a deadline or lost, and replaced
        self._closed = False
        self._waiting = 0

    async def start(self) -> None:
        self._idle = asyncio.Queue()
        for proc in await asyncio.gather(*(self._spawn() for _ in range(self.size))):
            self._idle.put_nowait(proc)

    async def _spawn(self) -> asyncio.subprocess.Process:
        args = [sys.executable, "-m", "planner.service.worker", str(self.memory_bytes or 0), str(os.getpid())]
        proc = await asyncio.create_subprocess_exec(*args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    env=_worker_env(), limit=LINE_LIMIT_BYTES)
        self._live.add(proc)
        try:
            ready = await asyncio.wait_for(proc.stdout.readline(), timeout=START_TIMEOUT_S)
        except asyncio.TimeoutError:
            ready = b""
        if not ready.startswith(b'["ready"'):
            self._kill(proc)
            raise RuntimeError(f"a solver worker did not start within {START_TIMEOUT_S:g} s (exit code {proc.returncode})")
        watch = asyncio.get_running_loop().create_task(self._watch(proc))
        self._spawning.add(watch)
        watch.add_done_callback(self._spawning.discard)
        return proc

    async def _watch(self, proc: asyncio.subprocess.Process) -> None:
        """Replace a worker the moment it dies (killed by an operator or the OOM killer while idle or solving), so the
        pool is whole again before the next request rather than after it fails on the dead worker."""
        await proc.wait()
        self._replace(proc)

    async def _idle_worker(self) -> asyncio.subprocess.Process:
        """The next idle worker that is still alive; a dead one found in the queue is dropped (its watch replaces it)."""
        while True:
            proc = await self._idle.get()
            if proc.returncode is None and proc in self._live:
                return proc
            self._replace(proc)

    @property
    def queued(self) -> int:
        """Requests waiting for an idle worker."""
        return self._waiting

    async def solve(self, kind: str, body_json: str, max_gpus: int, *, deadline_s: float) -> tuple[int, str]:
        """(status, body) of one solve; 504 when it ran past `deadline_s` (its worker killed and replaced)."""
        self._waiting += 1
        try:
            proc = await self._idle_worker()
        finally:
            self._waiting -= 1
        healthy = False
        try:
            proc.stdin.write(json.dumps([kind, body_json, max_gpus]).encode() + b"\n")
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), timeout=deadline_s)
            if not line:
                return WORKER_LOST, _detail(f"the solver worker died during the solve ({_exit_of(await proc.wait())}); "
                                            f"a fresh worker replaces it: retry the request")
            status, text, rss_bytes = json.loads(line)
            healthy = rss_bytes <= self.recycle_bytes
            return int(status), text
        except asyncio.TimeoutError:
            return 504, _detail(f"the solve ran past its deadline of {deadline_s:g} s and was stopped: raise time_limit_s or "
                                f"fix more of the configuration (fewer GPUs to search, fixed tp/pp)")
        except ConnectionError:  # it died between the check above and the write
            return WORKER_LOST, _detail("the solver worker died before it took the request; a fresh worker replaces it: "
                                        "retry the request")
        except ValueError:
            return 500, _detail("the solver worker answered something that is not the pool's protocol: retry; "
                                "the server log has the worker's output")
        finally:
            if healthy:
                self._idle.put_nowait(proc)
            else:
                self._replace(proc)

    def _replace(self, proc: asyncio.subprocess.Process) -> None:
        """Kill `proc` and start its successor in the background (a worker's start takes about a second); once per
        worker, whoever notices first (the solve that used it, its watch, the queue)."""
        if proc not in self._live:
            return
        self._kill(proc)
        if self._closed:
            return
        self.replaced += 1

        async def respawn() -> None:
            await proc.wait()
            for _ in range(3):  # a failed start is retried; the pool shrinks only if three in a row fail
                try:
                    self._idle.put_nowait(await self._spawn())
                    return
                except (RuntimeError, OSError) as exc:
                    print(f"planner service: {exc}", file=sys.stderr, flush=True)
                    await asyncio.sleep(1.0)

        task = asyncio.get_running_loop().create_task(respawn())
        self._spawning.add(task)
        task.add_done_callback(self._spawning.discard)

    def _kill(self, proc: asyncio.subprocess.Process) -> None:
        self._live.discard(proc)
        if proc.returncode is None:
            try:
                proc.kill()
            except ProcessLookupError:
                pass

    async def close(self) -> None:
        """Kill every worker now and start no more (queued solves are answered by their request's timeout)."""
        self._closed = True
        for task in list(self._spawning):
            task.cancel()
        procs = list(self._live)
        for proc in procs:
            self._kill(proc)
        for proc in procs:
            try:
                await asyncio.wait_for(proc.wait(), timeout=5)
            except asyncio.TimeoutError:
                pass


class ThreadPool:
    """Solves in threads of this process (`planner serve --threads`): no kill at the deadline, no memory limit."""

    def __init__(self, size: int, **_ignored):
        self.size, self.replaced = size, 0
        self._executor = ThreadPoolExecutor(max_workers=size)

    async def start(self) -> None:
        return None

    @property
    def queued(self) -> int:
        return self._executor._work_queue.qsize()  # noqa: SLF001

    async def solve(self, kind: str, body_json: str, max_gpus: int, *, deadline_s: float) -> tuple[int, str]:
        from planner.service.worker import solve

        future = asyncio.wrap_future(self._executor.submit(solve, kind, body_json, max_gpus))
        try:
            return await asyncio.wait_for(asyncio.shield(future), timeout=deadline_s)
        except asyncio.TimeoutError:
            return 504, _detail(f"the solve ran past its deadline of {deadline_s:g} s (threads cannot be stopped: it runs on)")

    async def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
