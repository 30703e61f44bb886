"""Load on a real `planner serve` process on localhost: N concurrent distinct and repeated plan requests.

For each --workers setting a fresh server (own SQLite file) is started, `--requests` bodies are sent by
`--concurrency` client threads (a `--repeat` fraction of them identical to an earlier body: answered from the
store or by joining the solve in flight), and it prints per setting: statuses, p50/p95/max latency, throughput,
the peak RSS of the server and of each solver worker (sampled every 0.2 s from /proc), and the workers
replaced (stopped at a deadline or recycled). Everything is bounded: each request by its time_limit_s + the
server's grace, the whole run by --deadline-s.

    python benchmarks/service_load.py --workers 1,2 --requests 50 --concurrency 50 --mix heavy
    python benchmarks/service_load.py --workers 2 --requests 40 --mix light
"""

from __future__ import annotations

import argparse
import concurrent.futures
import itertools
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
MIXES = {  # (model, nodes of 8 GPUs): the heavier mix is 70B-405B on 256-4,096 GPUs
    "light": [(m, n) for m in ("tinyllama-1.1b", "llama3-8b", "mixtral-8x7b") for n in (1, 2, 4, 8)],
    "heavy": [(m, n) for m in ("llama3-70b", "gpt3-175b", "llama3-405b", "mixtral-8x22b", "deepseek-v3") for n in (32, 64, 128, 256, 512)],
}


class Server:
    """`python -m planner.cli serve` on a free loopback port; stop() terminates it and its workers."""

    def __init__(self, *args: str):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = Path(tempfile.mkdtemp(prefix="planner-bench-")) / "plans.sqlite"
        env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", "planner.cli", "serve", "--port", str(self.port), "--db", str(self.db), *args],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("the server did not start within 60 s")

    def health(self) -> dict:
        return httpx.get(self.url + "/healthz", timeout=10).json()

    def worker_pids(self) -> list[int]:
        pids = []
        for task in Path(f"/proc/{self.proc.pid}/task").glob("*/children"):
            pids += [int(p) for p in task.read_text().split()]
        return pids

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class RssSampler(threading.Thread):
    """Peak RSS of the server and of any of its workers, sampled every 0.2 s until stopped."""

    def __init__(self, server: Server):
        super().__init__(daemon=True)
        self.server, self.stop_event = server, threading.Event()
        self.server_peak = self.worker_peak = self.workers_total_peak = 0.0

    def run(self) -> None:
        while not self.stop_event.wait(0.2):
            self.server_peak = max(self.server_peak, rss_mib(self.server.proc.pid))
            workers = [rss_mib(pid) for pid in self.server.worker_pids()]
            if workers:
                self.worker_peak = max(self.worker_peak, max(workers))
                self.workers_total_peak = max(self.workers_total_peak, sum(workers))


def bodies(mix: str, count: int, repeat: float, time_limit_s: float, seed: int = 0) -> list[dict]:
    """`count` plan bodies: distinct (model, nodes, global batch) first drawn in a fixed order, a `repeat`
    fraction replaced by copies of earlier ones; shuffled with a fixed seed."""
    rng = random.Random(seed)
    distinct = [{"model": m, "topology": "dgx-h100", "nodes": n, "global_batch_size": gbs, "time_limit_s": time_limit_s}
                for (m, n), gbs in itertools.product(MIXES[mix], (512, 1024, 2048))]
    rng.shuffle(distinct)
    n_repeat = int(count * repeat)
    chosen = distinct[:count - n_repeat]
    chosen += [rng.choice(chosen) for _ in range(n_repeat)]
    rng.shuffle(chosen)
    return chosen


def run_setting(workers: int, args) -> dict:
    server = Server("--workers", str(workers), "--grace-s", str(args.grace_s))
    sampler = RssSampler(server)
    sampler.start()
    work = bodies(args.mix, args.requests, args.repeat, args.time_limit_s)

    def post(body: dict) -> tuple[int, float, str]:
        started = time.monotonic()
        try:
            response = httpx.post(server.url + "/v1/plan", json=body, timeout=args.time_limit_s + args.grace_s + 30)
            return response.status_code, time.monotonic() - started, response.headers.get("x-cache", "-")
        except httpx.HTTPError as exc:
            return -1, time.monotonic() - started, type(exc).__name__

    started = time.monotonic()
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            results = list(pool.map(post, work, timeout=args.deadline_s))
        wall = time.monotonic() - started
        retried = _retry_timed_out(server, work, results, args)
        health = httpx.get(server.url + "/healthz", timeout=10).json()
    finally:
        sampler.stop_event.set()
        sampler.join()
        server.stop()
    latencies = sorted(r[1] for r in results)
    statuses = {}
    for status, _, _ in results:
        statuses[status] = statuses.get(status, 0) + 1
    return {"workers": workers, "requests": len(results), "statuses": statuses, "hits": sum(r[2] == "hit" for r in results),
            "p50_s": statistics.median(latencies), "p95_s": latencies[max(0, int(0.95 * len(latencies)) - 1)],
            "max_s": latencies[-1], "wall_s": wall, "throughput_rps": len(results) / wall,
            "server_rss_mib": sampler.server_peak, "worker_rss_mib": sampler.worker_peak,
            "workers_rss_total_mib": sampler.workers_total_peak, "replaced": health["workers_replaced"], "retried": retried}


def _retry_timed_out(server: Server, work: list[dict], results: list, args) -> str:
    """Once every solve has finished, send the bodies answered 504 again: each should be a store hit (a solve
    whose client gave up is kept). Returns "hits/retried"."""
    again = [body for body, result in zip(work, results) if result[0] == 504]
    if not again:
        return "-"
    deadline = time.monotonic() + args.deadline_s
    while time.monotonic() < deadline and httpx.get(server.url + "/healthz", timeout=10).json()["solving"]:
        time.sleep(0.5)
    hits = sum(httpx.post(server.url + "/v1/plan", json=body, timeout=60).headers.get("x-cache") == "hit" for body in again)
    return f"{hits}/{len(again)}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", default="1,2", help="comma-separated worker counts, one server each")
    parser.add_argument("--requests", type=int, default=40)
    parser.add_argument("--concurrency", type=int, default=20)
    parser.add_argument("--repeat", type=float, default=0.25, help="fraction of requests identical to an earlier one")
    parser.add_argument("--mix", choices=sorted(MIXES), default="light")
    parser.add_argument("--time-limit-s", type=float, default=30.0)
    parser.add_argument("--grace-s", type=float, default=5.0)
    parser.add_argument("--deadline-s", type=float, default=600.0, help="bound of one setting's whole run")
    args = parser.parse_args()
    print(f"mix={args.mix} requests={args.requests} concurrency={args.concurrency} repeat={args.repeat:.0%} "
          f"time_limit_s={args.time_limit_s:g} grace_s={args.grace_s:g} cpus={os.cpu_count()} "
          f"load1={os.getloadavg()[0]:.1f}", flush=True)
    print("workers  statuses              hits  p50 s  p95 s  max s  req/s  server MiB  worker MiB (max / all)  replaced  504 retried: hits")
    for workers in (int(w) for w in args.workers.split(",")):
        r = run_setting(workers, args)
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(r["statuses"].items()))
        print(f"{r['workers']:>7}  {statuses:<20}  {r['hits']:>4}  {r['p50_s']:5.2f}  {r['p95_s']:5.2f}  {r['max_s']:5.2f}  "
              f"{r['throughput_rps']:5.2f}  {r['server_rss_mib']:10.0f}  {r['worker_rss_mib']:6.0f} / {r['workers_rss_total_mib']:<6.0f}"
              f"         {r['replaced']:>2}        {r['retried']}", flush=True)


if __name__ == "__main__":
    main()
