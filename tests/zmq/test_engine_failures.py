"""What EngineCore is sent for a constrained request, and a request the engine fails: over ZMQ,
vLLM's EngineCore ends a request it cannot run with finish reason ERROR (it stays up), and the
gateway answers that as an error, journaled, never as an empty success.

The scripted engine fails a request as EngineCore does: one whose `structured_outputs` names
no `_backend` (EngineCore raises "Unsupported structured output backend: None"), or one whose
script says `finish_reason: error`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import journaled_failure
from tests.zmq.conftest import MODEL
from tests.zmq.test_messages import sse_events, stream_text
from tools.engine_control import EngineControl

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
# What the engine writes under each constraint: `tool` the input object, `any` a list of calls.
ANSWERS = {
    "tool": ({"type": "tool", "name": "get_weather"}, '{"city": "Paris"}'),
    "any": ({"type": "any"}, '[{"name": "get_weather", "parameters": {"city": "Paris"}}]'),
}


def _post(http: httpx.Client, body: dict[str, Any]) -> tuple[httpx.Response, list[tuple[str, dict[str, Any]]]]:
    reply = http.post("/v1/messages", json=body)
    events = sse_events(reply.text) if body.get("stream") and reply.status_code == 200 else []
    return reply, events


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("choice", ["tool", "any"])
def test_forced_tool_use_names_the_structured_output_backend(
    http: httpx.Client, control: EngineControl, choice: str, stream: bool
) -> None:
    tool_choice, written = ANSWERS[choice]
    control.script({"text": written})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "tools": [WEATHER], "tool_choice": tool_choice,
            "stream": stream, "thinking": {"type": "disabled"}}
    reply, events = _post(http, body)
    assert reply.status_code == 200, reply.text
    if stream:
        assert events[-2][1]["delta"]["stop_reason"] == "tool_use", events
        starts = [d["content_block"] for k, d in events if k == "content_block_start"]
        assert [s["type"] for s in starts] == ["tool_use"] and starts[0]["name"] == "get_weather"
        arguments = "".join(d["delta"]["partial_json"] for k, d in events if k == "content_block_delta")
        assert json.loads(arguments) == {"city": "Paris"}
    else:
        message = reply.json()
        assert message["stop_reason"] == "tool_use", message
        [call] = message["content"]
        assert (call["type"], call["name"], call["input"]) == ("tool_use", "get_weather", {"city": "Paris"})
    [sent] = control.received()
    structured = sent["sampling_params"]["structured_outputs"]
    # As vLLM's own frontend resolves `auto` before EngineCore sees the request.
    assert structured["_backend"] == "xgrammar" and structured["_backend_was_auto"] is True
    schema = structured["json"]
    assert isinstance(schema, dict)
    assert schema == WEATHER["input_schema"] if choice == "tool" else schema["type"] == "array"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_request_the_engine_fails_before_any_token_is_an_error_response(
    http: httpx.Client, control: EngineControl, zmq_journal: Path, stream: bool
) -> None:
    control.script({"token_ids": [], "eos": False, "finish_reason": "error"})
    reply, _ = _post(http, {"model": MODEL, "max_tokens": 16, "messages": USER, "stream": stream})
    # Nothing was streamed yet: an ordinary error response, even for a stream.
    assert reply.status_code == 500, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.headers["x-smg-error-code"] == "engine_error"
    error = reply.json()["error"]
    assert error["type"] == "api_error" and "finish reason: error" in error["message"], error
    journaled_failure(zmq_journal, reply.headers["x-request-id"], 500, "engine_error")
    # The engine is still up: the next request is answered.
    control.script({"text": "Still here."})
    again = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": USER})
    assert again.status_code == 200 and again.json()["content"][0]["text"] == "Still here."


def test_a_stream_the_engine_fails_midway_ends_with_an_error_event(
    http: httpx.Client, control: EngineControl, zmq_journal: Path
) -> None:
    control.script({"text": "one two three", "eos": False, "finish_reason": "error"})
    reply, events = _post(http, {"model": MODEL, "max_tokens": 16, "messages": USER, "stream": True})
    assert reply.status_code == 200
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-1] == "error", kinds
    assert "message_stop" not in kinds and "message_delta" not in kinds
    assert stream_text(events) == "one two three"
    assert events[-1][1]["error"]["type"] == "api_error"
    journaled_failure(zmq_journal, reply.headers["x-request-id"], 500, "engine_stream_error", answered=200)


def test_a_json_answer_the_engine_fails_midway_is_an_error_response(
    http: httpx.Client, control: EngineControl, zmq_journal: Path
) -> None:
    control.script({"text": "one two three", "eos": False, "finish_reason": "error"})
    reply, _ = _post(http, {"model": MODEL, "max_tokens": 16, "messages": USER})
    assert reply.status_code == 500, reply.text
    assert reply.json()["type"] == "error" and reply.headers["x-smg-error-code"].startswith("engine_")
    journaled_failure(zmq_journal, reply.headers["x-request-id"], 500, reply.headers["x-smg-error-code"])
