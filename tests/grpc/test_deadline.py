"""The request's one deadline on gRPC `Generate`: a generation that outlives
`--request-timeout-secs` ends as a 504 `timeout_error` (an SSE error event once streaming),
the engine request is aborted, and the journal records a timeout, not a client disconnect."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_for_events
from tests.grpc.conftest import MODEL, QWEN3
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_gateway

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def deadline_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deadline") / "journal.db"


@pytest.fixture(scope="module")
def impatient(engine: Spawned, deadline_journal: Path) -> Iterator[Spawned]:
    extra = ["--model-path", str(QWEN3), "--request-timeout-secs", "1"]
    proc = spawn_gateway([engine.url], journal=deadline_journal, extra=extra)
    try:
        yield proc
    finally:
        proc.stop()


def _aborted(control: EngineControl) -> str:
    request_id = control.received()[-1]["request_id"]
    for _ in range(200):
        if request_id in control.aborts():
            return str(request_id)
        time.sleep(0.05)
    raise AssertionError("the engine never saw the Abort")


def test_a_hung_generation_is_a_504_and_is_aborted(
    impatient: Spawned, control: EngineControl, deadline_journal: Path
) -> None:
    control.script({"text": "an answer the engine never finishes", "hold_after": 2})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER}
    reply = httpx.post(impatient.url + "/v1/messages", json=body, timeout=30)
    assert reply.status_code == 504, reply.text
    assert reply.json()["error"]["type"] == "timeout_error"
    assert reply.headers["x-smg-error-code"] == "request_timeout"
    _aborted(control)
    control.release()
    events = wait_for_events(deadline_journal, _last_id(deadline_journal))
    completed = events[-1]
    assert completed.status == 504 and not completed.disconnected  # type: ignore[attr-defined]
    assert any(e.kind == "error" and e.status == 504 for e in events)  # type: ignore[attr-defined]


def test_a_hung_stream_ends_with_a_timeout_error_event(impatient: Spawned, control: EngineControl) -> None:
    control.script({"text": "an answer the engine never finishes", "hold_after": 2})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "stream": True}
    with httpx.stream("POST", impatient.url + "/v1/messages", json=body, timeout=30) as reply:
        assert reply.status_code == 200
        text = reply.read().decode()
    assert "event: error" in text and '"timeout_error"' in text
    assert "message_stop" not in text
    _aborted(control)
    control.release()


def _last_id(journal: Path) -> str:
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        return str(conn.execute("SELECT id FROM requests ORDER BY rowid DESC LIMIT 1").fetchone()[0])
    finally:
        conn.close()
