"""The validation rules as a client meets them: 400 envelope, the field path and rule in the
message, no `X-SMG-Error-Code`, and nothing reaches the worker."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.conftest import MODEL, Scripted

USER = {"role": "user", "content": "hi"}
TOOL = {"name": "get_weather", "input_schema": {"type": "object"}}
CALL = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}]}
RESULT = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}


def body(**fields: Any) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 16, "messages": [USER], **fields}


CASES = [
    ({"max_tokens": 16, "messages": [USER]}, "model"),
    (body(model=""), "model"),
    ({"model": MODEL, "messages": [USER]}, "max_tokens"),
    (body(max_tokens=-1), "max_tokens"),
    (body(max_tokens=1.5), "max_tokens"),
    (body(messages=[]), "messages"),
    (body(messages=[{"role": "tool", "content": "x"}]), "messages.0"),
    (body(messages=[{"role": "user", "content": "x", "name": "bob"}]), "messages.0"),
    (body(messages=[{"role": "user", "content": "   "}]), "messages.0: user messages must have non-empty content"),
    (
        body(messages=[{"role": "user", "content": [{"type": "text", "text": ""}]}]),
        "text content blocks must be non-empty",
    ),
    (
        body(messages=[USER, {"role": "assistant", "content": "prefill "}]),
        "final assistant content cannot end with trailing whitespace",
    ),
    (body(messages=[{"role": "user", "content": [{"type": "video", "url": "x"}]}]), "messages.0.content.0"),
    (body(messages=[USER, CALL]), "`tool_use` ids were found without `tool_result` blocks immediately after"),
    (body(messages=[RESULT]), "unexpected `tool_use_id` found in `tool_result` blocks: toolu_1"),
    (body(messages=[USER, CALL, {"role": "user", "content": RESULT["content"] * 2}]), "is answered twice"),
    (body(tools=[TOOL, TOOL]), "tools: Tool names must be unique."),
    (body(tools=[{**TOOL, "name": "bad name"}]), "tools.0.custom.name: String should match pattern"),
    (body(tools=[{**TOOL, "name": "x" * 129}]), "tools.0.custom.name: String should have at most 128 characters"),
    (
        body(tools=[{**TOOL, "input_schema": {"type": "string"}}]),
        "tools.0.custom.input_schema.type: Input should be 'object'",
    ),
    (body(tools=[{**TOOL, "colour": "red"}]), "tools.0.custom.colour: Extra inputs are not permitted"),
    (body(tool_choice={"type": "any"}), "'tool_choice' is only allowed when 'tools' are specified"),
    (body(tools=[TOOL], tool_choice={"type": "tool", "name": "other"}), "tool 'other' not found in 'tools'"),
    (
        body(tools=[{"type": "mcp_toolset", "mcp_server_name": "s"}]),
        "mcp_servers is required when mcp_toolset tools are present",
    ),
    (body(temperature=1.5), "temperature"),
    (body(top_p=-0.1), "top_p"),
    (body(stop_sequences=["  "]), "stop_sequences"),
    (body(service_tier="priority"), "service_tier"),
    (body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 512}), "thinking"),
    (body(max_tokens=2048, thinking={"type": "enabled", "budget_tokens": 4096}), "budget_tokens"),
    (body(system=[{"type": "image", "source": {"type": "url", "url": "x"}}]), "system"),
]


@pytest.mark.parametrize(("payload", "needle"), CASES)
def test_messages_refusal(client: httpx.Client, scripted: Scripted, payload: dict[str, Any], needle: str) -> None:
    response = client.post("/v1/messages", json=payload)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert needle in error["message"], error["message"]
    assert "x-smg-error-code" not in response.headers
    assert scripted.received() == []


@pytest.mark.parametrize(
    ("payload", "needle"),
    [
        ({"messages": [USER]}, "model"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [USER, CALL]}, "`tool_use` ids were found without"),
        ({"model": MODEL, "messages": [USER], "tools": [TOOL, TOOL]}, "Tool names must be unique"),
        ({"model": MODEL, "messages": [USER], "tool_choice": {"type": "any"}}, "only allowed when 'tools'"),
    ],
)
def test_count_tokens_refusal(client: httpx.Client, scripted: Scripted, payload: dict[str, Any], needle: str) -> None:
    response = client.post("/v1/messages/count_tokens", json=payload)
    assert response.status_code == 400
    assert needle in response.json()["error"]["message"]
    assert scripted.received() == []


@pytest.mark.parametrize(
    "payload",
    [
        body(max_tokens=0, stream=True),  # refused by the relay, but valid: see test_relay
        body(messages=[USER, {"role": "assistant", "content": ""}]),
        body(messages=[{"role": "system", "content": ""}, USER]),
        body(messages=[USER, CALL, {"role": "system", "content": "note"}, RESULT]),
        body(
            tools=[
                {
                    **TOOL,
                    "defer_loading": True,
                    "strict": True,
                    "eager_input_streaming": True,
                    "cache_control": {"type": "ephemeral", "ttl": "1h"},
                    "input_schema": {
                        "type": "object",
                        "$schema": "https://json-schema.org/draft/2020-12/schema",
                        "additionalProperties": False,
                    },
                }
            ],
            thinking={"type": "adaptive", "display": "updates"},
            output_config={"effort": "high"},
            context_management={"edits": []},
            metadata={"user_id": '{"device_id":"abc","session_id":"s"}'},
        ),
    ],
)
def test_shapes_real_clients_send_are_accepted(
    client: httpx.Client, scripted: Scripted, payload: dict[str, Any]
) -> None:
    response = client.post("/v1/messages", json=payload)
    if payload["max_tokens"] == 0:
        assert response.headers["x-smg-error-code"] == "max_tokens_zero_not_relayed"  # passed validation
    else:
        assert response.status_code == 200, response.text
