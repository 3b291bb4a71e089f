"""Stream event builders and SSE framing (behaviors.md D.1, D.2, D.5)."""

from __future__ import annotations

import orjson

from smg.protocol import stream as s

DOC_STREAM = (
    b"event: message_start\n"
    b'data: {"type":"message_start","message":{"id":"msg_abc123","type":"message","role":"assistant",'
    b'"content":[],"model":"meta-llama/Llama-3.1-8B-Instruct","stop_reason":null,"stop_sequence":null,'
    b'"usage":{"input_tokens":0,"output_tokens":0,"cache_creation_input_tokens":0,'
    b'"cache_read_input_tokens":0}}}\n\n'
    b"event: content_block_start\n"
    b'data: {"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}\n\n'
    b"event: content_block_delta\n"
    b'data: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    b'"text":"There is no single answer"}}\n\n'
    b"event: content_block_stop\n"
    b'data: {"type":"content_block_stop","index":0}\n\n'
    b"event: message_delta\n"
    b'data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":112,'
    b'"input_tokens":27,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}\n\n'
    b"event: message_stop\n"
    b'data: {"type":"message_stop"}\n\n'
)


def test_documented_text_stream_is_reproduced_byte_for_byte() -> None:
    events = [
        s.message_start("msg_abc123", "meta-llama/Llama-3.1-8B-Instruct"),
        s.content_block_start(0, s.text_block()),
        s.text_delta(0, "There is no single answer"),
        s.content_block_stop(0),
        s.message_delta("end_turn", None, {"output_tokens": 112, "input_tokens": 27}),
        s.message_stop(),
    ]
    assert b"".join(s.sse_frame(e) for e in events) == DOC_STREAM


def test_message_delta_omits_unknown_input_tokens_and_null_stop_sequence() -> None:
    event = s.message_delta("max_tokens", None, {"output_tokens": 5})
    assert orjson.dumps(event) == (
        b'{"type":"message_delta","delta":{"stop_reason":"max_tokens"},'
        b'"usage":{"output_tokens":5,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}'
    )
    event = s.message_delta("max_tokens", None, {"input_tokens": None, "output_tokens": 5})
    assert "input_tokens" not in event["usage"]


def test_message_delta_carries_the_matched_stop_sequence() -> None:
    event = s.message_delta("stop_sequence", "END", {"input_tokens": 3, "output_tokens": 5})
    assert event["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert list(event["usage"]) == [
        "output_tokens",
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
    ]


def test_max_tokens_zero_message_start_carries_the_prompt_count() -> None:
    event = s.message_start("msg_1", "m", {"input_tokens": 27})
    assert event["message"]["usage"] == {
        "input_tokens": 27,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }


def test_thinking_and_tool_use_events() -> None:
    assert orjson.dumps(s.content_block_start(0, s.thinking_block())) == (
        b'{"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":"","signature":""}}'
    )
    assert s.thinking_delta(0, "plan")["delta"] == {"type": "thinking_delta", "thinking": "plan"}
    start = s.content_block_start(2, s.tool_use_block("toolu_1", "get_weather"))
    assert orjson.dumps(start) == (
        b'{"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1",'
        b'"name":"get_weather","input":{},"caller":{"type":"direct"}}}'
    )
    assert "caller" not in s.tool_use_block("toolu_1", "f", caller=None)
    assert orjson.dumps(s.input_json_delta(2, '{"city": ')) == (
        b'{"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\\"city\\": "}}'
    )
    assert s.signature_delta(0, "sig")["delta"] == {"type": "signature_delta", "signature": "sig"}


def test_message_stop_is_minimal_and_ping() -> None:
    assert s.message_stop() == {"type": "message_stop"}
    assert s.sse_frame(s.ping()) == b'event: ping\ndata: {"type":"ping"}\n\n'


def test_error_event() -> None:
    assert s.sse_frame(s.error_event("api_error", "Stream error: boom")) == (
        b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"Stream error: boom"}}\n\n'
    )


def test_frames_keep_non_ascii_text_as_utf8() -> None:
    frame = s.sse_frame(s.text_delta(0, "héllo 🌍\n"))
    assert frame.startswith(b"event: content_block_delta\ndata: ")
    assert frame.endswith(b"\n\n") and frame.count(b"\n") == 3
    assert orjson.loads(frame.split(b"data: ", 1)[1])["delta"]["text"] == "héllo 🌍\n"
