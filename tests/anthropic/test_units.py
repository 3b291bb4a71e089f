"""Sans-IO parts of the Anthropic backend: the forwarded headers, the SSE decoder, the
re-serialization, and the projection of `original` parts and `stream_opened`."""

from __future__ import annotations

import orjson
import pytest

from journal.events import Block, Error, Received, StreamOpened, Upstream, Validated
from smg.backends.anthropic.backend import reserialize
from smg.backends.anthropic.headers import upstream_headers
from smg.backends.anthropic.sse import MAX_FRAME_BYTES, SseDecoder, SseError
from smg.projection import End, Head, Projection, Send, Whole, reconstruct
from smg.protocol.errors import ApiError


def test_only_credentials_and_api_selection_are_forwarded() -> None:
    headers = {
        "X-API-KEY": "k", "Authorization": "Bearer b", "anthropic-version": "v", "Anthropic-Beta": "b1",
        "x-smg-mcp": "enabled", "user-agent": "u", "x-request-id": "r", "content-type": "text/plain",
    }  # fmt: skip
    assert upstream_headers(headers) == {
        "x-api-key": "k", "authorization": "Bearer b", "anthropic-version": "v", "anthropic-beta": "b1",
        "content-type": "application/json",
    }  # fmt: skip


def test_sse_decoder_splits_frames_across_reads_and_infers_types() -> None:
    decoder = SseDecoder()
    stream = (
        b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n'
        b": a comment\n\n"
        b"event: ping\r\ndata: {}\r\n\r\n"  # no type in the payload: the event name gives it
        b'data: {"type":"content_block_stop","index":0}\n\n'  # no event line: the payload's type
        b"event: x\ndata: not json\n\n"  # undecodable: skipped
        b'event: message_stop\ndata: {"type":"message_stop"}'  # no final blank line
    )
    out = []
    for i in range(0, len(stream), 7):
        out += decoder.feed(stream[i : i + 7])
    out += decoder.flush()
    assert [e["type"] for e in out] == ["message_start", "ping", "content_block_stop", "message_stop"]


def test_sse_decoder_refuses_an_endless_frame() -> None:
    decoder = SseDecoder()
    with pytest.raises(SseError):
        decoder.feed(b"data: " + b"x" * (MAX_FRAME_BYTES + 1))


def test_reserialize_drops_unmodeled_fields_and_refuses_what_does_not_parse() -> None:
    raw = orjson.dumps(
        {
            "id": "msg_1", "type": "message", "role": "assistant", "model": "m", "extra": 1,
            "content": [{"type": "text", "text": "t", "citations": None}],
            "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 1, "output_tokens": 2, "cache_creation_input_tokens": None},
        }
    )  # fmt: skip
    assert orjson.loads(reserialize(raw)) == {
        "id": "msg_1", "type": "message", "role": "assistant", "content": [{"type": "text", "text": "t"}],
        "model": "m", "stop_reason": "end_turn", "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 2},
    }  # fmt: skip
    with pytest.raises(ApiError) as info:
        reserialize(b"[]")
    assert (info.value.status, info.value.code) == (502, "parse_error")
    assert info.value.message == "Invalid response from backend"


def test_an_original_part_is_the_journals_alone() -> None:
    projection = Projection("req_1", stream=False)
    assert projection.feed(Upstream(part="head", status=200, headers={"content-type": "application/json"})) == []
    assert projection.feed(Upstream(part="original", status=200, data='{"raw":1,"extra":2}')) == []
    (whole,) = projection.feed(Upstream(part="body", data='{"raw":1}'))
    assert isinstance(whole, Whole) and whole.body == b'{"raw":1}' and whole.status == 200


def test_an_original_part_never_joins_an_error_body() -> None:
    projection = Projection("req_1")
    projection.feed(Upstream(part="head", status=500, headers={}))
    projection.feed(Upstream(part="original", data="ignored"))
    (whole,) = projection.feed(Upstream(part="body", data="boom"))
    assert isinstance(whole, Whole) and orjson.loads(whole.body)["error"]["message"] == "boom"


def test_stream_opened_sends_the_head_so_a_later_error_is_an_sse_event() -> None:
    projection = Projection("req_1", stream=True)
    (head,) = projection.feed(StreamOpened())
    assert isinstance(head, Head) and head.status == 200
    assert head.headers["content-type"].startswith("text/event-stream")
    actions = projection.feed(Error(stage="mcp", status=502, error_type="api_error", message="first call failed"))
    assert isinstance(actions[0], Send) and isinstance(actions[1], End)
    frame = b'event: error\ndata: {"type":"error","error":{"type":"api_error","message":"first call failed"}}\n\n'
    assert actions[0].data == frame


def test_stream_opened_means_nothing_to_a_buffered_answer() -> None:
    projection = Projection("req_1", stream=False)
    assert projection.feed(StreamOpened()) == []
    (whole,) = projection.feed(Error(stage="mcp", status=502, error_type="api_error", message="no", code="c"))
    assert isinstance(whole, Whole) and whole.status == 502


def test_reconstruct_shows_what_the_client_got() -> None:
    events = [
        Received(method="POST", path="/v1/messages", request_id="req_9"),
        Validated(model="m", stream=True),
        StreamOpened(),
        Block(event={"type": "ping"}),
        Error(stage="upstream", status=502, error_type="overloaded_error", message="busy"),
    ]
    out = reconstruct(events)
    assert out.status == 200 and out.streamed
    assert out.body == (
        b'event: ping\ndata: {"type":"ping"}\n\n'
        b'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"busy"}}\n\n'
    )


def test_a_relayed_body_is_sent_as_the_bytes_that_came() -> None:
    """The bytes a relay read go to the client as they are, not re-encoded from the journal's text."""
    raw = b'{"type":"message","content":[{"type":"text","text":"\xc3\xa9"}]}'
    projection = Projection("req_1", stream=False)
    projection.feed(Upstream(part="head", status=200, headers={"content-type": "application/json"}))
    (whole,) = projection.feed(Upstream(part="body", data=raw.decode(), raw=raw))
    assert isinstance(whole, Whole) and whole.body is raw
