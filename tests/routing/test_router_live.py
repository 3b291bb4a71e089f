"""The router over loopback: the relay's retry rule (a worker's own 500 sent once, a 503 retried),
IGW mode with gRPC, HTTP and Anthropic pools behind one gateway, and a worker that never answers.
The worker API, the policies on real requests, failover and the breaker are tested in process
(`test_router_app.py`)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Routed
from tests.conftest import Scripted, wait_for_events
from tests.grpc.conftest import QWEN3
from tools.spawn import Spawned, free_port, spawn_engine, spawn_gateway, spawn_worker

MODEL = "pool-model"
USER = [{"role": "user", "content": "route me"}]
BODY = {"model": MODEL, "max_tokens": 8, "messages": USER}
KEY = {"authorization": "Bearer admin-key"}


@pytest.fixture
def workers() -> Iterator[list[Spawned]]:
    spawned = [spawn_worker(models=[MODEL])]  # every test here needs one HTTP worker
    try:
        yield spawned
    finally:
        for proc in spawned:
            proc.stop()


def _gateway(urls: list[str], *extra: str, journal: Path | None = None) -> Spawned:
    return spawn_gateway(urls, journal=journal, extra=["--health-check-interval-secs", "1", *extra])


def _wait(predicate: Any, what: str, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# --- the relay's retry rule ---------------------------------------------------------------------


def test_a_worker_own_500_is_sent_once_and_a_503_is_retried(workers: list[Spawned]) -> None:
    first = workers[0]
    handle = Scripted(first.url)
    handle.reset()
    gw = _gateway([first.url], "--retry-initial-backoff-ms", "1")
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            handle.script({"status": 500, "body": "boom"})
            failed = client.post("/v1/messages", json=BODY)
            assert failed.status_code == 500 and len(handle.received()) == 1
            handle.reset()
            handle.script(*[{"status": 503, "body": "busy"}] * 4)
            served = client.post("/v1/messages", json=BODY)
            assert served.status_code == 200 and len(handle.received()) == 5  # --retry-max-retries 5: five attempts
    finally:
        gw.stop()


# --- IGW ---------------------------------------------------------------------------------------


@pytest.fixture
def igw(tmp_path: Path) -> Iterator[dict[str, Any]]:
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", "shared-model"])
    http = spawn_worker(models=["shared-model", "http-only"])
    anthropic = spawn_worker(models=["claude-test"], extra=["--api-format", "anthropic"])
    journal = tmp_path / "igw.db"
    gw = spawn_gateway(
        [engine.url, http.url],
        journal=journal,
        extra=["--enable-igw", "--model-path", str(QWEN3), "--policy", "round_robin"],
    )
    try:
        yield {"gw": gw, "engine": engine, "http": http, "anthropic": anthropic, "journal": journal}
    finally:
        gw.stop()
        engine.stop()
        http.stop()
        anthropic.stop()


def _backend(journal: Path, response: httpx.Response) -> str:
    events = wait_for_events(journal, response.headers["x-request-id"])
    return next(e.backend for e in events if isinstance(e, Routed))


def test_igw_routes_each_model_to_the_pools_that_serve_it(igw: dict[str, Any]) -> None:
    gw, journal = igw["gw"], igw["journal"]
    with httpx.Client(base_url=gw.url, timeout=30.0) as client:
        http_only = client.post("/v1/messages", json={**BODY, "model": "http-only"})
        assert http_only.status_code == 200 and _backend(journal, http_only) == "http"
        backends = {
            _backend(journal, client.post("/v1/messages", json={**BODY, "model": "shared-model"})) for _ in range(16)
        }
        assert backends == {"grpc", "http"}  # weighted by the pools' available workers

        empty = client.post("/v1/messages", json={**BODY, "model": "shared-model", "max_tokens": 0})
        assert empty.status_code == 200 and empty.json()["stop_reason"] == "max_tokens"
        assert _backend(journal, empty) == "grpc"
        refused = client.post("/v1/messages", json={**BODY, "model": "http-only", "max_tokens": 0})
        assert refused.status_code == 400 and refused.headers["x-smg-error-code"] == "max_tokens_zero_not_relayed"

        counted = client.post("/v1/messages/count_tokens", json={"model": "shared-model", "messages": USER})
        assert counted.status_code == 200 and _backend(journal, counted) == "grpc"
        relayed = client.post("/v1/messages/count_tokens", json={"model": "http-only", "messages": USER})
        assert relayed.status_code == 200 and _backend(journal, relayed) == "http"

        unknown = client.post("/v1/messages", json={**BODY, "model": "nobody-serves-this"})
        assert unknown.status_code == 404 and unknown.headers["x-smg-error-code"] == "model_not_found"
        models = {m["id"] for m in client.get("/v1/models").json()["data"]}
        assert {"shared-model", "http-only"} <= models


def test_igw_external_workers_anthropic_is_served_and_other_providers_are_501(igw: dict[str, Any]) -> None:
    gw, journal, upstream = igw["gw"], igw["journal"], igw["anthropic"]
    handle = Scripted(upstream.url)
    handle.reset()
    with httpx.Client(base_url=gw.url, timeout=30.0) as client:
        added = client.post(
            "/workers",
            json={"url": upstream.url, "provider": "anthropic", "runtime_type": "external", "api_key": "wk-key"},
        )
        assert added.status_code == 202
        _wait(lambda: client.get(f"/workers/{added.json()['worker_id']}").json()["status"] == "ready", "the API")
        discovered = client.get(f"/workers/{added.json()['worker_id']}").json()
        assert discovered["runtime_type"] == "external" and discovered["models"][0]["id"] == "claude-test"
        assert httpx.get(upstream.url + "/_models_received").json()["requests"][-1]["headers"]["x-api-key"] == "wk-key"

        reply = client.post(
            "/v1/messages",
            json={**BODY, "model": "claude-test"},
            headers={"x-api-key": "caller-key", "anthropic-version": "2023-06-01"},
        )
        assert reply.status_code == 200, reply.text
        assert _backend(journal, reply) == "anthropic"
        sent = handle.received()[-1]["headers"]
        assert sent["x-api-key"] == "caller-key" and "wk-key" not in str(sent)
        counted = client.post("/v1/messages/count_tokens", json={"model": "claude-test", "messages": USER})
        assert counted.status_code == 501

        openai = client.post(
            "/workers", json={"url": "https://api.openai.example", "provider": "openai", "runtime_type": "external"}
        )
        assert openai.status_code == 202
        _wait(lambda: client.get(f"/workers/{openai.json()['worker_id']}").json()["status"] == "ready", "openai")
        not_here = client.post("/v1/messages", json={**BODY, "model": "gpt-5"})
        assert not_here.status_code == 501 and not_here.json()["error"]["type"] == "api_error"


def test_igw_starts_with_no_workers_and_takes_them_at_run_time() -> None:
    worker = spawn_worker(models=[MODEL])
    gw = spawn_gateway([], extra=["--enable-igw", "--health-check-interval-secs", "1"])
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            assert client.get("/readiness").status_code == 503
            assert client.post("/v1/messages", json=BODY).status_code == 404
            client.post("/workers", json={"url": worker.url})
            _wait(lambda: client.get("/readiness").status_code == 200, "readiness")
            assert client.post("/v1/messages", json=BODY).status_code == 200
    finally:
        gw.stop()
        worker.stop()


def test_igw_refuses_nothing_but_without_it_a_second_kind_is_a_400(workers: list[Spawned]) -> None:
    gw = _gateway([workers[0].url])
    try:
        refused = httpx.post(gw.url + "/workers", json={"url": f"grpc://127.0.0.1:{free_port()}"})
        assert refused.status_code == 400 and "IGW" in refused.json()["error"]
    finally:
        gw.stop()


def test_a_request_for_a_model_nobody_serves_does_not_wait_for_a_worker_that_never_answers(
    workers: list[Spawned],
) -> None:
    from tools.servers.redis import Unanswering

    with Unanswering() as silent:
        gw = _gateway([workers[0].url], "--api-key", "admin-key")
        try:
            with httpx.Client(base_url=gw.url, timeout=10.0, headers=KEY) as client:
                added = client.post("/workers", json={"url": f"http://127.0.0.1:{silent.port}"})
                assert added.status_code == 202, added.text
                _wait(lambda: silent.accepted >= 1, "the discovery's connection")
                answer = client.post("/v1/messages", json={**BODY, "model": "no-such-model"})
                assert answer.status_code == 503, answer.text
                assert answer.headers["x-smg-error-code"] == "no_available_workers"
                served = client.post("/v1/messages", json=BODY)
                assert served.status_code == 200, served.text
                # The answers came while the first discovery still waited (it gives up after 5 s).
                assert "model discovery failed" not in gw.log(), gw.log()
        finally:
            gw.stop()
