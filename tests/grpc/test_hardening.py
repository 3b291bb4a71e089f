"""Hostile corners of the gRPC backend, over loopback: bodies the gateway renders itself must
be refused with a 400 envelope or served, and a prompt no context window can hold is refused
from its byte length, before it is rendered."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from journal.events import Error
from tests.conftest import wait_for_events
from tests.grpc.conftest import MODEL, QWEN3, WINDOW
from tools.engine_control import EngineControl

HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


def _schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


def _envelope(response: httpx.Response, status: int) -> dict[str, str]:
    assert response.status_code == status, response.text
    body = response.json()
    assert body["type"] == "error" and body["request_id"] == response.headers["x-request-id"]
    error: dict[str, str] = body["error"]
    return error


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_an_input_schema_nested_128_levels_is_served(http: httpx.Client, path: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "deep", "input_schema": _schema(128)}],
    }
    if path.endswith("count_tokens"):
        del body["max_tokens"]
    response = http.post(path, content=json.dumps(body).encode(), headers=HEADERS)  # deeper than orjson writes
    assert response.status_code == 200, response.text


def test_an_input_schema_beyond_the_templates_depth_is_a_400(http: httpx.Client) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 8,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "deep", "input_schema": _schema(120)}],
    }
    # Past what orjson writes (and the template renders), built by hand.
    deeper = b'{"type":"object","properties":{"a":' * 300 + b"{}" + b"}}" * 300
    raw = orjson.dumps(body).replace(b'{"type":"string"}', deeper)
    error = _envelope(http.post("/v1/messages", content=raw, headers=HEADERS), 400)
    assert error["type"] == "invalid_request_error"


def test_a_lone_surrogate_beside_a_big_integer_is_a_400(http: httpx.Client) -> None:
    raw = (
        f'{{"model": "{MODEL}", "max_tokens": 8, "messages": [{{"role": "user", "content": "\\ud800"}}],'
        ' "tools": [{"name": "t", "input_schema": {"type": "object", "x": 123456789012345678901234}}]}'
    ).encode()
    error = _envelope(http.post("/v1/messages", content=raw, headers=HEADERS), 400)
    assert error["type"] == "invalid_request_error"


def test_a_prompt_no_window_can_hold_is_refused_before_rendering(http: httpx.Client) -> None:
    text = "word " * (4 << 20)  # 20 MiB: hundreds of times the window, even at the bound's worst case
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    response = http.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS, timeout=120)
    error = _envelope(response, 400)
    assert f"maximum context length is {WINDOW} tokens" in error["message"]
    assert "at least" in error["message"]  # the bound, not a count: nothing was rendered


def test_a_prompt_just_over_the_window_is_counted_exactly(http: httpx.Client) -> None:
    text = "word " * (2 * WINDOW)
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": text}]}
    error = _envelope(http.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS), 400)
    assert "at least" not in error["message"] and "context length" in error["message"]


def test_a_tool_result_before_text_reaches_the_engine_in_that_order(http: httpx.Client, control: EngineControl) -> None:
    from smg.pipeline.tokenizers import Tokenizer

    control.script({"text": "Done."})
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "SUNNY-RESULT"},
                {"type": "text", "text": "AND-THEN-TEXT"},
            ],
        },
    ]
    tools = [{"name": "weather", "input_schema": {"type": "object"}}]
    body = {"model": MODEL, "max_tokens": 8, "messages": messages, "tools": tools}
    reply = http.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS)
    assert reply.status_code == 200, reply.text
    ids = [int(i) for i in control.received()[-1]["tokenized"]["input_ids"]]
    prompt = Tokenizer.load(QWEN3).decode(ids, skip_special_tokens=False)
    assert prompt.index("SUNNY-RESULT") < prompt.index("AND-THEN-TEXT")


_BIG = "word " * (400 << 10)  # 2 MiB: over twice the window at the bound's worst case (192 bytes a token)


def _use(tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": tool_input}]}


def _result(text: str) -> dict[str, Any]:
    block = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": text}]}
    return {"role": "user", "content": [block]}


_HI = {"role": "user", "content": "hi"}
_TOOL = {"name": "t", "input_schema": {"type": "object"}}
_BIG_PARTS: dict[str, dict[str, Any]] = {
    "system": {"system": _BIG},
    "system-blocks": {"system": [{"type": "text", "text": _BIG}]},
    "tool-description": {"tools": [{**_TOOL, "description": _BIG}]},
    "input-schema": {"tools": [{"name": "t", "input_schema": {"type": "object", "description": _BIG}}]},
    "assistant-turn": {"messages": [_HI, {"role": "assistant", "content": _BIG}, {"role": "user", "content": "more"}]},
    "tool-use-input": {"messages": [_HI, _use({"q": _BIG}), _result("ok")], "tools": [_TOOL]},
    "tool-result-blocks": {"messages": [_HI, _use({}), _result(_BIG)], "tools": [_TOOL]},
}


@pytest.mark.parametrize("part", list(_BIG_PARTS))
@pytest.mark.parametrize("max_tokens", [8, 0])
def test_a_part_outside_user_text_no_window_can_hold_is_refused_untokenized(
    http: httpx.Client, grpc_journal: Path, part: str, max_tokens: int
) -> None:
    body = {"model": MODEL, "max_tokens": max_tokens, "messages": [_HI], **_BIG_PARTS[part]}
    response = http.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS, timeout=120)
    error = _envelope(response, 400)
    assert error["type"] == "invalid_request_error"
    assert response.headers["x-smg-error-code"] == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens" in error["message"]
    assert "However, your request has at least " in error["message"]  # a bound: never tokenized
    events = wait_for_events(grpc_journal, response.headers["x-request-id"])
    assert [e.kind for e in events] == ["received", "validated", "error", "completed"]
    error_event = events[2]
    assert isinstance(error_event, Error) and error_event.code == "context_length_exceeded"


def _text(text: str) -> dict[str, str]:
    return {"type": "text", "text": text}


_DROPPED_PARTS: dict[str, dict[str, Any]] = {
    # `tool_choice: none` leaves the tools out of what the template sees.
    "tools-not-offered": {"tools": [{**_TOOL, "description": _BIG}], "tool_choice": {"type": "none"}},
    # This template keeps no reasoning of turns before the last user query.
    "earlier-thinking": {
        "messages": [
            _HI,
            {"role": "assistant", "content": [{"type": "thinking", "thinking": _BIG, "signature": "s"}, _text("ok")]},
            {"role": "user", "content": "more"},
        ]
    },
}


@pytest.mark.parametrize("part", list(_DROPPED_PARTS))
def test_a_big_part_the_template_leaves_out_is_served(http: httpx.Client, control: EngineControl, part: str) -> None:
    control.script({"text": "Done."})
    body = {"model": MODEL, "max_tokens": 8, "messages": [_HI], **_DROPPED_PARTS[part]}
    response = http.post("/v1/messages", content=orjson.dumps(body), headers=HEADERS, timeout=120)
    assert response.status_code == 200, response.text
    assert len(control.received()[-1]["tokenized"]["input_ids"]) < WINDOW
