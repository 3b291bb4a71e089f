"""The HTTP-worker relay, end to end: gateway and scripted worker as real processes."""

from __future__ import annotations

import base64
import gzip
from pathlib import Path

import httpx
import orjson
import pytest

from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned

BODY = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hello relay"}]}


def test_non_streaming_body_is_relayed_byte_for_byte(client: httpx.Client, scripted: Scripted, worker: Spawned) -> None:
    answer = {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "model": MODEL,
        "content": [{"type": "text", "text": "exact"}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 3, "output_tokens": 1},
        "vendor_extra": {"kept": 1.50},
    }
    scripted.script({"json": answer}, {"json": answer})
    direct = httpx.post(f"{worker.url}/v1/messages", json=BODY)
    relayed = client.post("/v1/messages", json=BODY)
    assert relayed.status_code == 200
    assert relayed.content == direct.content
    assert relayed.headers["x-smg-routed-worker-id"] == worker.url
    assert relayed.headers["x-request-id"].startswith("msg_")


def test_stream_is_relayed_unchanged_as_it_arrives(client: httpx.Client, scripted: Scripted, worker: Spawned) -> None:
    scripted.script({"stream_echo": True}, {"stream_echo": True})
    body = {**BODY, "stream": True}
    direct = httpx.post(f"{worker.url}/v1/messages", json=body).content
    with client.stream("POST", "/v1/messages", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        relayed = b"".join(response.iter_raw())
    # message ids are random per answer; everything else must be identical
    strip = lambda raw: [line for line in raw.split(b"\n") if b'"id":"msg_' not in line]  # noqa: E731
    assert strip(relayed) == strip(direct)
    assert relayed.rstrip().endswith(b'data: {"type":"message_stop"}')
    assert b"[DONE]" not in relayed


def test_a_gzip_encoded_stream_reaches_the_client_decoded(client: httpx.Client, scripted: Scripted) -> None:
    frame = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
    packed = gzip.compress(frame)
    halves = [{"raw_b64": base64.b64encode(part).decode()} for part in (packed[:10], packed[10:])]
    scripted.script({"sse": halves, "headers": {"content-encoding": "gzip"}, "chunk_delay_ms": 20})
    with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        assert "content-encoding" not in response.headers
        assert b"".join(response.iter_raw()) == frame


def test_multibyte_characters_split_across_network_reads_survive(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    text = "héllo → 😀 ✓"
    frame = (
        "event: content_block_delta\ndata: "
        + orjson.dumps(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        ).decode()
        + "\n\n"
    ).encode()
    cut = frame.index("😀".encode()) + 2  # inside the 4-byte character
    halves = [
        {
            "raw_b64": base64.b64encode(part).decode(),
        }
        for part in (frame[:cut], frame[cut:])
    ]
    scripted.script({"sse": halves, "chunk_delay_ms": 50})
    with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        data = b"".join(response.iter_raw())
        rid = response.headers["x-request-id"]
    assert data == frame
    chunks = [e for e in wait_for_events(journal_path, rid) if e.kind == "upstream" and e.part == "chunk"]
    assert all(c.encoding == "utf-8" for c in chunks)  # journaled as text, never split mid-character
    assert "".join(c.data for c in chunks) == frame.decode()


def test_only_allowlisted_headers_reach_the_worker(client: httpx.Client, scripted: Scripted) -> None:
    client.post(
        "/v1/messages",
        json=BODY,
        headers={
            "Authorization": "Bearer worker-key",
            "anthropic-version": "2023-06-01",
            "anthropic-beta": "tools-2024-05-16",
            "x-request-id": "client-rid-1",
            "x-correlation-id": "corr-1",
            "x-request-id-extra": "more",
            "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "tracestate": "k=v",
            "x-smg-routing-key": "user-7",
            "x-api-key": "sk-ant-secret",
            "cookie": "session=1",
            "x-custom": "nope",
            "X-SMG-MCP": "enabled",
        },
    )
    seen = scripted.received()[-1]["headers"]
    for name in (
        "authorization",
        "anthropic-version",
        "anthropic-beta",
        "x-request-id",
        "x-correlation-id",
        "x-request-id-extra",
        "traceparent",
        "tracestate",
        "x-smg-routing-key",
    ):
        assert name in seen, name
    for name in ("x-api-key", "cookie", "x-custom", "x-smg-mcp"):
        assert name not in seen, name
    assert seen["content-type"] == "application/json"
    assert seen["authorization"] == "Bearer worker-key"


def test_client_request_id_is_echoed(client: httpx.Client, scripted: Scripted) -> None:
    response = client.post("/v1/messages", json=BODY, headers={"x-request-id": "my-id-42"})
    assert response.headers["x-request-id"] == "my-id-42"


def test_body_is_re_serialized_with_unknown_fields_and_numbers_kept(client: httpx.Client, scripted: Scripted) -> None:
    raw = (
        b'{"model":"alias-model","max_tokens":64,"temperature":0.7,"top_p":1.0,"top_k":40,'
        b'"messages":[{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}],'
        b'"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]},"output_config":{"effort":"high"},'
        b'"metadata":{"user_id":"{\\"device\\":\\"abc\\"}"},"huge":123456789012345678901234567890,"stream":null}'
    )
    response = client.post("/v1/messages", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    sent = scripted.received()[-1]
    forwarded = orjson.loads(sent["body"]) if "huge" not in sent["body"] else None
    assert sent["body"].count("123456789012345678901234567890") == 1
    assert '"model":"scripted-model"' in sent["body"]  # alias replaced by the canonical id
    assert '"temperature":0.7' in sent["body"] and '"top_p":1.0' in sent["body"]
    assert '"context_management":{"edits":[{"type":"clear_tool_uses_20250919"}]}' in sent["body"]
    assert '"output_config":{"effort":"high"}' in sent["body"]
    assert '"cache_control":{"type":"ephemeral"}' in sent["body"]
    assert '"stream"' not in sent["body"]  # an explicit null optional is not forwarded
    assert forwarded is None


def test_body_without_alias_keeps_the_client_model(client: httpx.Client, scripted: Scripted) -> None:
    client.post("/v1/messages", json=BODY)
    assert orjson.loads(scripted.received()[-1]["body"]) == BODY


def test_query_string_beta_true_is_accepted(client: httpx.Client, scripted: Scripted) -> None:
    assert client.post("/v1/messages?beta=true", json=BODY).status_code == 200
    count = client.post("/v1/messages/count_tokens?beta=true", json={"model": MODEL, "messages": BODY["messages"]})
    assert count.status_code == 200


def test_max_tokens_zero_is_refused_before_any_worker(client: httpx.Client, scripted: Scripted) -> None:
    response = client.post("/v1/messages", json={**BODY, "max_tokens": 0})
    assert response.status_code == 400
    assert response.headers["x-smg-error-code"] == "max_tokens_zero_not_relayed"
    body = response.json()
    assert body["error"]["type"] == "invalid_request_error"
    assert body["request_id"] == response.headers["x-request-id"]
    assert scripted.received() == []


def test_count_tokens_goes_to_one_worker(client: httpx.Client, scripted: Scripted) -> None:
    scripted.script(
        {"json": {"input_tokens": 17, "context_management": {"original_input_tokens": 20}}},
        path="/v1/messages/count_tokens",
    )
    response = client.post(
        "/v1/messages/count_tokens",
        json={"model": "alias-model", "messages": BODY["messages"], "context_management": {"x": 1}},
    )
    assert response.status_code == 200
    assert response.json() == {"input_tokens": 17, "context_management": {"original_input_tokens": 20}}
    received = scripted.received()
    assert len(received) == 1 and received[0]["path"] == "/v1/messages/count_tokens"
    assert orjson.loads(received[0]["body"])["model"] == MODEL


def test_unknown_model_is_404_model_not_found(client: httpx.Client, scripted: Scripted) -> None:
    for path, body in (
        ("/v1/messages", {**BODY, "model": "nope"}),
        ("/v1/messages/count_tokens", {"model": "nope", "messages": BODY["messages"]}),
    ):
        response = client.post(path, json=body)
        assert response.status_code == 404
        assert response.headers["x-smg-error-code"] == "model_not_found"
        assert response.json()["error"] == {
            "type": "not_found_error",
            "message": "No worker available for model 'nope'",
        }
    assert scripted.received() == []


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_shaped_upstream_error_keeps_its_error_and_gains_request_id(
    client: httpx.Client, scripted: Scripted, stream: bool
) -> None:
    upstream = {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy, try later"},
        "request_id": "req_upstream",
    }
    scripted.script({"status": 529, "json": upstream, "headers": {"retry-after": "7", "x-smg-error-code": "fake"}})
    response = client.post("/v1/messages", json={**BODY, "stream": stream})
    assert response.status_code == 529
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert body == {
        "type": "error",
        "error": {"type": "overloaded_error", "message": "busy, try later"},
        "request_id": response.headers["x-request-id"],
    }
    assert response.headers["retry-after"] == "7"
    assert "x-smg-error-code" not in response.headers


@pytest.mark.parametrize(
    ("status", "answer", "error_type", "message"),
    [
        (500, {"body": "engine exploded\n"}, "api_error", "engine exploded"),
        (503, {"body": ""}, "overloaded_error", "Service Unavailable"),
        (422, {"json": {"error": {"message": "bad field", "code": 422}}}, "invalid_request_error", "bad field"),
        (400, {"json": {"message": "top-level message"}}, "invalid_request_error", "top-level message"),
        (404, {"json": {"error": "plain string"}}, "not_found_error", "plain string"),
        (504, {"json": {"detail": "x"}}, "timeout_error", "Gateway Timeout"),
        (402, {"body": "pay"}, "invalid_request_error", "pay"),
    ],
)
def test_other_upstream_errors_are_reshaped_into_the_envelope(
    client: httpx.Client, scripted: Scripted, status: int, answer: dict, error_type: str, message: str
) -> None:
    scripted.script({"status": status, **answer})
    response = client.post("/v1/messages", json=BODY)
    assert response.status_code == status
    assert response.json() == {
        "type": "error",
        "error": {"type": error_type, "message": message},
        "request_id": response.headers["x-request-id"],
    }
    assert "x-smg-error-code" not in response.headers


def test_upstream_error_events_inside_a_stream_are_relayed(client: httpx.Client, scripted: Scripted) -> None:
    frames = [
        {
            "event": "message_start",
            "data": {
                "type": "message_start",
                "message": {
                    "id": "m",
                    "type": "message",
                    "role": "assistant",
                    "content": [],
                    "model": MODEL,
                    "stop_reason": None,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 1, "output_tokens": 0},
                },
            },
        },
        {"event": "error", "data": {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}},
    ]
    scripted.script({"sse": frames})
    with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        data = b"".join(response.iter_raw())
    assert b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}' in data


def test_stream_cut_by_the_worker_ends_with_an_error_event(client: httpx.Client, scripted: Scripted) -> None:
    scripted.script({"stream_echo": True, "drop_after": 2})
    with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        assert response.status_code == 200
        data = b"".join(response.iter_raw())
    assert data.startswith(b"event: message_start")
    assert b"event: error\n" in data and b'"type":"api_error"' in data


def test_dropped_connection_before_answer_is_a_502_envelope(client: httpx.Client, scripted: Scripted) -> None:
    scripted.script({"drop": True})
    response = client.post("/v1/messages", json=BODY)
    assert response.status_code == 502
    assert response.headers["x-smg-error-code"] == "call_upstream_connection_failed"
    assert response.json()["error"]["type"] == "api_error"


def test_models_list_shapes(client: httpx.Client) -> None:
    openai = client.get("/v1/models").json()
    assert openai["object"] == "list"
    ids = [m["id"] for m in openai["data"]]
    assert MODEL in ids and "alias-model" in ids and "other-model" in ids
    anthropic = client.get("/v1/models", headers={"anthropic-version": "2023-06-01"}).json()
    assert anthropic["has_more"] is False
    assert {m["type"] for m in anthropic["data"]} == {"model"}
    assert anthropic["first_id"] == anthropic["data"][0]["id"]
    one = client.get(f"/v1/models/{MODEL}", headers={"anthropic-version": "2023-06-01"})
    assert one.json()["id"] == MODEL
    missing = client.get("/v1/models/nope", headers={"anthropic-version": "2023-06-01"})
    assert missing.status_code == 404 and missing.json()["type"] == "error"


def test_frames_reach_the_client_while_the_worker_is_still_streaming(client: httpx.Client, scripted: Scripted) -> None:
    """The worker holds the stream after its first frame until the test releases it: the
    client can only read that frame first if the gateway relays as frames arrive."""
    scripted.script({"stream_echo": True, "hold_after": 1})
    with client.stream("POST", "/v1/messages", json={**BODY, "stream": True}) as response:
        lines = response.iter_lines()
        assert next(lines) == "event: message_start"
        assert next(lines).startswith('data: {"type":"message_start"')
        scripted.release()
        rest = list(lines)
    assert "event: message_stop" in rest


def test_health_and_readiness(client: httpx.Client) -> None:
    assert client.get("/health").json() == {"status": "ok"}
    assert client.get("/liveness").status_code == 200
    assert client.get("/readiness").json()["status"] == "ready"


def test_readiness_is_503_while_no_worker_answers() -> None:
    from tools.spawn import free_port, spawn_gateway

    gw = spawn_gateway([f"http://127.0.0.1:{free_port()}"])
    try:
        response = httpx.get(gw.url + "/readiness")
    finally:
        gw.stop()
    assert response.status_code == 503 and response.json()["status"] == "not ready"
