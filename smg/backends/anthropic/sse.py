"""Decoding the Anthropic API's SSE stream into event payloads, for the MCP tool loop (plain
relaying never decodes: it passes bytes through).

Frames are split on blank lines (`\\n\\n`, `\\r\\n\\r\\n` or `\\r\\r`); `data:` lines are joined;
a payload without a `type` takes the frame's `event:` name; comments, frames without data and
undecodable JSON are skipped. A frame that grows past 1 MiB without ending is an error.
"""

from __future__ import annotations

import re
from typing import Any

import orjson

MAX_FRAME_BYTES = 1 << 20
_BOUNDARY = re.compile(rb"\r\n\r\n|\n\n|\r\r")
_LINE = re.compile(rb"\r\n|\n|\r")


class SseError(ValueError):
    """The stream cannot be decoded any further."""


class SseDecoder:
    """Feed bytes as they arrive, get the complete events' payloads."""

    __slots__ = ("_buffer",)

    def __init__(self) -> None:
        self._buffer = b""

    def feed(self, chunk: bytes) -> list[dict[str, Any]]:
        self._buffer += chunk
        out: list[dict[str, Any]] = []
        while True:
            match = _BOUNDARY.search(self._buffer)
            if match is None:
                break
            frame, self._buffer = self._buffer[: match.start()], self._buffer[match.end() :]
            payload = decode_frame(frame)
            if payload is not None:
                out.append(payload)
        if len(self._buffer) > MAX_FRAME_BYTES:
            raise SseError(f"SSE buffer exceeded {MAX_FRAME_BYTES} bytes without a complete event")
        return out

    def flush(self) -> list[dict[str, Any]]:
        """The stream ended: a last frame without its blank line still counts."""
        rest, self._buffer = self._buffer, b""
        payload = decode_frame(rest) if rest.strip() else None
        return [payload] if payload is not None else []


def decode_frame(frame: bytes) -> dict[str, Any] | None:
    event: str | None = None
    data: list[bytes] = []
    for line in _LINE.split(frame):
        if not line or line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if value.startswith(b" "):
            value = value[1:]
        if name == b"event":
            event = value.decode("utf-8", "replace")
        elif name == b"data":
            data.append(value)
    if not data:
        return None
    try:
        payload = orjson.loads(b"\n".join(data))
    except orjson.JSONDecodeError:
        return None
    if not isinstance(payload, dict):
        return None
    if not isinstance(payload.get("type"), str):
        if event is None:
            return None
        payload["type"] = event
    return payload


class ErrorFrameWatch:
    """Watches relayed SSE text for an `error` event: `feed` returns the offset in the piece just
    after that frame's blank line (where the stream must end), else None."""

    __slots__ = ("_pending",)

    _BOUNDARY_TEXT = re.compile(r"\r\n\r\n|\n\n|\r\r")

    def __init__(self) -> None:
        self._pending = ""

    def feed(self, piece: str) -> int | None:
        text = self._pending + piece
        offset = len(self._pending)
        start = 0
        for match in self._BOUNDARY_TEXT.finditer(text):
            if _is_error_frame(text[start : match.start()]):
                return match.end() - offset
            start = match.end()
        self._pending = text[start:][-MAX_FRAME_BYTES:]
        return None


def _is_error_frame(frame: str) -> bool:
    for line in frame.splitlines():
        name, _, value = line.partition(":")
        if name == "event":
            return value.strip() == "error"
    return False
