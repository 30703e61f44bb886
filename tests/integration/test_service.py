"""The optimizer service against a real `planner serve` process on a free localhost port, over HTTP."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from planner import api
from planner.io import canonical_json
from planner.schemas.plan import Configuration, LaunchPlan, Parallelism, SearchLimits

TOKEN = "s3cret-token"
SMALL = {"model": "llama3-8b", "topology": "dgx-h100", "gpus": 8, "global_batch_size": 64, "seq_len": 4096}
PLAN = {"model": "tinyllama-1.1b", "topology": "dgx-h100", "gpus": 8, "global_batch_size": 64, "seq_len": 2048}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Server:
    """`planner serve` in a subprocess; stop() terminates it and waits."""

    def __init__(self, db: Path, *, token: str | None = None, extra: tuple[str, ...] = ()):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "PLANNER_TOKEN"} | {"PLANNER_DB": str(db)}
        if token:
            env["PLANNER_TOKEN"] = token
        code = "from planner.cli import main; main()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, "serve", "--port", str(self.port), "--workers", "2", *extra],
                                     env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("server did not start in 60 s")

    def stop(self) -> None:
        """SIGTERM (graceful: the service stops its workers), then make sure nothing of its session is left."""
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        deadline = time.monotonic() + 5  # multiprocessing's resource tracker exits just after its parent
        while _session_pids(self.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        leftovers = _session_pids(self.proc.pid)
        for pid in leftovers:
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"server left processes behind: {leftovers}"


def _session_pids(sid: int) -> list[int]:
    """Live processes of session `sid` (the server was started as a session leader)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] != "Z":
                pids.append(int(entry.name))
    return pids


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """One server for the tests that do not restart it (each start costs a few seconds on a shared box)."""
    srv = Server(tmp_path_factory.mktemp("service") / "plans.sqlite")
    yield srv
    srv.stop()


def estimate_body(tp: int, pp: int, mbs: int) -> dict:
    return SMALL | {"gpus": 16, "tp": tp, "pp": pp, "microbatch_size": mbs, "zero_stage": 1, "sp": tp > 1,
                    "framework": "megatron-core"}


def local_estimate(body: dict) -> str:
    """The same estimate computed in this process: what the service must return byte for byte."""
    request = api.build_request(model=body["model"], topology=body["topology"], gpus=body["gpus"], global_batch_size=body["global_batch_size"],
                                seq_len=body["seq_len"], search=SearchLimits(time_limit_s=30.0, top_k=3),
                                framework=body["framework"])
    par = Parallelism(dp=body["gpus"] // (body["tp"] * body["pp"]), tp=body["tp"], pp=body["pp"], sp=body["sp"], zero_stage=body["zero_stage"])
    return canonical_json(api.estimate(request, Configuration(parallelism=par, microbatch_size=body["microbatch_size"])))


def test_plan_returned_stored_and_fetched_by_id(server):
    response = httpx.post(server.url + "/v1/plan", json=PLAN | {"time_limit_s": 60}, timeout=120)
    assert response.status_code == 200, response.text
    plan = LaunchPlan.model_validate_json(response.text)
    assert plan.kind == "plan" and plan.feasible and plan.request.gpus == 8 and plan.parallelism.world_size == 8
    assert plan.request.model.name == "tinyllama-1.1b" and plan.alternatives
    assert response.headers["x-cache"] == "miss"
    again = httpx.post(server.url + "/v1/plan", json=PLAN | {"time_limit_s": 60}, timeout=60)
    assert again.headers["x-cache"] == "hit" and again.text == response.text
    by_id = httpx.get(server.url + "/v1/plans/" + response.headers["x-plan-id"], timeout=10)
    assert by_id.status_code == 200 and by_id.text == response.text
    assert httpx.get(server.url + "/v1/plans/" + "0" * 64, timeout=10).status_code == 404
    assert "llama3-8b" in httpx.get(server.url + "/v1/models", timeout=10).json()["models"]
    assert httpx.get(server.url + "/v1/topologies", timeout=10).json()["topologies"]
    assert "megatron-core" in httpx.get(server.url + "/v1/frameworks", timeout=10).json()["frameworks"]
    titan = httpx.post(server.url + "/v1/plan", json=PLAN | {"time_limit_s": 60, "framework": "torchtitan"}, timeout=120)
    assert titan.status_code == 200 and LaunchPlan.model_validate_json(titan.text).request.framework == "torchtitan"
    assert httpx.get(server.url + "/openapi.json", timeout=10).json()["paths"]["/v1/plan"]["post"]
    assert httpx.get(server.url + "/docs", timeout=10).status_code == 200


def test_bad_input_is_422_with_the_field(server):
    unknown = httpx.post(server.url + "/v1/plan", json=SMALL | {"gpu": 8}, timeout=10)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"][-1] == "gpu"
    negative = httpx.post(server.url + "/v1/estimate", json=estimate_body(1, 1, 1) | {"tp": 0}, timeout=10)
    assert negative.status_code == 422 and negative.json()["detail"][0]["loc"][-1] == "tp"
    heads = httpx.post(server.url + "/v1/estimate", json=estimate_body(1, 1, 1) | {"tp": 3, "gpus": 6}, timeout=60)
    assert heads.status_code == 422 and "tp=3" in heads.json()["detail"]
    stack = httpx.post(server.url + "/v1/plan", json=SMALL | {"framework": "../frameworks/planner"}, timeout=10)
    assert stack.status_code == 422 and stack.json()["detail"][0]["loc"][-1] == "framework"
    unknown_stack = httpx.post(server.url + "/v1/plan", json=SMALL | {"framework": "nemo"}, timeout=10)
    assert unknown_stack.status_code == 422 and "GET /v1/frameworks" in unknown_stack.json()["detail"]
    path = httpx.post(server.url + "/v1/plan", json=SMALL | {"model": "/etc/passwd"}, timeout=10)
    assert path.status_code == 422 and "not a preset" in path.json()["detail"]
    too_big = httpx.post(server.url + "/v1/plan", json=SMALL | {"gpus": 10**6}, timeout=10)
    assert too_big.status_code == 422 and "search limit" in too_big.json()["detail"]
    many_nodes = httpx.post(server.url + "/v1/plan", json=PLAN | {"gpus": None, "nodes": 5000}, timeout=30)
    assert many_nodes.status_code == 422 and "40000 GPUs" in many_nodes.json()["detail"]
    huge = httpx.post(server.url + "/v1/plan", content=b'{"model": "' + b"x" * (2 << 20) + b'"}', headers={"content-type": "application/json"}, timeout=30)
    assert huge.status_code == 413


def test_twenty_concurrent_requests_all_answered_correctly(server):
    bodies = [estimate_body(tp, pp, mbs) for tp in (1, 2, 4, 8) for pp in (1, 2) for mbs in (1, 2)] + [estimate_body(2, 1, 1)] * 4
    assert len(bodies) == 20

    def post(body):
        return httpx.post(server.url + "/v1/estimate", json=body, timeout=120)

    with concurrent.futures.ThreadPoolExecutor(max_workers=20) as pool:
        responses = list(pool.map(post, bodies))
    expected = {json.dumps(b, sort_keys=True): local_estimate(b) for b in bodies}
    for body, response in zip(bodies, responses):
        if response.status_code == 409:  # an infeasible configuration must be infeasible here too
            assert not LaunchPlan.model_validate_json(expected[json.dumps(body, sort_keys=True)]).memory.fits
            continue
        assert response.status_code == 200, response.text
        assert response.text == expected[json.dumps(body, sort_keys=True)]
    assert sum(r.status_code == 200 for r in responses) >= 10


def test_bearer_token_required_when_set(tmp_path):
    srv = Server(tmp_path / "auth.sqlite", token=TOKEN)
    try:
        assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers={"Authorization": "Bearer wrong"}, timeout=10).status_code == 401
        assert httpx.post(srv.url + "/v1/estimate", json=estimate_body(1, 1, 1), timeout=10).status_code == 401
        assert httpx.get(srv.url + "/v1/models", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10).status_code == 200
        assert httpx.get(srv.url + "/healthz", timeout=10).status_code == 200
    finally:
        srv.stop()


def test_store_survives_restart(tmp_path):
    db = tmp_path / "persist.sqlite"
    srv = Server(db)
    try:
        first = httpx.post(srv.url + "/v1/estimate", json=estimate_body(2, 1, 1), timeout=120)
        assert first.status_code == 200 and first.headers["x-cache"] == "miss"
    finally:
        srv.stop()
    srv = Server(db)
    try:
        assert httpx.get(srv.url + "/healthz", timeout=10).json()["stored_plans"] == 1
        fetched = httpx.get(srv.url + "/v1/plans/" + first.headers["x-plan-id"], timeout=10)
        assert fetched.status_code == 200 and fetched.text == first.text
        again = httpx.post(srv.url + "/v1/estimate", json=estimate_body(2, 1, 1), timeout=60)
        assert again.headers["x-cache"] == "hit" and again.text == first.text
    finally:
        srv.stop()


def test_past_the_time_limit_is_504_and_the_solve_does_not_outlive_the_server(tmp_path):
    srv = Server(tmp_path / "slow.sqlite", extra=("--grace-s", "0"))
    try:
        started = time.monotonic()  # 10 ms: the search stops itself at its time limit, the worker is killed first
        big = {"model": "llama3-405b", "topology": "dgx-h100", "nodes": 512, "time_limit_s": 0.01}
        response = httpx.post(srv.url + "/v1/plan", json=big, timeout=60)
        assert response.status_code == 504 and "time_limit_s=0.01" in response.json()["detail"]
        assert time.monotonic() - started < 20
    finally:
        srv.stop()  # asserts that the busy worker was stopped with the server
