"""Answers of a scripted Anthropic API upstream, for `tools.scripted_worker`'s ``POST /_script``.

The scripted worker serves ``/v1/messages`` with whatever it is told; these helpers build what
the real API would say: a message (text, ``tool_use`` turns), the same message as the SSE
event sequence of a stream (optionally with a ``ping``), and errors in the API's shape. Also
``parse_sse`` to read a stream back as ``(event, payload)`` pairs.
"""

from __future__ import annotations

import itertools
from typing import Any

import orjson

_ids = itertools.count(1)


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def tool_use(name: str, input: dict[str, Any], id: str | None = None) -> dict[str, Any]:
    return {"type": "tool_use", "id": id or f"toolu_{next(_ids):024d}", "name": name, "input": input}


def message(
    *content: dict[str, Any],
    model: str = "claude-test",
    stop_reason: str | None = None,
    usage: tuple[int, int] = (10, 5),
    id: str | None = None,
) -> dict[str, Any]:
    """A Messages response; `stop_reason` defaults to tool_use when a block is a tool call."""
    if stop_reason is None:
        stop_reason = "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn"
    return {
        "id": id or f"msg_{next(_ids):024d}",
        "type": "message",
        "role": "assistant",
        "content": list(content),
        "model": model,
        "stop_reason": stop_reason,
        "stop_sequence": None,
        "usage": {"input_tokens": usage[0], "output_tokens": usage[1]},
    }


def json_answer(msg: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"json": msg, **extra}


def stream_events(msg: dict[str, Any], ping: bool = False) -> list[dict[str, Any]]:
    """The event payloads the API streams for `msg` (text in two deltas, tool input in one)."""
    start = dict(msg, content=[], stop_reason=None, stop_sequence=None)
    start["usage"] = {"input_tokens": msg["usage"]["input_tokens"], "output_tokens": 1}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": start}]
    if ping:
        events.append({"type": "ping"})
    for index, block in enumerate(msg["content"]):
        if block["type"] == "text":
            empty = {"type": "text", "text": ""}
            events.append({"type": "content_block_start", "index": index, "content_block": empty})
            half = len(block["text"]) // 2
            for piece in (block["text"][:half], block["text"][half:]):
                delta = {"type": "text_delta", "text": piece}
                events.append({"type": "content_block_delta", "index": index, "delta": delta})
        elif block["type"] == "tool_use":
            events.append({"type": "content_block_start", "index": index, "content_block": dict(block, input={})})
            delta = {"type": "input_json_delta", "partial_json": orjson.dumps(block["input"]).decode()}
            events.append({"type": "content_block_delta", "index": index, "delta": delta})
        else:
            events.append({"type": "content_block_start", "index": index, "content_block": block})
        events.append({"type": "content_block_stop", "index": index})
    events.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": msg["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": msg["usage"]["output_tokens"]},
        }
    )
    events.append({"type": "message_stop"})
    return events


def sse_answer(msg: dict[str, Any], ping: bool = False, **extra: Any) -> dict[str, Any]:
    """A scripted streaming answer for `msg`."""
    return {"sse": [{"event": e["type"], "data": e} for e in stream_events(msg, ping)], **extra}


def error_answer(status: int, error_type: str, message: str, **extra: Any) -> dict[str, Any]:
    body = {"type": "error", "error": {"type": error_type, "message": message}, "request_id": "req_upstream"}
    return {"status": status, "json": body, **extra}


def parse_sse(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """A stream's events as `(event name, payload)` pairs."""
    out: list[tuple[str, dict[str, Any]]] = []
    for frame in data.replace(b"\r\n", b"\n").split(b"\n\n"):
        if not frame.strip():
            continue
        name, payload = "", b""
        for line in frame.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                payload = line[6:]
        out.append((name, orjson.loads(payload)))
    return out
