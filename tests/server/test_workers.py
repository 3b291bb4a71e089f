"""Worker pools: round robin, retries on another worker, a worker that dies and comes back,
health checks, upstream timeouts. Never a hang, never a traceback: always an envelope."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import MODEL, Scripted
from tools.spawn import Spawned, free_port, spawn_gateway, spawn_worker

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "pool"}]}


@pytest.fixture
def pair() -> Iterator[tuple[Scripted, Scripted, Spawned, Spawned]]:
    first, second = spawn_worker(models=[MODEL]), spawn_worker(models=[MODEL])
    try:
        yield Scripted(first.url), Scripted(second.url), first, second
    finally:
        first.stop()
        second.stop()


def _gateway(urls: list[str], *extra: str) -> Spawned:
    return spawn_gateway(urls, extra=["--health-check-interval-secs", "1", *extra])


def test_round_robin_across_healthy_workers(pair: tuple[Scripted, Scripted, Spawned, Spawned]) -> None:
    a, b, wa, wb = pair
    gw = _gateway([wa.url, wb.url], "--policy", "round_robin")
    try:
        seen = {httpx.post(gw.url + "/v1/messages", json=BODY).headers["x-smg-routed-worker-id"] for _ in range(4)}
    finally:
        gw.stop()
    assert seen == {wa.url, wb.url}


def test_retry_moves_a_dropped_request_to_the_other_worker(pair: tuple[Scripted, Scripted, Spawned, Spawned]) -> None:
    a, b, wa, wb = pair
    a.script({"drop": True})
    b.script({"drop": True})
    gw = _gateway([wa.url, wb.url], "--retry-max-retries", "5")
    try:
        response = httpx.post(gw.url + "/v1/messages", json=BODY)
    finally:
        gw.stop()
    assert response.status_code == 200
    assert len(a.received()) + len(b.received()) == 3  # dropped on one, dropped on the other, served


def test_retryable_status_is_retried_then_relayed_when_retries_run_out(
    pair: tuple[Scripted, Scripted, Spawned, Spawned],
) -> None:
    a, _, wa, _ = pair
    a.script({"status": 503, "body": "warming up"}, {"status": 503, "body": "still warming up"})
    gw = _gateway([wa.url], "--retry-max-retries", "2")
    try:
        response = httpx.post(gw.url + "/v1/messages", json=BODY)
    finally:
        gw.stop()
    assert response.status_code == 503
    assert response.json()["error"] == {"type": "overloaded_error", "message": "still warming up"}
    assert len(a.received()) == 2


def test_dead_worker_is_502_then_503_then_serves_again_when_back() -> None:
    port = free_port()
    worker = spawn_worker(port, models=[MODEL])
    gw = _gateway([worker.url], "--disable-retries")
    try:
        assert httpx.post(gw.url + "/v1/messages", json=BODY).status_code == 200
        worker.kill()
        first = httpx.post(gw.url + "/v1/messages", json=BODY, timeout=10)
        assert first.status_code == 502
        assert first.headers["x-smg-error-code"] == "call_upstream_connection_failed"
        second = httpx.post(gw.url + "/v1/messages", json=BODY, timeout=10)
        assert second.status_code == 503
        assert second.headers["x-smg-error-code"] == "no_available_workers"
        assert second.json()["error"]["type"] == "overloaded_error"
        worker = spawn_worker(port, models=[MODEL])
        deadline = time.monotonic() + 15
        status = 0
        while time.monotonic() < deadline and status != 200:
            status = httpx.post(gw.url + "/v1/messages", json=BODY).status_code
            time.sleep(0.2)
        assert status == 200
    finally:
        gw.stop()
        worker.stop()


def test_unhealthy_worker_is_taken_out_by_health_checks(pair: tuple[Scripted, Scripted, Spawned, Spawned]) -> None:
    a, _, wa, _ = pair
    gw = _gateway([wa.url], "--disable-retries")
    try:
        a.health(False)
        deadline = time.monotonic() + 10
        status = 200
        while time.monotonic() < deadline and status == 200:
            status = httpx.post(gw.url + "/v1/messages", json=BODY).status_code
            time.sleep(0.2)
        assert status == 503
        a.health(True)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and status != 200:
            status = httpx.post(gw.url + "/v1/messages", json=BODY).status_code
            time.sleep(0.2)
        assert status == 200
    finally:
        gw.stop()


def test_unreachable_worker_at_start_answers_503_not_a_hang() -> None:
    gw = _gateway([f"http://127.0.0.1:{free_port()}"], "--disable-retries")
    try:
        response = httpx.post(gw.url + "/v1/messages", json=BODY, timeout=10)
    finally:
        gw.stop()
    assert response.status_code == 503
    assert response.headers["x-smg-error-code"] == "no_available_workers"


def test_slow_worker_is_a_504_timeout(pair: tuple[Scripted, Scripted, Spawned, Spawned]) -> None:
    a, _, wa, _ = pair
    a.script({"delay_ms": 3000})
    gw = _gateway([wa.url], "--disable-retries", "--request-timeout-secs", "1")
    try:
        response = httpx.post(gw.url + "/v1/messages", json=BODY, timeout=10)
    finally:
        gw.stop()
    assert response.status_code == 504
    assert response.headers["x-smg-error-code"] == "call_upstream_timeout"
    assert response.json()["error"]["type"] == "timeout_error"
