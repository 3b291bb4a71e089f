"""Every request leaves a complete event sequence: success, refusal, worker failure."""

from __future__ import annotations

from pathlib import Path

import httpx

from journal.events import Completed, Error, Received, Routed, Upstream, Validated
from smg.projection import reconstruct
from tests.conftest import MODEL, Scripted, wait_for_events

BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "journal me"}]}


def test_success_sequence_and_reconstruction(client: httpx.Client, scripted: Scripted, journal_path: Path) -> None:
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "seq-ok-1", "x-api-key": "sk-secret"})
    events = wait_for_events(journal_path, "seq-ok-1")
    assert [e.kind for e in events] == ["received", "validated", "routed", "upstream", "upstream", "completed"]
    received, validated, routed, head, body, completed = events
    assert isinstance(received, Received) and received.path == "/v1/messages"
    assert received.client_request_id == "seq-ok-1"
    assert received.request_id.startswith("msg_")  # the gateway's own id keys the journal
    assert received.headers["x-api-key"].startswith("[redacted sha256:")
    assert isinstance(validated, Validated) and validated.model == MODEL and validated.stream is False
    assert isinstance(routed, Routed) and routed.backend == "http" and routed.worker
    assert isinstance(head, Upstream) and head.part == "head" and head.status == 200
    assert isinstance(body, Upstream) and body.part == "body"
    assert (
        isinstance(completed, Completed) and completed.status == 200 and completed.bytes_sent == len(response.content)
    )
    assert [e.t for e in events] == sorted(e.t for e in events)
    rebuilt = reconstruct(events)
    assert rebuilt.status == 200 and rebuilt.body == response.content
    assert rebuilt.headers["x-request-id"] == "seq-ok-1"
    assert rebuilt.headers["request-id"] == response.headers["request-id"] == "seq-ok-1"


def test_streamed_success_reconstructs_the_exact_sse(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    with client.stream(
        "POST", "/v1/messages", json={**BODY, "stream": True}, headers={"x-request-id": "seq-sse-1"}
    ) as response:
        data = b"".join(response.iter_raw())
    events = wait_for_events(journal_path, "seq-sse-1")
    kinds = [e.kind for e in events]
    assert kinds[:4] == ["received", "validated", "routed", "upstream"] and kinds[-1] == "completed"
    assert all(k == "upstream" for k in kinds[3:-1])
    rebuilt = reconstruct(events)
    assert rebuilt.streamed and rebuilt.body == data


def test_refusal_sequence(client: httpx.Client, journal_path: Path) -> None:
    client.post("/v1/messages", json={"model": MODEL, "messages": []}, headers={"x-request-id": "seq-bad-1"})
    events = wait_for_events(journal_path, "seq-bad-1")
    assert [e.kind for e in events] == ["received", "rejected", "error", "completed"]
    assert events[1].status == 400 and events[1].error_type == "invalid_request_error"
    assert events[-1].status == 400
    assert reconstruct(events).status == 400


def test_worker_failure_sequence(client: httpx.Client, scripted: Scripted, journal_path: Path) -> None:
    scripted.script({"drop": True})
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "seq-fail-1"})
    assert response.status_code == 502
    events = wait_for_events(journal_path, "seq-fail-1")
    assert [e.kind for e in events] == ["received", "validated", "routed", "error", "completed"]
    error = events[3]
    assert isinstance(error, Error) and error.code == "call_upstream_connection_failed" and error.status == 502
    rebuilt = reconstruct(events)
    assert rebuilt.status == 502 and rebuilt.body == response.content


def test_upstream_error_sequence(client: httpx.Client, scripted: Scripted, journal_path: Path) -> None:
    scripted.script({"status": 500, "body": "boom"})
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "seq-500-1"})
    events = wait_for_events(journal_path, "seq-500-1")
    kinds = ["received", "validated", "routed", "upstream", "upstream", "error", "completed"]
    assert [e.kind for e in events] == kinds  # the error the client was told, made from the upstream's
    assert reconstruct(events).body == response.content


def test_client_disconnect_mid_stream_is_journaled(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    frames = [{"event": "ping", "data": {"type": "ping"}}] * 200
    scripted.script({"sse": frames, "chunk_delay_ms": 20})
    with client.stream(
        "POST", "/v1/messages", json={**BODY, "stream": True}, headers={"x-request-id": "seq-gone-1"}
    ) as r:
        next(r.iter_raw())  # the first bytes arrive, then the client hangs up
    events = wait_for_events(journal_path, "seq-gone-1")
    completed = events[-1]
    assert isinstance(completed, Completed) and completed.disconnected and completed.status == 200
    assert sum(1 for e in events if e.kind == "upstream") < 150  # the relay stopped reading
