"""Response parsing and re-serialization (behaviors.md C.1, C.4)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from smg.protocol.response import (
    CountTokensResponse,
    Message,
    TextContent,
    ToolUseContent,
    Usage,
    message_to_dict,
    parse_message_response,
)

BODY: dict[str, Any] = {
    "id": "msg_abc123",
    "type": "message",
    "role": "assistant",
    "content": [{"type": "text", "text": "There is no single answer..."}],
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "stop_reason": "end_turn",
    "stop_sequence": None,
    "usage": {
        "input_tokens": 27,
        "output_tokens": 112,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    },
}


def with_(**fields: Any) -> dict[str, Any]:
    out = copy.deepcopy(BODY)
    out.update(fields)
    return out


def test_documented_response_round_trips_exactly() -> None:
    assert message_to_dict(parse_message_response(BODY)) == BODY
    assert list(message_to_dict(parse_message_response(BODY))) == list(BODY)


EVERY_OUTPUT_BLOCK: list[dict[str, Any]] = [
    {"type": "text", "text": "t", "citations": [{"type": "char_location", "cited_text": "c"}]},
    {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {"a": [1, None]}, "caller": {"type": "direct"}},
    {"type": "thinking", "thinking": "plan", "signature": ""},
    {"type": "redacted_thinking", "data": "xyz"},
    {"type": "server_tool_use", "id": "srvtoolu_1", "name": "tool_search_tool_regex", "input": {"pattern": "w"}},
    {
        "type": "web_search_tool_result",
        "tool_use_id": "srvtoolu_2",
        "content": [
            {"type": "web_search_result", "title": "t", "url": "u", "encrypted_content": "e", "page_age": None}
        ],
    },
    {
        "type": "tool_search_tool_result",
        "tool_use_id": "srvtoolu_1",
        "content": {
            "type": "tool_search_tool_search_result",
            "tool_references": [{"type": "tool_reference", "tool_name": "get_weather"}],
        },
    },
    {"type": "tool_reference", "tool_name": "get_weather", "description": "d"},
    {"type": "mcp_tool_use", "id": "mcptoolu_1", "name": "web_search", "server_name": "search", "input": {}},
    {
        "type": "mcp_tool_result",
        "tool_use_id": "mcptoolu_1",
        "content": [{"type": "text", "text": "..."}],
        "is_error": None,
    },
]


@pytest.mark.parametrize("block", EVERY_OUTPUT_BLOCK, ids=[b["type"] for b in EVERY_OUTPUT_BLOCK])
def test_output_blocks_round_trip(block: dict[str, Any]) -> None:
    data = with_(content=[block], stop_reason="tool_use")
    assert message_to_dict(parse_message_response(data)) == data


def test_unmodeled_fields_dropped_and_null_optionals_omitted() -> None:
    data = with_(
        content=[{"type": "text", "text": "t", "citations": None, "extra": 1}],
        usage={
            "input_tokens": 1,
            "output_tokens": 2,
            "cache_creation_input_tokens": None,
            "cache_read_input_tokens": 5,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "server_tool_use": {"web_search_requests": 1},
            "service_tier": "standard",
            "inference_geo": "us",
        },
        container=None,
        context_management={"applied_edits": []},
    )
    out = message_to_dict(parse_message_response(data))
    assert "container" not in out and "context_management" not in out
    assert out["content"] == [{"type": "text", "text": "t"}]
    assert out["usage"] == {
        "input_tokens": 1,
        "output_tokens": 2,
        "cache_read_input_tokens": 5,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "server_tool_use": {"web_search_requests": 1},
        "service_tier": "standard",
    }


def test_stop_fields_always_present() -> None:
    data = with_()
    del data["stop_reason"], data["stop_sequence"]
    out = message_to_dict(parse_message_response(data))
    assert out["stop_reason"] is None and out["stop_sequence"] is None


def test_mcp_tool_result_keeps_null_is_error() -> None:
    block = {"type": "mcp_tool_result", "tool_use_id": "m"}
    out = message_to_dict(parse_message_response(with_(content=[block])))
    assert out["content"] == [{"type": "mcp_tool_result", "tool_use_id": "m", "content": None, "is_error": None}]


@pytest.mark.parametrize(
    "stop_reason",
    ["end_turn", "max_tokens", "stop_sequence", "tool_use", "pause_turn", "refusal", "model_context_window_exceeded"],
)
def test_known_stop_reasons(stop_reason: str) -> None:
    assert parse_message_response(with_(stop_reason=stop_reason)).stop_reason == stop_reason


@pytest.mark.parametrize(
    "data",
    [
        with_(stop_reason="finished"),
        with_(content=[{"type": "container_upload", "file_id": "f"}]),
        with_(content=[{"type": "text"}]),
        with_(usage={"input_tokens": 1}),
        with_(usage={"input_tokens": -1, "output_tokens": 0}),
        with_(usage={"input_tokens": 1.5, "output_tokens": 0}),
        with_(role="user"),
        {k: v for k, v in BODY.items() if k != "id"},
        {k: v for k, v in BODY.items() if k != "type"},
        {k: v for k, v in BODY.items() if k != "role"},
        {k: v for k, v in BODY.items() if k != "model"},
        {k: v for k, v in BODY.items() if k != "usage"},
        {k: v for k, v in BODY.items() if k != "content"},
        [],
        "text",
        None,
    ],
)
def test_unparseable_bodies_raise_value_error(data: object) -> None:
    with pytest.raises(ValueError):
        parse_message_response(data)


def test_message_built_in_code() -> None:
    message = Message(
        id="msg_1",
        content=[TextContent(text="hi"), ToolUseContent(id="toolu_1", name="f", input={}, caller={"type": "direct"})],
        model="m",
        stop_reason="tool_use",
        usage=Usage(input_tokens=3, output_tokens=4, cache_creation_input_tokens=0, cache_read_input_tokens=0),
    )
    assert message_to_dict(message) == {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "text", "text": "hi"},
            {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}, "caller": {"type": "direct"}},
        ],
        "model": "m",
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {
            "input_tokens": 3,
            "output_tokens": 4,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def test_count_tokens_response() -> None:
    assert CountTokensResponse(input_tokens=27).model_dump() == {"input_tokens": 27}
