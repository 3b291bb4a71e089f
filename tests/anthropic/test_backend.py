"""`--backend anthropic`, end to end: the gateway and a scripted Anthropic API upstream as real
processes (behaviors.md §H, C.4, D.1, J)."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import Scripted, wait_for_events
from tools import anthropic_answers as answers
from tools.spawn import Spawned

MODEL = "claude-sonnet-4-20250514"
BODY = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hello"}]}
CLIENT_HEADERS = {
    "Authorization": "Bearer gateway-and-anthropic",
    "X-Api-Key": "sk-ant-client",
    "Anthropic-Version": "2023-06-01",
    "Anthropic-Beta": "mcp-client-2025-11-20",
}
# What HTTP itself adds to any request, and the gateway's hop header (a loop of gateways is cut
# by it); everything else the upstream sees must be the client's.
TRANSPORT = {"host", "content-length", "x-smg-hops"}


def _kinds(events: list) -> list[str]:
    return [e.kind if e.kind != "upstream" else f"upstream:{e.part}" for e in events]


def test_upstream_gets_exactly_the_clients_credentials_and_nothing_else(api: httpx.Client, scripted: Scripted) -> None:
    extra = {
        "X-SMG-MCP": "enabled", "x-request-id": "rid-1", "User-Agent": "client/1", "X-Other": "no", "Cookie": "c=1",
    }  # fmt: skip
    response = api.post("/v1/messages", json=BODY, headers={**CLIENT_HEADERS, **extra})
    assert response.status_code == 200
    (seen,) = scripted.received()
    assert seen["path"] == "/v1/messages"
    assert set(seen["headers"]) - TRANSPORT == {
        "authorization", "x-api-key", "anthropic-version", "anthropic-beta", "content-type",
    }  # fmt: skip
    assert seen["headers"]["authorization"] == "Bearer gateway-and-anthropic"
    assert seen["headers"]["x-api-key"] == "sk-ant-client"
    assert seen["headers"]["anthropic-version"] == "2023-06-01"
    assert seen["headers"]["anthropic-beta"] == "mcp-client-2025-11-20"
    assert seen["headers"]["content-type"] == "application/json"


def test_the_gateway_adds_no_key_or_version_of_its_own(api: httpx.Client, scripted: Scripted) -> None:
    assert api.post("/v1/messages", json=BODY).status_code == 200
    (seen,) = scripted.received()
    assert set(seen["headers"]) - TRANSPORT == {"content-type"}


def test_non_streaming_success_is_parsed_and_reserialized(
    api: httpx.Client, scripted: Scripted, anthropic_journal: Path
) -> None:
    upstream = answers.message(answers.text("hi there"), model=MODEL, usage=(7, 3))
    upstream["usage"].update(cache_creation_input_tokens=None, cache_read_input_tokens=0, service_tier="standard")
    upstream["content"][0].update(citations=None, vendor_block_extra=1)
    upstream["vendor_extra"] = {"dropped": True}
    scripted.script(answers.json_answer(upstream, headers={"x-upstream-only": "1", "anthropic-organization-id": "o"}))
    response = api.post("/v1/messages", json=BODY, headers=CLIENT_HEADERS)
    assert response.status_code == 200
    assert response.headers["content-type"] == "application/json"
    assert "x-upstream-only" not in response.headers  # upstream headers are not copied on this path
    assert response.content == orjson.dumps(
        {
            "id": upstream["id"],
            "type": "message",
            "role": "assistant",
            "content": [{"type": "text", "text": "hi there"}],
            "model": MODEL,
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 0, "service_tier": "standard"},
        }
    )
    events = wait_for_events(anthropic_journal, response.headers["x-request-id"])
    assert _kinds(events) == [
        "received", "validated", "routed", "upstream:head", "upstream:original", "upstream:body", "completed",
    ]  # fmt: skip
    routed = events[2]
    assert (routed.backend, routed.model) == ("anthropic", MODEL)
    # The journal keeps the upstream's own bytes and, apart, what the client got.
    assert orjson.loads(events[4].data) == upstream
    assert events[5].payload() == response.content


@pytest.mark.parametrize(
    "answer",
    [
        {"body": "{not json", "headers": {"content-type": "application/json"}},
        {"json": {"id": "msg_1", "type": "message", "role": "assistant", "content": [], "model": MODEL}},
        {"json": answers.message({"type": "hologram", "data": 1}, model=MODEL)},
        {"json": answers.message(answers.text("x"), model=MODEL, stop_reason="bored")},
    ],
    ids=["invalid-json", "missing-usage", "unknown-block", "unknown-stop-reason"],
)
def test_an_unparseable_body_is_502_parse_error(
    api: httpx.Client, scripted: Scripted, anthropic_journal: Path, answer: dict
) -> None:
    scripted.script(answer)
    response = api.post("/v1/messages", json=BODY)
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "parse_error"
    rid = response.headers["x-request-id"]
    assert response.json() == {
        "type": "error",
        "error": {"type": "api_error", "message": "Invalid response from backend"},
        "request_id": rid,
    }
    events = wait_for_events(anthropic_journal, rid)
    assert _kinds(events)[-3:] == ["upstream:original", "error", "completed"]
    assert events[-2].code == "parse_error"


def test_an_anthropic_error_keeps_its_status_and_error_and_gains_our_request_id(
    api: httpx.Client, scripted: Scripted
) -> None:
    scripted.script(answers.error_answer(429, "rate_limit_error", "slow down", headers={"retry-after": "7"}))
    response = api.post("/v1/messages", json=BODY)
    assert response.status_code == 429
    assert response.json() == {
        "type": "error",
        "error": {"type": "rate_limit_error", "message": "slow down"},
        "request_id": response.headers["x-request-id"],
    }
    assert response.headers["retry-after"] == "7"
    assert "x-smg-error-code" not in response.headers  # relayed, not minted


def test_a_non_anthropic_error_body_is_reshaped_into_the_envelope(api: httpx.Client, scripted: Scripted) -> None:
    scripted.script(
        {"status": 529, "body": "upstream overloaded", "headers": {"x-smg-error-code": "forged"}},
        {"status": 500, "json": {"type": "error", "error": {"type": "api_error", "message": "x"}}, "headers": {}},
    )
    response = api.post("/v1/messages", json={**BODY, "stream": True})
    assert response.status_code == 529
    assert response.json()["error"] == {"type": "overloaded_error", "message": "upstream overloaded"}
    assert "x-smg-error-code" not in response.headers  # an upstream's own header never leaks


def test_a_stream_is_relayed_unchanged_as_it_arrives(
    api: httpx.Client, scripted: Scripted, anthropic_journal: Path
) -> None:
    msg = answers.message(answers.text("streamed words here"), model=MODEL)
    answer = answers.sse_answer(msg, ping=True, chunk_delay_ms=150, headers={"anthropic-organization-id": "org"})
    scripted.script(answer)
    body = {**BODY, "stream": True}
    t0 = time.monotonic()
    firsts: list[float] = []
    with api.stream("POST", "/v1/messages", json=body, headers=CLIENT_HEADERS) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        assert response.headers["anthropic-organization-id"] == "org"
        chunks = []
        for chunk in response.iter_raw():
            firsts.append(time.monotonic() - t0)
            chunks.append(chunk)
        rid = response.headers["x-request-id"]
    relayed = b"".join(chunks)
    events = answers.stream_events(msg, ping=True)
    expected = b"".join(b"event: " + e["type"].encode() + b"\ndata: " + orjson.dumps(e) + b"\n\n" for e in events)
    assert relayed == expected
    assert [name for name, _ in answers.parse_sse(relayed)][:2] == ["message_start", "ping"]
    # 10 frames 150 ms apart: the first reached the client long before the last was written.
    assert firsts[0] < firsts[-1] - 0.5
    (seen,) = scripted.received()
    assert orjson.loads(seen["body"]) == body
    kinds = _kinds(wait_for_events(anthropic_journal, rid))
    assert kinds[:4] == ["received", "validated", "routed", "upstream:head"]
    assert set(kinds[4:-1]) == {"upstream:chunk"} and kinds[-1] == "completed"


def test_max_tokens_zero_is_forwarded_like_any_request(api: httpx.Client, scripted: Scripted) -> None:
    scripted.script(answers.json_answer(answers.message(model=MODEL, stop_reason="max_tokens", usage=(9, 0))))
    response = api.post("/v1/messages", json={**BODY, "max_tokens": 0})
    assert response.status_code == 200
    assert response.json()["stop_reason"] == "max_tokens"
    (seen,) = scripted.received()
    assert seen["json"]["max_tokens"] == 0


def test_count_tokens_is_501_in_the_envelope(api: httpx.Client, scripted: Scripted) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "count me"}]}
    response = api.post("/v1/messages/count_tokens", json=body, headers=CLIENT_HEADERS)
    assert response.status_code == 501
    assert response.headers["x-smg-error-code"] == "not_implemented"
    payload = response.json()
    assert payload["error"]["type"] == "api_error"
    assert payload["request_id"] == response.headers["x-request-id"]
    assert scripted.received() == []


def test_without_the_header_mcp_servers_and_toolsets_are_forwarded_unchanged(
    api: httpx.Client, scripted: Scripted
) -> None:
    body = {
        **BODY,
        "mcp_servers": [{"type": "url", "name": "s", "url": "https://mcp.example.com/mcp", "authorization_token": "t"}],
        "tools": [{"type": "mcp_toolset", "mcp_server_name": "s"}],
    }
    raw = orjson.dumps(body)
    for headers in ({}, {"X-SMG-MCP": "disabled"}):
        response = api.post("/v1/messages", content=raw, headers={"content-type": "application/json", **headers})
        assert response.status_code == 200
    first, second = scripted.received()
    assert first["body"].encode() == raw and second["body"].encode() == raw
    assert "x-smg-mcp" not in second["headers"]


def test_a_refused_connection_is_502_connection_failed(unreachable_gateway: Spawned) -> None:
    response = httpx.post(f"{unreachable_gateway.url}/v1/messages", json=BODY)
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "connection_failed"
    assert response.json()["error"]["message"].startswith("Connection failed: ")


def test_a_slow_upstream_is_504_timeout(impatient_gateway: Spawned, scripted: Scripted) -> None:
    scripted.script({"delay_ms": 2500, "json": answers.message(answers.text("late"))})
    response = httpx.post(f"{impatient_gateway.url}/v1/messages", json=BODY, timeout=10)
    assert response.status_code == 504
    assert response.headers["x-smg-error-code"] == "timeout"
    assert response.json()["error"] == {"type": "timeout_error", "message": response.json()["error"]["message"]}
    assert response.json()["error"]["message"].startswith("Request timeout: ")


def test_an_upstream_that_hangs_up_is_502_request_failed(impatient_gateway: Spawned, scripted: Scripted) -> None:
    scripted.script({"drop": True})
    response = httpx.post(f"{impatient_gateway.url}/v1/messages", json=BODY, timeout=10)
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "request_failed"
    assert response.json()["error"]["message"].startswith("Request failed: ")


def test_ready_once_started(api: httpx.Client) -> None:
    assert api.get("/readiness").json()["status"] == "ready"


def test_a_stream_ends_with_the_upstream_error_event(api: httpx.Client, scripted: Scripted) -> None:
    """The API sends no message_stop after an `error` event; a stream the upstream then keeps
    open must still end for the client (here the upstream holds the connection until released)."""
    start = answers.stream_events(answers.message(answers.text("cut"), model=MODEL))[0]
    error = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    scripted.script(
        {"sse": [{"event": "message_start", "data": start}, {"event": "error", "data": error}], "hold_after": 2}
    )
    try:
        with api.stream("POST", "/v1/messages", json={**BODY, "stream": True}, headers=CLIENT_HEADERS) as response:
            relayed = response.read()
    finally:
        scripted.release()
    assert [name for name, _ in answers.parse_sse(relayed)] == ["message_start", "error"]


def test_the_model_list_is_the_apis_own_answer_to_the_callers_key(api: httpx.Client, worker: Spawned) -> None:
    listed = api.get("/v1/models", headers={"x-api-key": "sk-ant-caller", "anthropic-version": "2023-06-01"})
    assert listed.status_code == 200
    upstream = httpx.get(worker.url + "/v1/models").json()
    assert [m["id"] for m in listed.json()["data"]] == [m["id"] for m in upstream["data"]]
    seen = httpx.get(worker.url + "/_models_received").json()["requests"]
    assert any(r["headers"].get("x-api-key") == "sk-ant-caller" for r in seen)
