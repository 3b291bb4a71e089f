"""Both upstream transports relay the same bytes and classify failures the same way: a refused
connection or a hang-up is 502, a timeout 504, and the worker sees no header of the client
library's own."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import MODEL, Scripted
from tools.spawn import Spawned, free_port, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "transport"}]}


@pytest.fixture(scope="module", params=["aiohttp", "httpx"])
def via(request: pytest.FixtureRequest, worker: Spawned) -> Iterator[Spawned]:
    extra = ["--upstream-transport", request.param, "--disable-retries", "--request-timeout-secs", "2"]
    proc = spawn_gateway([worker.url], extra=extra)
    try:
        yield proc
    finally:
        proc.stop()


def test_json_and_stream_relay(via: Spawned, scripted: Scripted) -> None:
    assert httpx.post(via.url + "/v1/messages", json=BODY).json()["content"][0]["text"] == "echo: transport"
    with httpx.stream("POST", via.url + "/v1/messages", json={**BODY, "stream": True}) as response:
        data = b"".join(response.iter_raw())
    assert data.rstrip().endswith(b'data: {"type":"message_stop"}')


def test_worker_sees_only_forwarded_headers(via: Spawned, scripted: Scripted) -> None:
    httpx.post(via.url + "/v1/messages", json=BODY, headers={"anthropic-version": "2023-06-01"})
    seen = set(scripted.received()[-1]["headers"])
    # x-smg-hops: the gateway's own loop guard (README, Security), on everything it sends.
    assert seen <= {"host", "content-length", "content-type", "anthropic-version", "x-smg-hops"}, seen


def test_hang_up_is_502(via: Spawned, scripted: Scripted) -> None:
    scripted.script({"drop": True})
    response = httpx.post(via.url + "/v1/messages", json=BODY)
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "call_upstream_connection_failed"


def test_timeout_is_504(via: Spawned, scripted: Scripted) -> None:
    scripted.script({"delay_ms": 4000})
    response = httpx.post(via.url + "/v1/messages", json=BODY, timeout=15)
    assert response.status_code == 504
    assert response.headers["x-smg-error-code"] == "call_upstream_timeout"


@pytest.mark.parametrize("transport", ["aiohttp", "httpx"])
def test_refused_connection_is_502(transport: str, worker: Spawned) -> None:
    from tools.spawn import spawn_worker

    # Discovered while alive, then killed: the next request meets a port nothing listens on.
    doomed = spawn_worker(free_port(), models=[MODEL])
    gw = spawn_gateway([doomed.url], extra=["--upstream-transport", transport, "--disable-retries"])
    try:
        doomed.kill()
        response = httpx.post(gw.url + "/v1/messages", json=BODY, timeout=15)
    finally:
        gw.stop()
        doomed.stop()
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "call_upstream_connection_failed"
