"""The structural diff: the same answer as JSON or as SSE compares equal; what differs is named."""

from __future__ import annotations

from typing import Any

import orjson

from replay.diff import Difference, deterministic, diff, diff_blocks, from_events, from_http, parse_sse
from smg.protocol import stream as ev
from smg.protocol.stream import sse_frame

USAGE = {"input_tokens": 7}


def answer(text: str = "Hi.", tool_id: str = "toolu_1", message_id: str = "msg_1") -> list[dict[str, Any]]:
    return [
        ev.message_start(message_id, "m", USAGE),
        ev.content_block_start(0, ev.text_block()),
        ev.text_delta(0, text),
        ev.content_block_stop(0),
        ev.content_block_start(1, ev.tool_use_block(tool_id, "get_weather")),
        ev.input_json_delta(1, '{"city": "Paris"}'),
        ev.content_block_stop(1),
        ev.message_delta("tool_use", None, {"output_tokens": 9, "input_tokens": 7}),
        ev.message_stop(),
    ]


def as_json(events: list[dict[str, Any]]) -> bytes:
    message = from_events(events).message
    return orjson.dumps(message)


def test_the_same_answer_streamed_and_not_has_no_difference() -> None:
    events = answer()
    sse = b"".join(sse_frame(e) for e in events)
    streamed = from_http(200, {"content-type": "text/event-stream; charset=utf-8"}, sse)
    plain = from_http(200, {"content-type": "application/json"}, as_json(events))
    assert parse_sse(sse) == events
    assert diff(streamed, plain, exact=True) == []
    assert diff(events, plain) == []


def test_text_and_ids_are_compared_only_when_asked() -> None:
    left, right = answer(), answer(text="Hello.", tool_id="toolu_2", message_id="msg_2")
    assert diff(left, right, text=False) == []
    assert diff(left, right) == [Difference("content[0].text", "Hi.", "Hello.")]
    assert diff(left, right, exact=True) == [
        Difference("id", "msg_1", "msg_2"),
        Difference("content[0].text", "Hi.", "Hello."),
        Difference("content[1].id", "toolu_1", "toolu_2"),
    ]


def test_structure_status_and_error_codes() -> None:
    no_tool = [e for e in answer() if e.get("index") != 1]
    found = diff(answer(), no_tool, text=False)
    assert Difference("content.kinds", ["text", "tool_use"], ["text"]) in found
    error = orjson.dumps({"type": "error", "error": {"type": "invalid_request_error", "message": "x"}})
    a = from_http(400, {"content-type": "application/json", "x-smg-error-code": "one"}, error)
    b = from_http(400, {"content-type": "application/json", "x-smg-error-code": "two"}, error)
    assert diff(a, b) == [Difference("error.code", "one", "two")]
    assert [d.path for d in diff(answer(), a)] == ["status", "error.type", "error.code", "message"]
    counted = [from_http(200, {}, orjson.dumps({"input_tokens": n})) for n in (5, 6)]
    assert diff(*counted) == [Difference("input_tokens", 5, 6)]


def test_diff_blocks_pins_a_delta_cut_elsewhere() -> None:
    left = answer()
    right = [*left[:2], ev.text_delta(0, "H"), ev.text_delta(0, "i."), *left[3:]]
    found = diff_blocks(left, right)
    assert found[0] == Difference("events[2]", left[2], right[2])
    assert found[1] == Difference("events.length", len(left), len(right))


def test_deterministic_requests() -> None:
    assert deterministic({"temperature": 0}) and deterministic({"top_k": 1, "temperature": 1})
    assert not deterministic({"temperature": 0.7}) and not deterministic({}) and not deterministic(None)
