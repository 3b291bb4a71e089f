"""Concurrency admission over loopback: a gateway with `--max-concurrent-requests 1` in front of
the scripted engine, whose held streams keep a slot busy for as long as a test wants."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Admission, Completed, Error, Rejected
from tests.admission.conftest import MODEL, QWEN3, events_until, new_id
from tests.conftest import wait_for_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_gateway

USER = [{"role": "user", "content": "Say hello."}]
BODY = {"model": MODEL, "max_tokens": 32, "messages": USER}


def _gateway(adm_engine: Spawned, journal: Path, *flags: str) -> Spawned:
    return spawn_gateway(
        [adm_engine.url], journal=journal, extra=["--model-path", str(QWEN3), "--max-concurrent-requests", "1", *flags]
    )


@pytest.fixture(scope="module")
def no_queue(adm_engine: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spawned, Path]]:
    journal = tmp_path_factory.mktemp("adm-noqueue") / "journal.db"
    proc = _gateway(adm_engine, journal, "--queue-size", "0")
    try:
        yield proc, journal
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def queued(adm_engine: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spawned, Path]]:
    journal = tmp_path_factory.mktemp("adm-queue") / "journal.db"
    proc = _gateway(adm_engine, journal, "--queue-size", "1", "--queue-timeout-secs", "1")
    try:
        yield proc, journal
    finally:
        proc.stop()


class HeldStream:
    """A streamed request the engine holds after a few tokens: it keeps its slot until released."""

    def __init__(self, client: httpx.Client, request_id: str) -> None:
        self._cm = client.stream(
            "POST", "/v1/messages", json={**BODY, "stream": True}, headers={"x-request-id": request_id}
        )
        self.response = self._cm.__enter__()
        assert self.response.status_code == 200
        self.lines = self.response.iter_lines()
        assert next(self.lines).startswith("event: message_start")

    def rest(self) -> str:
        return "\n".join(self.lines)

    def close(self) -> None:
        self._cm.__exit__(None, None, None)


def _assert_shed(response: httpx.Response, status: int, code: str, message: str) -> None:
    assert response.status_code == status, response.text
    assert response.headers["retry-after"] == "2"
    assert response.headers["x-smg-error-code"] == code
    body = response.json()
    assert body["type"] == "error"
    assert body["error"] == {"type": "rate_limit_error" if status == 429 else "overloaded_error", "message": message}
    assert body["request_id"] == response.headers["x-request-id"]


def test_a_held_stream_keeps_its_slot_and_the_next_request_is_refused_at_once(
    no_queue: tuple[Spawned, Path], engine_control: EngineControl
) -> None:
    gateway, journal = no_queue
    engine_control.script({"text": "one two three four five six", "hold_after": 2})
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        held = HeldStream(client, new_id())
        try:
            refused = client.post("/v1/messages", json=BODY, headers={"x-request-id": (rid := new_id())})
            _assert_shed(refused, 429, "admission_queue_full", "concurrency limit reached and queuing is disabled")
            # count_tokens is answered by the gateway itself, yet it waits for the same slots.
            counted = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER})
            _assert_shed(counted, 429, "admission_queue_full", "concurrency limit reached and queuing is disabled")
            engine_control.release()
            assert "event: message_stop" in held.rest()
        finally:
            held.close()
        # The stream has ended: its slot is free again.
        assert client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER}).status_code == 200
        engine_control.script({"text": "ok"})
        assert client.post("/v1/messages", json=BODY).status_code == 200
    events = wait_for_events(journal, rid)
    gates = [e for e in events if isinstance(e, Admission)]
    assert [(g.gate, g.decision) for g in gates] == [("concurrency", "queue_full")]
    rejected = [e for e in events if isinstance(e, Rejected)]
    assert [(r.status, r.code) for r in rejected] == [(429, "admission_queue_full")]
    error = next(e for e in events if isinstance(e, Error))
    assert error.stage == "admission" and error.headers["Retry-After"] == "2"
    assert not any(e.kind == "routed" for e in events)


def test_a_client_that_goes_away_gives_its_slot_back(
    no_queue: tuple[Spawned, Path], engine_control: EngineControl
) -> None:
    gateway, journal = no_queue
    engine_control.script({"text": "one two three four five six", "hold_after": 2})
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        held = HeldStream(client, gone := new_id())
        held.close()  # the client hangs up mid-stream
        completed = wait_for_events(journal, gone)[-1]
        assert isinstance(completed, Completed) and completed.disconnected
        engine_control.script({"text": "ok"})
        assert client.post("/v1/messages", json=BODY).status_code == 200


def _post_in_thread(url: str, request_id: str, out: dict[str, Any]) -> threading.Thread:
    def run() -> None:
        with httpx.Client(base_url=url, timeout=30.0) as client:
            out["response"] = client.post("/v1/messages", json=BODY, headers={"x-request-id": request_id})

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_queued_request_waits_for_the_slot_and_a_full_queue_refuses_at_once(
    queued: tuple[Spawned, Path], engine_control: EngineControl
) -> None:
    gateway, journal = queued
    engine_control.script({"text": "one two three four five six", "hold_after": 2}, {"text": "queued answer"})
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        held = HeldStream(client, new_id())
        waiting: dict[str, Any] = {}
        thread = _post_in_thread(gateway.url, waiter := new_id(), waiting)
        try:
            events_until(journal, waiter, "validated")  # it is in the queue now
            full = client.post("/v1/messages", json=BODY)
            _assert_shed(full, 429, "admission_queue_full", "admission queue is at capacity")
            engine_control.release()
            assert "event: message_stop" in held.rest()
        finally:
            held.close()
            thread.join(30)
    assert waiting["response"].status_code == 200
    assert waiting["response"].json()["content"][0]["text"] == "queued answer"
    gate = next(e for e in wait_for_events(journal, waiter) if isinstance(e, Admission))
    assert gate.gate == "concurrency" and gate.decision == "admitted" and gate.queued_ms > 0


def test_a_request_that_waits_past_the_timeout_gets_503(
    queued: tuple[Spawned, Path], engine_control: EngineControl
) -> None:
    gateway, journal = queued
    engine_control.script({"text": "one two three four five six", "hold_after": 2})
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        held = HeldStream(client, new_id())
        try:
            late = client.post("/v1/messages", json=BODY, headers={"x-request-id": (rid := new_id())})
            _assert_shed(late, 503, "admission_queue_timeout", "timed out waiting for an admission slot")
            engine_control.release()
            held.rest()
        finally:
            held.close()
    gate = next(e for e in wait_for_events(journal, rid) if isinstance(e, Admission))
    assert gate.decision == "queue_timeout" and gate.queued_ms >= 1000
