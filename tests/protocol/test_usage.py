"""UsageReader: stop_reason and usage read from bodies and from SSE text cut anywhere."""

from __future__ import annotations

import orjson

from smg.protocol.usage import UsageReader

START = {"type": "message_start", "message": {"id": "m", "usage": {"input_tokens": 12, "output_tokens": 1}}}
DELTA = {"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 40}}


def _sse(*events: dict) -> str:
    return "".join(f"event: {e['type']}\ndata: {orjson.dumps(e).decode()}\n\n" for e in events)


def test_body() -> None:
    reader = UsageReader()
    reader.body('{"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":5,"service_tier":"standard"}}')
    assert reader.stop_reason == "end_turn"
    assert reader.usage == {"input_tokens": 3, "output_tokens": 5}


def test_stream_cut_at_every_position() -> None:
    text = _sse(START, {"type": "ping"}, DELTA, {"type": "message_stop"})
    for cut in range(len(text) + 1):
        reader = UsageReader()
        reader.chunk(text[:cut])
        reader.chunk(text[cut:])
        assert reader.stop_reason == "tool_use", cut
        assert reader.usage == {"input_tokens": 12, "output_tokens": 40}


def test_garbage_is_ignored() -> None:
    reader = UsageReader()
    reader.chunk("data: {not json message_delta}\n\n")
    reader.body("<html>")
    assert reader.stop_reason is None and reader.usage == {}
