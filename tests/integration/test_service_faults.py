"""The service's answers to what issue 24 found: a duplicated JSON key is 422 (the README refuses duplicates), an
inline MoE with an absurd capacity_factor is 422 (it was a 500), a worker killed mid-solve is 503 with Retry-After
(not a 422 blaming the request), and after every idle worker is killed the next requests are answered 200 (the
pool replaces its workers as they die, not after a request fails on one)."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
from test_service import SMALL, Server, _session_pids

ESTIMATE = SMALL | {"gpus": 8, "tp": 2, "zero_stage": 1, "time_limit_s": 10}
DEEP = {"name": "deep", "num_layers": 1024, "hidden_size": 8192, "ffn_hidden_size": 28672, "num_attention_heads": 64,
        "num_kv_heads": 8, "vocab_size": 128256, "seq_len": 8192, "activation": "swiglu", "norm": "rmsnorm"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    srv = Server(tmp_path_factory.mktemp("faults") / "plans.sqlite")
    yield srv
    srv.stop()


def workers(srv: Server) -> list[int]:
    return [pid for pid in _session_pids(srv.proc.pid) if pid != srv.proc.pid]


def health(srv: Server) -> dict:
    return httpx.get(srv.url + "/healthz", timeout=10).json()


@pytest.mark.parametrize("raw", [b'{"model": "llama3-8b", "gpus": 8, "gpus": 4096}',
                                 b'{"model": {"name": "m", "name": "n", "num_layers": 2}}'])
def test_a_duplicated_key_is_422_naming_it(server, raw):
    response = httpx.post(server.url + "/v1/plan", content=raw, headers={"content-type": "application/json"}, timeout=30)
    assert response.status_code == 422, response.text
    assert "duplicate key" in response.json()["detail"]


def test_an_absurd_capacity_factor_is_422_not_500(server):
    moe = {"name": "m", "num_layers": 4, "hidden_size": 512, "ffn_hidden_size": 1024, "num_attention_heads": 8,
           "vocab_size": 1000, "seq_len": 512, "moe": {"num_experts": 8, "top_k": 2, "expert_ffn_hidden_size": 256,
                                                       "capacity_factor": 9e307}}
    response = httpx.post(server.url + "/v1/estimate", json={"model": moe, "gpus": 8, "ep": 8, "time_limit_s": 10}, timeout=30)
    assert response.status_code == 422, response.text
    assert "capacity_factor" in str(response.json()["detail"])


def test_a_worker_killed_mid_solve_is_503_with_retry_after_and_replaced(server):
    before = health(server)["workers_replaced"]
    answer: dict = {}
    heavy = {"model": DEEP | {"moe": {"num_experts": 4096, "top_k": 8, "expert_ffn_hidden_size": 2048}}, "nodes": 64,
             "time_limit_s": 60, "framework": "torchtitan"}  # solves for many seconds (test_service_hostile's memory case)
    busy = threading.Thread(target=lambda: answer.update(r=httpx.post(server.url + "/v1/plan", json=heavy, timeout=90)),
                            daemon=True)
    busy.start()
    deadline = time.monotonic() + 20
    while health(server)["solving"] < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(1.0)  # the solve has reached its worker
    for pid in workers(server):
        os.kill(pid, signal.SIGKILL)
    busy.join(60)
    response = answer["r"]
    assert response.status_code == 503, response.text
    assert response.headers.get("retry-after", "").isdigit() and "worker died" in response.json()["detail"]
    assert health(server)["workers_replaced"] >= before + 2
    ok = httpx.post(server.url + "/v1/estimate", json=ESTIMATE, timeout=60)
    assert ok.status_code == 200, ok.text


def test_after_every_idle_worker_dies_the_next_requests_are_answered(server):
    killed = workers(server)
    assert len(killed) == 2
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    for gbs in (64, 128):  # distinct requests: no cache hit
        response = httpx.post(server.url + "/v1/estimate", json=ESTIMATE | {"global_batch_size": gbs}, timeout=60)
        assert response.status_code == 200, response.text
    assert not set(killed) & set(workers(server))
