"""Hostile corners of the gRPC backend, over loopback: bodies the gateway renders itself must
be refused with a 400 envelope or served, and a prompt no context window can hold is refused
from its byte length, before it is rendered."""

from __future__ import annotations

import json
from typing import Any

import httpx
import orjson
import pytest

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
