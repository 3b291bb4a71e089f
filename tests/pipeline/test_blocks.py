"""The block builder: the exact event sequence of behaviors.md §D.2, one index counter, the
thinking → text → tool_use order, and the non-streaming whitespace rule."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smg.pipeline.blocks import BlockBuilder
from smg.protocol.fold import BlockFold
from smg.protocol.stream import sse_frame

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# behaviors.md §D.2 "Text example (S0 §Streaming, exact)".
SPEC_TEXT_STREAM = (
    "event: message_start\n"
    'data: {"type":"message_start","message":{"id":"msg_abc123","type":"message","role":"assistant",'
    '"content":[],"model":"meta-llama/Llama-3.1-8B-Instruct","stop_reason":null,"stop_sequence":null,'
    '"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,'
    '"cache_read_input_tokens":0}}}\n'
    "\n"
    "event: content_block_start\n"
    'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n'
    "\n"
    "event: content_block_delta\n"
    'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    '"text":"There is no single answer"}}\n'
    "\n"
    "event: content_block_stop\n"
    'data: {"type":"content_block_stop","index":0}\n'
    "\n"
    "event: message_delta\n"
    'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":112,'
    '"input_tokens":27,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}\n'
    "\n"
    "event: message_stop\n"
    'data: {"type":"message_stop"}\n'
    "\n"
)


def fold(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    folder = BlockFold()
    for event in events:
        folder.feed(event)
    return folder.content()


def test_the_documented_text_stream_byte_for_byte() -> None:
    b = BlockBuilder("msg_abc123", MODEL)
    events = b.start() + b.text("There is no single answer") + b.finish("end_turn", None, 112, 27)
    assert b"".join(sse_frame(e) for e in events).decode() == SPEC_TEXT_STREAM


def test_the_documented_multi_block_sequence() -> None:
    b = BlockBuilder("msg_1", MODEL)
    events = b.start()
    events += b.thinking("pl") + b.thinking("an")
    events += b.text("Checking.")
    events += b.tool_call("toolu_0b7e5f1c9a2d4e6f8a1b3c5d", "get_weather")
    events += b.tool_args('{"city": ') + b.tool_args('"Paris"}')
    events += b.finish("tool_use", None, 30, 12)
    shape = [(e["type"], e.get("index")) for e in events]
    assert shape == [
        ("message_start", None),
        ("content_block_start", 0),
        ("content_block_delta", 0),
        ("content_block_delta", 0),
        ("content_block_stop", 0),
        ("content_block_start", 1),
        ("content_block_delta", 1),
        ("content_block_stop", 1),
        ("content_block_start", 2),
        ("content_block_delta", 2),
        ("content_block_delta", 2),
        ("content_block_stop", 2),
        ("message_delta", None),
        ("message_stop", None),
    ]
    assert events[1]["content_block"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert events[2]["delta"] == {"type": "thinking_delta", "thinking": "pl"}
    assert events[5]["content_block"] == {"type": "text", "text": ""}
    assert events[8]["content_block"] == {
        "type": "tool_use",
        "id": "toolu_0b7e5f1c9a2d4e6f8a1b3c5d",
        "name": "get_weather",
        "input": {},
        "caller": {"type": "direct"},
    }
    assert list(events[8]["content_block"]) == ["type", "id", "name", "input", "caller"]
    assert events[9]["delta"] == {"type": "input_json_delta", "partial_json": '{"city": '}
    assert events[12] == {
        "type": "message_delta",
        "delta": {"stop_reason": "tool_use"},
        "usage": {
            "output_tokens": 30,
            "input_tokens": 12,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert fold(events) == [
        {"type": "thinking", "thinking": "plan", "signature": ""},
        {"type": "text", "text": "Checking."},
        {
            "type": "tool_use",
            "id": "toolu_0b7e5f1c9a2d4e6f8a1b3c5d",
            "name": "get_weather",
            "input": {"city": "Paris"},
            "caller": {"type": "direct"},
        },
    ]


def test_message_start_has_zero_usage_and_null_stop_fields() -> None:
    [start] = BlockBuilder("msg_x", "m").start()
    assert start["message"] == {
        "id": "msg_x",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": "m",
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {
            "input_tokens": 0,
            "output_tokens": 0,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }
    assert BlockBuilder("msg_x", "m").start(9)[0]["message"]["usage"]["input_tokens"] == 9


def test_finish_with_stop_sequence_and_unknown_input_tokens() -> None:
    b = BlockBuilder("msg_1", "m")
    b.start()
    events = b.text("a") + b.finish("stop_sequence", "END", 3, None)
    delta = events[-2]
    assert delta["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert list(delta["usage"].items()) == [
        ("output_tokens", 3),
        ("cache_creation_input_tokens", 0),
        ("cache_read_input_tokens", 0),
    ]
    assert events[-1] == {"type": "message_stop"}


def test_zero_output_is_three_events() -> None:
    b = BlockBuilder("msg_1", "m")
    events = b.start() + b.text("") + b.thinking("") + b.finish("end_turn", None, 0, 5)
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]


def test_empty_deltas_emit_nothing() -> None:
    b = BlockBuilder("msg_1", "m")
    b.start()
    assert b.text("") == [] and b.thinking("") == []
    b.tool_call("t", "f")
    assert b.tool_args("") == []


def test_streams_emit_whitespace_as_it_comes() -> None:
    b = BlockBuilder("msg_1", "m", stream=True)
    b.start()
    events = b.text("\n\n")
    assert [e["type"] for e in events] == ["content_block_start", "content_block_delta"]
    assert events[1]["delta"]["text"] == "\n\n"


def test_non_streaming_holds_leading_whitespace_and_drops_a_whitespace_residual() -> None:
    b = BlockBuilder("msg_1", "m", stream=False)
    events = b.start() + b.thinking("hmm") + b.text("\n\n")
    assert [e["type"] for e in events] == ["message_start", "content_block_start", "content_block_delta"]
    events += b.finish("end_turn", None, 4, 2)
    assert fold(events) == [{"type": "thinking", "thinking": "hmm", "signature": ""}]

    b = BlockBuilder("msg_2", "m", stream=False)
    events = b.start() + b.text("\n") + b.text(" ") + b.text("Hi") + b.text(" \n") + b.finish("end_turn", None, 4, 2)
    assert fold(events) == [{"type": "text", "text": "\n Hi \n"}]


def test_whitespace_after_a_tool_call_never_opens_a_block() -> None:
    for stream in (True, False):
        b = BlockBuilder("msg_1", "m", stream=stream)
        events = (
            b.start() + b.tool_call("t1", "f") + b.tool_args("{}") + b.text("\n") + b.finish("tool_use", None, 1, 1)
        )
        assert [blk["type"] for blk in fold(events)] == ["tool_use"]


def test_consecutive_tool_calls_each_get_a_block() -> None:
    b = BlockBuilder("msg_1", "m")
    events = b.start() + b.tool_call("a", "f") + b.tool_args('{"x":1}') + b.tool_call("b", "g") + b.tool_args("{}")
    events += b.finish("tool_use", None, 1, 1)
    assert [(blk["id"], blk["input"]) for blk in fold(events)] == [("a", {"x": 1}), ("b", {})]
    assert b.tool_calls == 2 and b.has_tool_calls


def test_tool_args_without_a_tool_call_is_a_bug() -> None:
    b = BlockBuilder("msg_1", "m")
    b.start()
    b.text("x")
    with pytest.raises(RuntimeError):
        b.tool_args("{}")


ops = st.lists(
    st.one_of(
        st.tuples(st.just("thinking"), st.text(alphabet="ab \n", max_size=3)),
        st.tuples(st.just("text"), st.text(alphabet="ab \n", max_size=3)),
        st.tuples(st.just("tool_call"), st.text(alphabet="xyz", min_size=1, max_size=2)),
        st.tuples(st.just("tool_args"), st.sampled_from(["", "{", '"k": 1', "}"])),
    ),
    max_size=25,
)


@settings(max_examples=400, deadline=None)
@given(ops=ops, stream=st.booleans())
def test_indices_are_contiguous_and_blocks_balanced(ops: list[tuple[str, str]], stream: bool) -> None:
    b = BlockBuilder("msg_1", "m", stream=stream)
    events = b.start()
    for kind, arg in ops:
        if kind == "tool_args" and b.open != "tool_use":
            continue
        events += b.tool_call(arg, arg) if kind == "tool_call" else getattr(b, kind)(arg)
    events += b.finish("end_turn", None, 1, None)
    assert events[0]["type"] == "message_start"
    assert [e["type"] for e in events[-2:]] == ["message_delta", "message_stop"]
    open_index: int | None = None
    next_index = 0
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_index is None and event["index"] == next_index
            open_index = event["index"]
        elif event["type"] == "content_block_stop":
            assert event["index"] == open_index
            open_index, next_index = None, next_index + 1
        else:
            assert event["type"] == "content_block_delta" and event["index"] == open_index
            assert next(iter(v for k, v in event["delta"].items() if k != "type")) != ""
    assert open_index is None
    for block in fold(events):
        if block["type"] == "text" and not stream:
            assert block["text"].strip()
    orjson.dumps(events)


@pytest.mark.parametrize("stream", [True, False])
def test_a_blank_line_before_a_tool_call_is_no_text_block_streaming_or_not(stream: bool) -> None:
    b = BlockBuilder("msg_1", "m", stream=stream, tool_parsing=True)
    events = b.start() + b.text("\n\n") + b.tool_call("toolu_1", "get_weather") + b.tool_args("{}")
    events += b.finish("tool_use", None, 4, 2)
    assert [block["type"] for block in fold(events)] == ["tool_use"]


def test_with_tool_parsing_whitespace_before_text_still_reaches_the_text() -> None:
    b = BlockBuilder("msg_1", "m", stream=True, tool_parsing=True)
    events = b.start() + b.text("\n\n") + b.text("Hi")
    events += b.finish("end_turn", None, 4, 2)
    assert fold(events) == [{"type": "text", "text": "\n\nHi"}]
