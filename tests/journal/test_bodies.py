"""`--journal-bodies`: what each mode keeps of request and response content."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from journal.bodies import BodyFilter, fingerprint, redact_payload
from journal.events import (
    Block,
    Completed,
    Error,
    Event,
    McpCall,
    McpResult,
    ModelCall,
    ModelResult,
    Received,
    Rendered,
    Routed,
    Tokens,
    Upstream,
    Validated,
)
from journal.reader import JournalReader
from journal.redact import redacted
from journal.writer import JournalWriter
from tests.journal.test_writer import streaming_request

SECRET_TEXT = "the-launch-codes-are-0000"
REQUEST_BODY = json.dumps(
    {
        "model": "claude-x",
        "max_tokens": 64,
        "stream": True,
        "system": f"system prompt {SECRET_TEXT}",
        "messages": [{"role": "user", "content": [{"type": "text", "text": f"hello {SECRET_TEXT}"}]}],
        "mcp_servers": [{"type": "url", "name": "s", "url": "https://mcp", "authorization_token": "tok-123"}],
    }
)
SSE = [
    'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","model":"m","role":"assistant",'
    '"content":[],"usage":{"input_tokens":12,"output_tokens":1}}}\n\n',
    'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
    '"content_block":{"type":"text","text":""}}\n\n',
    'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta",'
    f'"text":"{SECRET_TEXT}"}}}}\n\n',
    'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},'
    '"usage":{"output_tokens":7}}\n\n',
    'event: message_stop\ndata: {"type":"message_stop"}\n\n',
]


def relayed_stream() -> list[Event]:
    text = "".join(SSE)
    cuts = [0, 37, 120, 121, 300, len(text) - 5, len(text)]  # reads that split lines anywhere
    return [
        Received(method="POST", path="/v1/messages", headers={"x-api-key": "sk-1"}, body=REQUEST_BODY, ts=1.0),
        Validated(model="claude-x", stream=True, t=0.001),
        Routed(backend="http", worker="http://w", model="claude-x", t=0.002),
        Upstream(part="head", status=200, headers={"content-type": "text/event-stream"}, t=0.003),
        *(Upstream(part="chunk", data=text[a:b], t=0.004 + i / 1000) for i, (a, b) in enumerate(zip(cuts, cuts[1:]))),
        Completed(status=200, duration_ms=9.0, usage={"input_tokens": 12, "output_tokens": 7}, stop_reason="end_turn"),
    ]


def run(mode: str, events: list[Event], request_id: str = "r") -> list[Event]:
    filt = BodyFilter(mode)
    return [filt(request_id, redacted(e)) for e in events]


def test_full_keeps_everything() -> None:
    events = relayed_stream()
    assert run("full", events) == [redacted(e) for e in events]


def test_fingerprints_match_equal_texts_and_give_the_size() -> None:
    assert fingerprint("abc") == fingerprint("abc") != fingerprint("abd")
    assert fingerprint("héllo").endswith(" len=5]") and fingerprint("").startswith("[text sha256:")


def test_redacted_request_body_keeps_structure_not_text() -> None:
    received = run("redacted", relayed_stream())[0]
    assert isinstance(received, Received)
    assert received.body is not None and SECRET_TEXT not in received.body
    body = json.loads(received.body)
    assert body["model"] == "claude-x" and body["max_tokens"] == 64 and body["stream"] is True
    assert body["messages"][0]["role"] == "user" and body["messages"][0]["content"][0]["type"] == "text"
    text = f"hello {SECRET_TEXT}"
    assert body["messages"][0]["content"][0]["text"] == fingerprint(text)
    assert body["system"].endswith(f" len={len('system prompt ' + SECRET_TEXT)}]")
    assert body["mcp_servers"][0]["authorization_token"].startswith("[redacted sha256:")  # the secret's own form
    assert received.headers["x-api-key"].startswith("[redacted sha256:")
    assert run("redacted", [Received(method="POST", path="/", body="not json {")])[0] == Received(
        method="POST", path="/", body=fingerprint("not json {")
    )


def test_redacted_stream_is_redacted_line_by_line_whatever_the_reads() -> None:
    events = run("redacted", relayed_stream())
    chunks = [e for e in events if isinstance(e, Upstream) and e.part == "chunk"]
    stored = "".join(c.data or "" for c in chunks)
    assert SECRET_TEXT not in stored
    assert stored == redact_payload("".join(SSE))  # as if the stream had come in one read
    assert all((c.data or "").endswith("\n") or not c.data for c in chunks)  # only whole lines
    lines = stored.split("\n")
    assert lines[0] == "event: message_start"
    delta = json.loads(lines[7].removeprefix("data: "))
    assert delta["delta"] == {"type": "text_delta", "text": fingerprint(SECRET_TEXT)}
    message_delta = json.loads(lines[10].removeprefix("data: "))
    assert message_delta["usage"] == {"output_tokens": 7} and message_delta["delta"]["stop_reason"] == "end_turn"
    head = next(e for e in events if isinstance(e, Upstream) and e.part == "head")
    assert head.headers == {"content-type": "text/event-stream"}


def test_a_cut_stream_drops_only_its_unfinished_line() -> None:
    filt = BodyFilter("redacted")
    first = filt("r", Upstream(part="chunk", data='data: {"type":"ping"}\ndata: {"type":"content_bl'))
    assert isinstance(first, Upstream) and first.data == 'data: {"type":"ping"}\n'
    filt("r", Completed(status=200, duration_ms=1.0))
    again = filt("r", Upstream(part="chunk", data="\n"))  # state was dropped with the request
    assert isinstance(again, Upstream) and again.data == "\n"


def test_redacted_blocks_tokens_and_mcp() -> None:
    events = run("redacted", streaming_request())
    delta = next(e for e in events if isinstance(e, Block) and e.event["type"] == "content_block_delta")
    assert delta.event["delta"] == {"type": "thinking_delta", "thinking": fingerprint("ünïcödé ✓")}
    tool = next(
        e for e in events if isinstance(e, Block) and e.event.get("content_block", {}).get("type") == "tool_use"
    )
    assert tool.event["content_block"]["name"] == "f" and tool.event["content_block"]["id"] == "tu_1"
    tokens = next(e for e in events if isinstance(e, Tokens))
    assert tokens.ids == [-1, -1, -1] and tokens.completion_tokens == 3
    mcp = run(
        "redacted",
        [
            ModelCall(round=1, request={"model": "m", "messages": [{"role": "user", "content": "q?"}]}),
            ModelResult(round=1, status=200, data='{"type":"message","content":[{"type":"text","text":"a!"}]}'),
            McpCall(round=1, server="s", tool="lookup", id="tu_1", input={"q": "secret"}),
            McpResult(round=1, server="s", tool="lookup", id="tu_1", content="result text"),
        ],
    )
    assert mcp[0] == ModelCall(
        round=1, request={"model": "m", "messages": [{"role": "user", "content": fingerprint("q?")}]}
    )
    assert isinstance(mcp[1], ModelResult) and json.loads(mcp[1].data or "")["content"][0]["text"] == fingerprint("a!")
    assert mcp[2] == McpCall(round=1, server="s", tool="lookup", id="tu_1", input={"q": fingerprint("secret")})
    assert isinstance(mcp[3], McpResult) and mcp[3].content == fingerprint("result text")


def test_none_keeps_no_content_but_the_shape() -> None:
    events = run("none", relayed_stream() + streaming_request(), request_id="r")
    received = events[0]
    assert isinstance(received, Received) and received.body is None
    assert all(e.data is None for e in events if isinstance(e, Upstream) and e.part != "head")
    blocks = [e.event for e in events if isinstance(e, Block)]
    assert [b["type"] for b in blocks] == [b.event["type"] for b in streaming_request() if isinstance(b, Block)]
    assert blocks[2]["delta"] == {"type": "thinking_delta", "thinking": ""}
    assert blocks[5]["delta"]["stop_reason"] == "tool_use" and blocks[5]["usage"] == {"output_tokens": 9}
    assert next(e for e in events if isinstance(e, Tokens)).ids == []
    completed = [e for e in events if isinstance(e, Completed)]
    assert completed[0].usage == {"input_tokens": 12, "output_tokens": 7}


def test_error_events_and_rendered_settings() -> None:
    error = Error(stage="backend", status=529, error_type="overloaded_error", message="Overloaded")
    rendered = Rendered(
        prompt_tokens=5,
        prompt_digest="abc",
        stop_ids=[7],
        settings={"message_id": "msg_1", "stop_sequences": ["STOP"], "stop_token_map": {"7": "STOP"}},
    )
    for mode in ("redacted", "none"):
        out = run(mode, [error, rendered])
        assert out[0] == error
        assert isinstance(out[1], Rendered) and out[1].settings is not None
        assert out[1].settings["message_id"] == "msg_1" and "STOP" not in json.dumps(out[1].settings)


def test_unknown_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="full, redacted, none"):
        BodyFilter("some")
    with pytest.raises(ValueError):
        JournalWriter("x.db", bodies="partial")


@pytest.mark.parametrize("mode", ["full", "redacted", "none"])
async def test_the_summary_row_is_the_same_in_every_mode(tmp_path: Path, mode: str) -> None:
    path = tmp_path / f"{mode}.db"
    writer = JournalWriter(path, bodies=mode)
    await writer.start()
    for request_id, events in (("relay", relayed_stream()), ("grpc", streaming_request())):
        for seq, event in enumerate(events, 1):
            await writer.append(request_id, seq, event)
    await writer.close()
    with JournalReader(path) as reader:
        rows = {r["id"]: r for r in reader.list_requests()}
        kinds = [e.kind for _, e in reader.events("relay")]
    assert {r["bodies"] for r in rows.values()} == {mode}
    assert [e.kind for e in relayed_stream()] == kinds
    relay, grpc = rows["relay"], rows["grpc"]
    assert (relay["status"], relay["stop_reason"], relay["input_tokens"], relay["output_tokens"]) == (
        200,
        "end_turn",
        12,
        7,
    )
    assert (grpc["stop_reason"], grpc["has_tool_use"], grpc["has_thinking"], grpc["ttfe_ms"]) == (
        "tool_use",
        True,
        True,
        20.5,
    )
    conn = sqlite3.connect(path)
    try:
        # Packed runs are BLOBs whose text section is UTF-8 (journal.packed): read the bytes as text.
        stored = "".join(
            r[0] if isinstance(r[0], str) else r[0].decode("utf-8", "replace")
            for r in conn.execute("SELECT data FROM events")
        )
    finally:
        conn.close()
    assert (SECRET_TEXT in stored) is (mode == "full")
    assert ("ünïcödé" in stored) is (mode == "full")
