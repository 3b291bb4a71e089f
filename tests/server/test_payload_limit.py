"""A body over `--max-payload-size` is answered 413 in the Messages envelope, and the client
reads that answer: the rest of the body is read and thrown away before the connection closes
(a client still uploading would otherwise see its connection reset, and an SDK would send the
upload again), up to a bound past which the upload is cut off."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import anthropic
import httpx
import pytest

from journal.reader import JournalReader
from tests.conftest import MODEL, wait_for_events
from tools.spawn import Spawned, spawn_gateway

LIMIT = 65_536
BIG = "x" * (8 << 20)  # 8 MiB: far more than the socket buffers hold, so the client is still sending
HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


@pytest.fixture(scope="module")
def limited_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("limited") / "journal.db"


@pytest.fixture(scope="module")
def limited(worker: Spawned, limited_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway([worker.url], journal=limited_journal, extra=["--max-payload-size", str(LIMIT)])
    try:
        yield proc
    finally:
        proc.stop()


def _requests(journal: Path) -> int:
    with JournalReader(journal) as reader:
        return reader.count()


def _assert_413(status: int, body: object, code: str | None) -> None:
    assert status == 413
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "request_too_large"
    assert code == "request_body_too_large"


@pytest.mark.parametrize("max_retries", [0, 2])
def test_the_sdk_reads_the_413_and_does_not_send_the_upload_again(
    limited: Spawned, limited_journal: Path, max_retries: int
) -> None:
    before = _requests(limited_journal)
    client = anthropic.Anthropic(base_url=limited.url, api_key="k", max_retries=max_retries, timeout=60)
    with pytest.raises(anthropic.APIStatusError) as caught:
        client.messages.create(model=MODEL, max_tokens=8, messages=[{"role": "user", "content": BIG}])
    client.close()
    error = caught.value
    _assert_413(error.status_code, error.body, error.response.headers.get("x-smg-error-code"))
    wait_for_events(limited_journal, error.response.headers["x-request-id"])
    assert _requests(limited_journal) == before + 1  # 413 is not retried: one upload, one request


def test_plain_httpx_reads_the_413_of_a_sized_body(limited: Spawned) -> None:
    body = b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "' + BIG.encode() + b'"}]}'
    reply = httpx.post(limited.url + "/v1/messages", content=body, headers=HEADERS, timeout=60)
    _assert_413(reply.status_code, reply.json(), reply.headers.get("x-smg-error-code"))


def test_plain_httpx_reads_the_413_of_a_chunked_body(limited: Spawned) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "'
        for _ in range(64):
            yield b"x" * (128 << 10)
        yield b'"}]}'

    reply = httpx.post(limited.url + "/v1/messages", content=chunks(), headers=HEADERS, timeout=60)
    _assert_413(reply.status_code, reply.json(), reply.headers.get("x-smg-error-code"))


def test_after_the_413_the_connection_is_not_reused(limited: Spawned) -> None:
    with httpx.Client(base_url=limited.url, timeout=60) as client:
        refused = client.post("/v1/messages", content=b"{" + b" " * (4 * LIMIT) + b"}", headers=HEADERS)
        assert refused.status_code == 413 and refused.headers.get("connection") == "close"
        served = client.post(
            "/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        )
        assert served.status_code == 200, served.text


def _head(size: int | None) -> bytes:
    length = f"content-length: {size}" if size is not None else "transfer-encoding: chunked"
    return (
        "POST /v1/messages HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\n"
        f"anthropic-version: 2023-06-01\r\n{length}\r\n\r\n"
    ).encode()


def _read_response(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head


def _connect(gateway: Spawned) -> socket.socket:
    url = urlsplit(gateway.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=30)
    return sock


def test_the_rest_of_a_refused_body_is_read_before_the_connection_closes(limited: Spawned) -> None:
    size = 8 << 20
    with _connect(limited) as sock:
        sock.sendall(_head(size))
        assert _read_response(sock).startswith(b"HTTP/1.1 413 ")  # refused from its declared length
        sock.sendall(b"x" * size)  # what the client declared is taken, not reset
        assert sock.recv(1) == b""  # then a clean close


def test_a_refused_chunked_body_is_read_to_its_end(limited: Spawned) -> None:
    with _connect(limited) as sock:
        sock.sendall(_head(None))
        piece = b"x" * (1 << 20)
        sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        assert _read_response(sock).startswith(b"HTTP/1.1 413 ")  # refused once past the limit
        for _ in range(7):
            sock.sendall(b"%x\r\n%s\r\n" % (len(piece), piece))
        sock.sendall(b"0\r\n\r\n")
        sock.shutdown(socket.SHUT_WR)  # the client is done; the gateway closes too
        assert sock.recv(1) == b""


@pytest.mark.parametrize("sized", [True, False])
def test_an_absurd_upload_is_cut_off_after_the_bound(limited: Spawned, sized: bool) -> None:
    total = 2 << 30  # 2 GiB, more than the gateway ever reads of a refused body
    sent = 0

    def chunks() -> Iterator[bytes]:
        nonlocal sent
        piece = b"x" * (1 << 20)
        while sent < total:
            sent += len(piece)
            yield piece

    headers = {**HEADERS, "content-length": str(total)} if sized else HEADERS
    try:
        reply = httpx.post(limited.url + "/v1/messages", content=chunks(), headers=headers, timeout=60)
    except httpx.TransportError:
        pass  # the connection was cut under the upload before the client read the refusal
    else:
        assert reply.status_code == 413  # read after its upload failed
    assert sent < total // 8
