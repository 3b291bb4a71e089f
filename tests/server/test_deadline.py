"""The request's one deadline on the HTTP relay: `--request-timeout-secs` bounds the whole
request, every retry and backoff included, and a stream that outlives it ends with a
`timeout_error` event; the journal records a 504, not a client disconnect."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def deadline_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("relay-deadline") / "journal.db"


@pytest.fixture(scope="module")
def impatient(worker: Spawned, deadline_journal: Path) -> Iterator[Spawned]:
    # Retries on (the default: 5), one second for the whole request.
    extra = ["--request-timeout-secs", "1", "--retry-max-retries", "5"]
    proc = spawn_gateway([worker.url], journal=deadline_journal, extra=extra)
    try:
        yield proc
    finally:
        proc.stop()


def test_retries_stay_within_the_deadline(impatient: Spawned, scripted: Scripted, deadline_journal: Path) -> None:
    # Six slow 503s: each attempt answers within the deadline, all of them together do not.
    scripted.script(*[{"status": 503, "delay_ms": 400, "json": {"error": "busy"}}] * 6)
    reply = httpx.post(impatient.url + "/v1/messages", json=BODY, timeout=30)
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["type"] == "timeout_error"
    assert reply.headers["x-smg-error-code"] == "request_timeout"
    assert len(scripted.received()) < 6
    events = wait_for_events(deadline_journal, reply.headers["x-request-id"])
    completed = events[-1]
    assert completed.status == 504 and not completed.disconnected  # type: ignore[attr-defined]


def test_a_stream_past_the_deadline_ends_with_a_timeout_error_event(impatient: Spawned, scripted: Scripted) -> None:
    frames = [{"event": "ping", "data": {"type": "ping"}}] * 12
    scripted.script({"sse": frames, "chunk_delay_ms": 300})
    with httpx.stream("POST", impatient.url + "/v1/messages", json={**BODY, "stream": True}, timeout=30) as reply:
        assert reply.status_code == 200
        text = reply.read().decode()
    assert "event: error" in text and '"timeout_error"' in text
