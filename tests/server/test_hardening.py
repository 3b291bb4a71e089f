"""Hostile corners of the HTTP and Anthropic backends, over loopback: bodies the parser must
refuse with a 400 envelope (or serve), header bytes that cannot be forwarded, the gateway's own
key kept from workers, and worker addresses kept out of client-facing error messages."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway, spawn_worker

BIG = "123456789012345678901234"  # beyond 64 bits: the exact-integer path
HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


def _body(extra: str = "", content: str = '"hi"') -> bytes:
    message = f'{{"role": "user", "content": {content}}}'
    return f'{{"model": "{MODEL}", "max_tokens": 8, "messages": [{message}]{extra}}}'.encode()


def _envelope(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["request_id"] == response.headers["x-request-id"]
    error: dict[str, str] = body["error"]
    return error


@pytest.mark.parametrize(
    "body",
    [
        # a lone surrogate beside a big integer (where the schema keeps any value)
        _body(f', "tools": [{{"name": "t", "input_schema": {{"type": "object", "x": {BIG}}}}}]', content='"\\ud800"'),
        _body(f', "metadata": {{"x": {"[" * 10_000}{BIG}{"]" * 10_000}}}'),  # 10,000 deep with a big integer
        _body(f', "metadata": {{"x": {"[" * 1_100}1{"]" * 1_100}}}'),  # beyond the parser's depth
    ],
    ids=["surrogate-big-int", "deep-big-int", "too-deep"],
)
def test_parser_corners_are_400_envelopes(client: httpx.Client, body: bytes) -> None:
    error = _envelope(client.post("/v1/messages", content=body, headers=HEADERS), 400)
    assert error["type"] == "invalid_request_error"


def test_deep_document_with_a_big_integer_within_the_depth_limit_is_served(
    client: httpx.Client, scripted: Scripted
) -> None:
    body = _body(f', "metadata": {{"user_id": "u", "x": {"[" * 200}{BIG}{"]" * 200}}}')
    response = client.post("/v1/messages", content=body, headers=HEADERS)
    assert response.status_code == 200, response.text
    assert BIG in str(scripted.received()[-1]["body"])


@pytest.mark.parametrize("name", ["x-request-id", "x-correlation-id", "traceparent", "tracestate", "x-smg-routing-key"])
def test_informational_header_with_non_ascii_bytes_is_served_without_it(
    client: httpx.Client, scripted: Scripted, name: str
) -> None:
    response = client.post("/v1/messages", content=_body(), headers={**HEADERS, name: b"v\xe9\xff"})
    assert response.status_code == 200, response.text
    assert name not in scripted.received()[-1]["headers"]


@pytest.mark.parametrize("name", ["authorization", "anthropic-beta", "anthropic-version"])
def test_credential_or_version_header_with_non_ascii_bytes_is_a_400(
    client: httpx.Client, scripted: Scripted, name: str
) -> None:
    response = client.post("/v1/messages", content=_body(), headers={**HEADERS, name: b"Bearer k\xe9y"})
    error = _envelope(response, 400)
    assert name in error["message"] and "k\xe9y" not in error["message"]
    assert scripted.received() == []


def test_utf8_request_id_is_echoed_and_not_forwarded(client: httpx.Client, scripted: Scripted) -> None:
    response = client.post("/v1/messages", content=_body(), headers={**HEADERS, "x-request-id": "id-é".encode()})
    assert response.status_code == 200, response.text
    assert dict(response.headers.raw)[b"x-request-id"] == "id-é".encode()
    assert "x-request-id" not in scripted.received()[-1]["headers"]


KEY = "gateway-secret-key"


@pytest.fixture(scope="module")
def keyed(worker: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    journal = tmp_path_factory.mktemp("keyed") / "journal.db"
    extra = ["--api-key", KEY, "--disable-retries", "--policy", "round_robin"]
    proc = spawn_gateway([worker.url], journal=journal, extra=extra)
    try:
        yield proc
    finally:
        proc.stop()


def test_gateway_key_is_not_forwarded_to_a_worker(keyed: Spawned, scripted: Scripted) -> None:
    headers = {**HEADERS, "authorization": f"Bearer {KEY}"}
    response = httpx.post(keyed.url + "/v1/messages", content=_body(), headers=headers)
    assert response.status_code == 200, response.text
    assert "authorization" not in scripted.received()[-1]["headers"]


def test_a_clients_own_authorization_still_reaches_the_worker(client: httpx.Client, scripted: Scripted) -> None:
    response = client.post("/v1/messages", content=_body(), headers={**HEADERS, "authorization": "Bearer client-own"})
    assert response.status_code == 200, response.text
    assert scripted.received()[-1]["headers"]["authorization"] == "Bearer client-own"


def test_a_workers_own_key_replaces_the_gateway_key(keyed: Spawned) -> None:
    auth = {"authorization": f"Bearer {KEY}"}
    with spawn_worker(models=[MODEL]) as second:
        other = Scripted(second.url)
        added = httpx.post(keyed.url + "/workers", json={"url": second.url, "api_key": "worker-key"}, headers=auth)
        assert added.status_code in (200, 202), added.text
        for _ in range(50):  # until the worker is discovered and a request reaches it
            response = httpx.post(keyed.url + "/v1/messages", content=_body(), headers={**HEADERS, **auth})
            assert response.status_code == 200, response.text
            if other.received():
                break
            time.sleep(0.1)
        seen = {r["headers"].get("authorization") for r in other.received() if r.get("path") == "/v1/messages"}
        assert seen == {"Bearer worker-key"}


def test_worker_address_is_in_the_journal_not_in_the_envelope(
    worker: Spawned, scripted: Scripted, tmp_path: Path
) -> None:
    journal = tmp_path / "journal.db"
    extra = ["--disable-retries", "--request-timeout-secs", "1"]
    with spawn_gateway([worker.url], journal=journal, extra=extra) as gateway:
        scripted.script({"delay_ms": 3000, "json": {}})
        response = httpx.post(gateway.url + "/v1/messages", content=_body(), headers=HEADERS, timeout=30)
        error = _envelope(response, 504)
        port = worker.url.rsplit(":", 1)[1]
        assert "127.0.0.1" not in error["message"] and port not in error["message"], error
        events = wait_for_events(journal, _journal_id(journal))
        assert [getattr(e, "worker", None) for e in events if e.kind == "routed"] == [worker.url]


def _journal_id(journal: Path) -> str:
    """The id of the one request the journal holds, once it is there."""
    for _ in range(200):
        rows: list[tuple[str]] = []
        if journal.exists():
            conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
            try:
                rows = conn.execute("SELECT id FROM requests ORDER BY rowid DESC LIMIT 1").fetchall()
            except sqlite3.OperationalError:
                rows = []
            finally:
                conn.close()
        if rows:
            return rows[0][0]
        time.sleep(0.05)
    raise AssertionError("no request journaled")
