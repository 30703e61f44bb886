"""The service against hostile input, load and faults (issue 15): a real `planner serve` on localhost.

Every refusal is 422 or 413 with a JSON `detail`, quickly; a solve past its deadline is stopped and does not
starve later requests; a finished solve is stored even when its client gave up; `kill -9` of the server leaves
no worker behind; a full solve queue answers a new distinct solve 503 at once (never a cached or identical one);
a request body that does not arrive in time is 408 and its connection closed.
"""

from __future__ import annotations

import asyncio
import os
import select
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
from test_service import PLAN, SMALL, Server, _session_pids

DEEP = {"name": "deep", "num_layers": 1024, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
        "num_kv_heads": 8, "vocab_size": 128256, "seq_len": 8192, "activation": "swiglu", "norm": "rmsnorm"}
ESTIMATE = SMALL | {"gpus": 8, "tp": 2, "zero_stage": 1, "time_limit_s": 10, "framework": "megatron-core"}
BODY_TIMEOUT_S = 2.0


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """grace 0: a solve is stopped exactly at its time_limit_s; 640 MiB per worker: enough for any preset; a body
    must arrive within 2 s."""
    srv = Server(tmp_path_factory.mktemp("hostile") / "plans.sqlite",
                 extra=("--grace-s", "0", "--worker-memory-mb", "640", "--body-timeout-s", str(BODY_TIMEOUT_S)))
    yield srv
    srv.stop()


ABSURD = [
    ({"global_batch_size": 6353514090396500891258585088, "top_k": 1}, "global_batch_size"),
    ({"global_batch_size": 6353514090396500891258585088, "top_k": 2}, "global_batch_size"),
    ({"seq_len": 10**12}, "seq_len"),
    ({"gpus": 10**9}, "gpus"),
    ({"nodes": 10**9}, "nodes"),
    ({"time_limit_s": 10**9}, "time_limit_s"),
    ({"top_k": 10**6}, "top_k"),
    ({"model": DEEP | {"num_layers": 100_000}}, "num_layers"),
    ({"model": DEEP | {"num_layers": 1_000_000}}, "num_layers"),
    ({"model": DEEP | {"hidden_size": 2**40}}, "hidden_size"),
    ({"model": DEEP | {"moe": {"num_experts": 10**6, "top_k": 2, "expert_ffn_hidden_size": 1024}}}, "num_experts"),
    ({"model": "x" * 10_000}, "model"),
]


@pytest.mark.parametrize("fields, field", ABSURD, ids=[f"{f}-{i}" for i, (_, f) in enumerate(ABSURD)])
def test_absurd_sizes_are_refused_up_front(server, fields, field):
    started = time.monotonic()
    response = httpx.post(server.url + "/v1/plan", json={"model": "llama3-8b", "time_limit_s": 1} | fields, timeout=30)
    assert response.status_code == 422, response.text
    assert any(field in map(str, err["loc"]) for err in response.json()["detail"])
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("raw", [b'{"model": "llama3-8b", "time_limit_s": NaN}', b'{"model": "llama3-8b", "time_limit_s": -Infinity}',
                                 b'{"model": "llama3-8b", "time_limit_s": Infinity}', b'{"gpus": 8, "seq_len": NaN}',
                                 b'{"model": {"name": "m", "num_layers": NaN}}', b'{"model": "llama3-8b"', b"\xff\xfe",
                                 b'[1, 2]', b'"text"', b'{"gpus": 1e400}', b'E&\xff'])
def test_non_finite_numbers_and_broken_json_are_422(server, raw):
    response = httpx.post(server.url + "/v1/plan", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422, response.text
    assert isinstance(response.json()["detail"], (list, str)) and response.json()["detail"]


@pytest.mark.parametrize("raw", [b'{"model": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", b'{"gpus": ' + b"9" * 5000 + b"}",
                                 b"{" + b",".join(b'"k%d": 1' % i for i in range(30_000)) + b"}"], ids=["deep", "long-int", "many-keys"])
def test_pathological_json_is_a_short_422(server, raw):
    response = httpx.post(server.url + "/v1/estimate", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422 and len(response.content) < 10_000, response.text[:300]


def test_after_two_giant_requests_a_normal_request_is_answered_in_time(server):
    """The issue's two requests (now refused) and two solves past their deadline (stopped, workers replaced)."""
    for top_k in (1, 2):
        giant = {"model": "llama3-8b", "global_batch_size": 6353514090396500891258585088, "time_limit_s": 1, "top_k": top_k}
        assert httpx.post(server.url + "/v1/plan", json=giant, timeout=30).status_code == 422
    slow = {"model": "llama3-405b", "topology": "dgx-h100", "nodes": 512, "time_limit_s": 0.01}

    def post(top_k, out):
        out[top_k] = httpx.post(server.url + "/v1/plan", json=slow | {"top_k": top_k}, timeout=60)

    answers: dict = {}
    threads = [threading.Thread(target=post, args=(k, answers)) for k in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert [answers[k].status_code for k in (1, 2)] == [504, 504], [answers[k].text for k in answers]
    started = time.monotonic()
    normal = httpx.post(server.url + "/v1/estimate", json=ESTIMATE, timeout=30)
    assert normal.status_code == 200, normal.text
    assert time.monotonic() - started < ESTIMATE["time_limit_s"]
    assert httpx.get(server.url + "/healthz", timeout=10).json()["workers_replaced"] >= 2


def test_a_solve_over_the_worker_memory_limit_is_422_and_the_worker_replaced(server):
    moe = DEEP | {"moe": {"num_experts": 4096, "top_k": 8, "expert_ffn_hidden_size": 2048}}
    before = httpx.get(server.url + "/healthz", timeout=10).json()["workers_replaced"]
    # ~6 s on a quiet 2-core box to reach 640 MiB; the time limit is generous so a loaded box meets the cap first
    response = httpx.post(server.url + "/v1/plan", json={"model": moe, "nodes": 64, "time_limit_s": 120, "framework": "torchtitan"},
                          timeout=180)
    assert response.status_code == 422 and "memory" in response.json()["detail"], response.text
    assert httpx.get(server.url + "/healthz", timeout=10).json()["workers_replaced"] > before
    deadline = time.monotonic() + 5  # the replaced worker is killed as the answer goes out
    while max(rss_kib(pid) for pid in _session_pids(server.proc.pid)) >= 700 * 1024 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert max(rss_kib(pid) for pid in _session_pids(server.proc.pid)) < 700 * 1024


def test_chunked_body_over_the_limit_is_413_without_reading_it(server):
    before = rss_kib(server.proc.pid)
    sent = 0

    def chunks():
        nonlocal sent
        for _ in range(64):
            sent += 1
            yield b"x" * (1 << 20)

    try:
        response = httpx.post(server.url + "/v1/plan", content=chunks(), headers={"content-type": "application/json"}, timeout=30)
        assert response.status_code == 413 and "limit" in response.json()["detail"]
    except (httpx.WriteError, httpx.RemoteProtocolError, httpx.ReadError):
        pass  # the server answered 413 and closed while the client was still sending: also a refusal
    assert sent < 64, "the server read the whole body"
    assert rss_kib(server.proc.pid) - before < 30 * 1024
    declared = httpx.post(server.url + "/v1/plan", content=b"{" * (2 << 20), headers={"content-type": "application/json"}, timeout=30)
    assert declared.status_code == 413


def test_openapi_documents_every_status(server):
    doc = httpx.get(server.url + "/openapi.json", timeout=10).json()
    plan = doc["paths"]["/v1/plan"]["post"]["responses"]
    assert {"200", "401", "408", "409", "413", "422", "503", "504"} <= set(plan)
    assert set(plan) == set(doc["paths"]["/v1/estimate"]["post"]["responses"]) and "Retry-After" in plan["503"]["headers"]
    assert {"404", "401"} <= set(doc["paths"]["/v1/plans/{plan_id}"]["get"]["responses"])
    error = doc["components"]["schemas"]["ErrorBody"]["properties"]["detail"]
    assert {"type": "string"} in error["anyOf"] and any(item.get("type") == "array" for item in error["anyOf"])
    unknown = httpx.get(server.url + "/v1/plans/nope", timeout=10)
    assert unknown.status_code == 404 and isinstance(unknown.json()["detail"], str)


def test_a_solve_whose_client_gave_up_is_still_stored(tmp_path):
    srv = Server(tmp_path / "late.sqlite", extra=("--workers", "1", "--grace-s", "1"))
    try:
        blocker = threading.Thread(target=lambda: httpx.post(srv.url + "/v1/plan", json={"model": DEEP, "nodes": 512, "time_limit_s": 3,
                                                                                          "framework": "torchtitan"}, timeout=60))
        blocker.start()
        time.sleep(0.5)  # the only worker is busy: the next request queues past its own time limit
        late = httpx.post(srv.url + "/v1/estimate", json=ESTIMATE | {"time_limit_s": 0.5}, timeout=30)
        assert late.status_code == 504 and "/v1/plans/" in late.json()["detail"], late.text
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            stored = httpx.get(srv.url + late.headers["location"], timeout=10)
            if stored.status_code == 200:
                break
            time.sleep(0.5)
        assert stored.status_code == 200
        again = httpx.post(srv.url + "/v1/estimate", json=ESTIMATE | {"time_limit_s": 0.5}, timeout=30)
        assert again.status_code == 200 and again.headers["x-cache"] == "hit"
        blocker.join(60)
    finally:
        srv.stop()


def test_kill_9_of_the_server_leaves_no_worker(tmp_path):
    srv = Server(tmp_path / "kill.sqlite")
    try:
        busy = threading.Thread(target=lambda: _post_quietly(srv.url, {"model": DEEP, "nodes": 512, "time_limit_s": 20}), daemon=True)
        busy.start()
        time.sleep(1.0)  # a worker is now solving
        assert len(_session_pids(srv.proc.pid)) >= 3  # the server and its two workers
        os.kill(srv.proc.pid, signal.SIGKILL)
        srv.proc.wait(10)
        deadline = time.monotonic() + 5
        while _session_pids(srv.proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _session_pids(srv.proc.pid), "workers outlived the server"
    finally:
        for pid in _session_pids(srv.proc.pid):
            os.kill(pid, signal.SIGKILL)


def _post_quietly(url: str, body: dict) -> None:
    try:
        httpx.post(url + "/v1/plan", json=body, timeout=30)
    except httpx.HTTPError:
        pass


def _wait_for_health(srv: Server, expect: dict, within_s: float = 30) -> dict:
    """/healthz once it shows `expect` (e.g. {"queued": 1}); fails after `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        health = httpx.get(srv.url + "/healthz", timeout=10).json()
        if all(health[key] == value for key, value in expect.items()):
            return health
        time.sleep(0.05)
    raise AssertionError(f"/healthz never showed {expect}: {health}")


def test_a_full_queue_refuses_a_new_solve_at_once_but_never_a_cached_or_identical_one(tmp_path):
    srv = Server(tmp_path / "queue.sqlite", extra=("--workers", "1", "--max-queue", "1", "--grace-s", "1"))
    answers: dict = {}

    def post(name: str, path: str, body: dict) -> threading.Thread:
        thread = threading.Thread(target=lambda: answers.__setitem__(name, httpx.post(srv.url + path, json=body, timeout=90)))
        thread.start()
        return thread

    queued = ESTIMATE | {"seq_len": 2048, "time_limit_s": 60}
    try:
        assert httpx.post(srv.url + "/v1/estimate", json=ESTIMATE, timeout=30).status_code == 200  # now a cache hit
        threads = [post("blocker", "/v1/plan", {"model": DEEP, "nodes": 512, "time_limit_s": 8, "framework": "torchtitan"})]
        _wait_for_health(srv, {"solving": 1, "queued": 0})  # the only worker is busy for ~8 s
        threads.append(post("queued", "/v1/estimate", queued))
        assert _wait_for_health(srv, {"queued": 1})["max_queue"] == 1
        started = time.monotonic()
        refused = httpx.post(srv.url + "/v1/estimate", json=ESTIMATE | {"seq_len": 1024}, timeout=30)
        assert refused.status_code == 503 and time.monotonic() - started < 3, refused.text
        assert "queue is full" in refused.json()["detail"] and int(refused.headers["retry-after"]) > 0
        cached = httpx.post(srv.url + "/v1/estimate", json=ESTIMATE, timeout=30)
        assert cached.status_code == 200 and cached.headers["x-cache"] == "hit"
        threads.append(post("repeat", "/v1/estimate", queued))  # joins the queued solve
        for thread in threads:
            thread.join(90)
        assert answers["queued"].status_code == 200 and answers["repeat"].text == answers["queued"].text
        assert answers["blocker"].status_code != 503
        assert httpx.post(srv.url + "/v1/estimate", json=ESTIMATE | {"seq_len": 1024}, timeout=30).status_code == 200
    finally:
        srv.stop()


def test_thread_pool_one_busy_worker_two_distinct_solves_one_place_in_the_queue(tmp_path):
    """In process (`--threads`), on one event loop: one of the two solves waits for the worker, the other is 503."""
    from planner.service.app import Settings, create_app

    async def scenario() -> list[int]:
        app = create_app(Settings(db_path=str(tmp_path / "s.sqlite"), workers=1, use_processes=False, max_queue=1))
        async with app.router.lifespan_context(app):
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://planner")
            async with client:
                blocker = asyncio.create_task(client.post("/v1/plan", json={"model": DEEP, "nodes": 512, "time_limit_s": 3,
                                                                            "framework": "torchtitan"}, timeout=60))
                while not app.state.inflight and not blocker.done():  # a blocker answered at once fails below
                    await asyncio.sleep(0.01)
                assert not blocker.done(), (await blocker).text
                both = await asyncio.gather(*(client.post("/v1/estimate", json=ESTIMATE | {"seq_len": n}, timeout=60)
                                              for n in (1024, 2048)))
                await blocker
                return sorted(response.status_code for response in both)

    assert asyncio.run(scenario()) == [200, 503]


def test_a_solve_admitted_but_not_yet_started_counts_as_waiting():
    """Two requests admitted in the same loop turn: the second must see the first, whose task has not yet asked
    the pool for a worker (so the pool's own count is still 0)."""
    from types import SimpleNamespace

    from planner.service.app import waiting_solves

    pool = SimpleNamespace(size=1, queued=0)
    app = SimpleNamespace(state=SimpleNamespace(pool=pool, inflight={"running": None, "admitted": None}))
    assert waiting_solves(app) == 1
    pool.queued, app.state.inflight = 2, {"running": None}  # workers being replaced: the pool knows better
    assert waiting_solves(app) == 2


def _raw_request(port: int, head: bytes, *, trickle_every_s: float | None, limit_s: float) -> tuple[bytes, float]:
    """Send `head`, then (with `trickle_every_s`) one more body byte at that interval, until the server closes
    the connection or `limit_s` passes; what it answered and when it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=limit_s) as sock:
        sock.sendall(head)
        started, answer = time.monotonic(), b""
        while time.monotonic() - started < limit_s:
            if select.select([sock], [], [], trickle_every_s or 0.1)[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
            elif trickle_every_s is not None:
                try:
                    sock.sendall(b" ")
                except OSError:
                    break
        return answer, time.monotonic() - started


def test_a_slow_body_is_408_and_its_connection_closed(server):
    head = b"POST /v1/plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
    for trickle in (None, 0.25):  # 10 bytes then silence; one byte every 0.25 s (never idle, never done)
        answer, elapsed = _raw_request(server.port, head + b'{"model": ', trickle_every_s=trickle, limit_s=BODY_TIMEOUT_S + 20)
        assert answer.startswith(b"HTTP/1.1 408") and b'"detail"' in answer and b"connection: close" in answer.lower(), answer
        assert BODY_TIMEOUT_S - 0.5 < elapsed < BODY_TIMEOUT_S + 8, elapsed  # closed, soon after the deadline
    normal = httpx.post(server.url + "/v1/estimate", json=ESTIMATE, timeout=30)
    assert normal.status_code == 200, normal.text


def test_a_client_stalled_in_its_headers_does_not_block_the_others(server):
    """uvicorn (h11) waits for unfinished headers without a time limit (README); the rest of the service goes on."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as stalled:
        stalled.sendall(b"POST /v1/plan HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Le")
        time.sleep(0.5)
        assert httpx.get(server.url + "/healthz", timeout=10).status_code == 200
        assert httpx.post(server.url + "/v1/estimate", json=ESTIMATE, timeout=30).status_code == 200
