"""Connection-level limits over raw sockets: a request trickled a byte at a time is cut at the
read deadline (head or body), a connection that sends nothing is closed at the deadline counted
from accept, a new connection at the cap takes the place of one that has sent nothing,
connections past the cap are answered 503 with one log line, and a head past the size limit is
a 431."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import MODEL
from tools.spawn import Spawned, spawn_gateway

CAP = 6


@pytest.fixture(scope="module")
def guarded(worker: Spawned) -> Iterator[Spawned]:
    extra = ["--header-read-timeout-secs", "1", "--max-connections", str(CAP), "--disable-retries"]
    proc = spawn_gateway([worker.url], extra=extra)
    try:
        yield proc
    finally:
        proc.stop()


def _connect(gateway: Spawned) -> socket.socket:
    host, port = gateway.url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=5)
    return sock


def _trickle_until_closed(sock: socket.socket, head: bytes, drip: bytes, drips: int) -> bytes:
    """Send `head`, then `drip` every 0.2 s; what the server sent once it closed the connection
    (or AssertionError when it never does within `drips` drips)."""
    sock.sendall(head)
    sock.settimeout(0.2)
    received = b""
    for _ in range(drips):
        try:
            sock.sendall(drip)
        except (BrokenPipeError, ConnectionResetError):
            return received
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    raise AssertionError(f"the connection stayed open through {drips} drips: {received!r}")


def test_a_trickled_head_is_cut_at_the_read_deadline(guarded: Spawned) -> None:
    with _connect(guarded) as sock:
        answer = _trickle_until_closed(sock, b"POST /v1/messages HTTP/1.1\r\nhost: x\r\n", b"x-a: b\r\n", 100)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408")


def test_a_trickled_body_is_cut_at_the_read_deadline(guarded: Spawned) -> None:
    head = (
        b"POST /v1/messages HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"anthropic-version: 2023-06-01\r\ncontent-length: 100000\r\n\r\n{"
    )
    with _connect(guarded) as sock:
        answer = _trickle_until_closed(sock, head, b" ", 100)
    assert answer == b"" or answer.startswith(b"HTTP/1.1 408"), answer


def test_idle_connections_are_closed_at_the_deadline_from_accept(guarded: Spawned) -> None:
    # As many silent sockets as the cap allows: without a deadline from accept they would hold
    # every slot for the keep-alive timeout (75 s).
    held = [_connect(guarded) for _ in range(CAP)]
    try:
        for sock in held:
            sock.settimeout(15)
            assert sock.recv(4096) == b""  # closed by the server, nothing written
    finally:
        for sock in held:
            sock.close()
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    assert httpx.post(guarded.url + "/v1/messages", json=body, timeout=10).status_code == 200


def test_a_kept_alive_connection_waits_for_its_next_request_no_longer_than_the_deadline(guarded: Spawned) -> None:
    with _connect(guarded) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        sock.settimeout(15)
        received = b""
        while b"\r\n\r\n" not in received or not received.endswith(b"}"):
            chunk = sock.recv(4096)
            assert chunk, received
            received += chunk
        assert received.startswith(b"HTTP/1.1 200")
        assert sock.recv(4096) == b""  # closed while waiting for a next request


def test_at_the_cap_a_new_connection_takes_the_place_of_the_oldest_silent_one(worker: Spawned) -> None:
    # A deadline far longer than the test: only the cap can close the silent connections.
    extra = ["--header-read-timeout-secs", "60", "--max-connections", str(CAP), "--disable-retries"]
    gateway = spawn_gateway([worker.url], extra=extra)
    held = [_connect(gateway) for _ in range(CAP)]
    try:
        body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        assert httpx.post(gateway.url + "/v1/messages", json=body, timeout=10).status_code == 200
        held[0].settimeout(10)
        assert held[0].recv(4096) == b""  # the oldest made room, closed with nothing written
    finally:
        for sock in held:
            sock.close()
        gateway.stop()


def test_connections_past_the_cap_are_refused_with_503_and_logged(guarded: Spawned) -> None:
    logged = guarded.log().count("connection cap reached")
    held = [_connect(guarded) for _ in range(CAP)]
    try:
        for sock in held:
            sock.sendall(b"G")  # connections that have spoken are never closed to make room
        time.sleep(0.2)  # let the server accept them all
        with _connect(guarded) as extra:
            extra.settimeout(5)
            answer = extra.recv(4096)
        assert answer.startswith(b"HTTP/1.1 503"), answer
    finally:
        for sock in held:
            sock.close()
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    for _ in range(50):  # the held connections close on the server's side shortly
        try:
            response = httpx.post(guarded.url + "/v1/messages", json=body, timeout=5)
        except httpx.HTTPError:
            response = None
        if response is not None and response.status_code == 200:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("no request served after the held connections closed")
    log = guarded.log()
    assert log.count("connection cap reached") == logged + 1
    assert "accepting connections again" in log


def test_a_head_past_the_size_limit_is_a_431(guarded: Spawned) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    headers = {"anthropic-version": "2023-06-01", "x-padding": "p" * 20_000}
    response = httpx.post(guarded.url + "/v1/messages", json=body, headers=headers, timeout=10)
    assert response.status_code == 431, response.text
