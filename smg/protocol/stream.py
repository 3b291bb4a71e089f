"""Stream events of the Messages API as plain dicts, and their SSE framing.

This is the per-token hot path: no pydantic, dicts built in the exact key order the public API
uses (behaviors.md D.2), serialized once with orjson into `event: <type>\\ndata: <json>\\n\\n`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

DIRECT_CALLER: dict[str, str] = {"type": "direct"}


def usage_start(usage: Mapping[str, int] | None = None) -> dict[str, int]:
    """`message_start` usage: input, output, cache creation, cache read; absent counts are 0."""
    usage = usage or {}
    return {
        "input_tokens": usage.get("input_tokens") or 0,
        "output_tokens": usage.get("output_tokens") or 0,
        "cache_creation_input_tokens": usage.get("cache_creation_input_tokens") or 0,
        "cache_read_input_tokens": usage.get("cache_read_input_tokens") or 0,
    }


def usage_delta(usage: Mapping[str, int | None]) -> dict[str, int]:
    """`message_delta` usage: output, then input only when known, then the cache counters."""
    out: dict[str, int] = {"output_tokens": usage.get("output_tokens") or 0}
    input_tokens = usage.get("input_tokens")
    if input_tokens is not None:
        out["input_tokens"] = input_tokens
    out["cache_creation_input_tokens"] = usage.get("cache_creation_input_tokens") or 0
    out["cache_read_input_tokens"] = usage.get("cache_read_input_tokens") or 0
    return out


def message_start(id: str, model: str, usage: Mapping[str, int] | None = None) -> dict[str, Any]:
    return {
        "type": "message_start",
        "message": {
            "id": id,
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": model,
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage_start(usage),
        },
    }


def text_block(text: str = "") -> dict[str, Any]:
    return {"type": "text", "text": text}


def thinking_block(thinking: str = "", signature: str = "") -> dict[str, Any]:
    return {"type": "thinking", "thinking": thinking, "signature": signature}


def tool_use_block(
    id: str,
    name: str,
    input: Any = None,
    caller: Mapping[str, Any] | None = DIRECT_CALLER,
) -> dict[str, Any]:
    """A `tool_use` block (in `content_block_start` its `input` is `{}`)."""
    block: dict[str, Any] = {
        "type": "tool_use",
        "id": id,
        "name": name,
        "input": {} if input is None else input,
    }
    if caller is not None:
        block["caller"] = dict(caller)
    return block


def content_block_start(index: int, block: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_start", "index": index, "content_block": block}


def _delta(index: int, delta: dict[str, Any]) -> dict[str, Any]:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def text_delta(index: int, text: str) -> dict[str, Any]:
    return _delta(index, {"type": "text_delta", "text": text})


def thinking_delta(index: int, thinking: str) -> dict[str, Any]:
    return _delta(index, {"type": "thinking_delta", "thinking": thinking})


def signature_delta(index: int, signature: str) -> dict[str, Any]:
    return _delta(index, {"type": "signature_delta", "signature": signature})


def input_json_delta(index: int, partial_json: str) -> dict[str, Any]:
    return _delta(index, {"type": "input_json_delta", "partial_json": partial_json})


def content_block_stop(index: int) -> dict[str, Any]:
    return {"type": "content_block_stop", "index": index}


def message_delta(
    stop_reason: str | None,
    stop_sequence: str | None,
    usage: Mapping[str, int | None],
) -> dict[str, Any]:
    """The closing `message_delta`; `delta.stop_sequence` only when a stop sequence matched."""
    delta: dict[str, Any] = {"stop_reason": stop_reason}
    if stop_sequence is not None:
        delta["stop_sequence"] = stop_sequence
    return {"type": "message_delta", "delta": delta, "usage": usage_delta(usage)}


def message_stop() -> dict[str, Any]:
    return {"type": "message_stop"}


def ping() -> dict[str, Any]:
    return {"type": "ping"}


def error_event(type: str, message: str) -> dict[str, Any]:
    """A failure after the stream started: no `request_id`, and the stream ends after it."""
    return {"type": "error", "error": {"type": type, "message": message}}


def sse_frame(event: dict[str, Any]) -> bytes:
    """`event: <type>\\ndata: <compact JSON>\\n\\n`."""
    return b"event: " + str(event["type"]).encode() + b"\ndata: " + orjson.dumps(event) + b"\n\n"
