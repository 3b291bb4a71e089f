"""Hostile headers and bodies against a live gateway, then the journal checked in SQL: every
request is there once, under an id of the gateway's, with a complete event sequence
(`received` first, `completed` last, no gap), whatever bytes the client sent."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.reader import JournalReader
from tests.conftest import MODEL
from tools.spawn import Spawned, spawn_gateway

KEY = "fuzz-gateway-key"
# Bytes a header value may carry on the wire (h11 refuses control characters), UTF-8 or not.
HEADER_BYTES = st.binary(min_size=0, max_size=40).map(
    lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip(b" ")  # h11 refuses edge spaces
)
SURROGATE = '{"model": "MODEL", "max_tokens": 4, "messages": [{"role": "user", "content": "\\ud800"}]}'


def _mcp_body(text: str, key: str) -> bytes:
    value = "tok-secret" if "token" in key else "not-a-secret"
    server = f'{{"name": "s", "url": "http://127.0.0.1:9", "{key}": "{value}"}}'
    message = json.dumps({"role": "user", "content": text})
    return f'{{"model": "{MODEL}", "max_tokens": 4, "messages": [{message}], "mcp_servers": [{server}]}}'.encode()


BODIES = st.one_of(
    st.binary(max_size=200),
    st.just(SURROGATE.replace("MODEL", MODEL).encode()),
    st.builds(
        _mcp_body, st.text(max_size=30), st.sampled_from(["authorization_token", "authorization\\u005ftoken", "x"])
    ),
)


@pytest.fixture(scope="module")
def fuzz_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz") / "journal.db"


@pytest.fixture(scope="module")
def fuzzed(worker: Spawned, fuzz_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway([worker.url], journal=fuzz_journal, extra=["--api-key", KEY, "--disable-retries"])
    try:
        yield proc
    finally:
        proc.stop()


def test_hostile_requests_each_leave_one_complete_record(fuzzed: Spawned, fuzz_journal: Path) -> None:
    sent: list[int] = []

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(
        request_id=HEADER_BYTES,
        other=HEADER_BYTES,
        body=BODIES,
        authorized=st.booleans(),
        path=st.sampled_from(["/v1/messages", "/v1/messages/count_tokens", "/v1/messages?key=sk-q"]),
    )
    def one(request_id: bytes, other: bytes, body: bytes, authorized: bool, path: str) -> None:
        headers: dict[str, bytes] = {"content-type": b"application/json", "x-request-id": request_id, "x-other": other}
        if authorized:
            headers["authorization"] = f"Bearer {KEY}".encode()
        response = httpx.post(fuzzed.url + path, content=body, headers=headers, timeout=30)
        assert response.status_code != 401 or not authorized
        sent.append(response.status_code)

    one()
    assert len(sent) >= 80
    deadline = time.monotonic() + 30
    conn = sqlite3.connect(f"file:{fuzz_journal}?mode=ro", uri=True)
    try:
        while True:
            pending = conn.execute("SELECT count(*) FROM requests WHERE completed = 0").fetchone()[0]
            total = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
            if (pending == 0 and total >= len(sent)) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert total == len(sent) and pending == 0
        # Each request: events numbered 1..n without a gap, `received` first, `completed` last, once each.
        broken = []
        with JournalReader(fuzz_journal) as reader:
            for (request_id,) in conn.execute("SELECT id FROM requests"):
                events = reader.raw_events(request_id)
                kinds = [kind for _, kind, _, _ in events]
                seqs = [seq for seq, _, _, _ in events]
                whole = kinds[:1] == ["received"] and kinds[-1:] == ["completed"]
                if seqs != list(range(1, len(seqs) + 1)) or not whole or kinds.count("received") != 1:
                    broken.append(request_id)
                elif kinds.count("completed") != 1:
                    broken.append(request_id)
        assert broken == []
        foreign = "SELECT count(*) FROM requests WHERE id NOT LIKE 'msg_%' AND id NOT LIKE 'req_%'"
        assert conn.execute(foreign).fetchone()[0] == 0  # every request under an id of the gateway's
    finally:
        conn.close()
    for file in fuzz_journal.parent.glob(fuzz_journal.name + "*"):
        data = file.read_bytes()
        assert b"sk-q" not in data and b"tok-secret" not in data
