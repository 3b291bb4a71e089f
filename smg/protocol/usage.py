"""Reading `stop_reason` and `usage` out of a Messages response as it passes by.

Relay backends pass responses through untouched; the journal still wants to know how each
one ended. `UsageReader` takes the body (or the SSE text, piece by piece), and parses only the
frames that carry usage (`message_start`, `message_delta`), so the cost per chunk is a
substring check.
"""

from __future__ import annotations

from typing import Any

import orjson

_MAX_PENDING = 1 << 16  # a frame longer than this carries no usage worth the memory


class UsageReader:
    __slots__ = ("usage", "stop_reason", "_pending", "_final", "_generated", "_prompt")

    def __init__(self) -> None:
        self.usage: dict[str, Any] = {}
        self.stop_reason: str | None = None
        self._pending = ""
        self._final = False  # a message_delta (or a whole message) gave the final usage
        self._generated = 0
        self._prompt = 0

    def rendered(self, prompt_tokens: int) -> None:
        """The rendered prompt's token count (gRPC/ZMQ `rendered` events), known before output."""
        self._prompt = prompt_tokens

    def generated(self, completion_tokens: int) -> None:
        """The engine's running count of output tokens (gRPC `tokens` events)."""
        self._generated = max(self._generated, completion_tokens)

    def final_usage(self) -> dict[str, Any]:
        """The usage to record: the response's own final usage when it got that far; for a
        stream cut before its `message_delta` (a client gone, a failure), what `message_start`
        said (its counters are zero) with the rendered prompt's tokens and the output tokens the
        engine had produced by then."""
        if self._final or not (self._generated or self._prompt):
            return self.usage
        usage = dict(self.usage)
        if self._prompt:
            usage["input_tokens"] = max(int(usage.get("input_tokens") or 0), self._prompt)
        if self._generated:
            usage["output_tokens"] = max(int(usage.get("output_tokens") or 0), self._generated)
        return usage

    def body(self, text: str) -> Any:
        """A whole non-streaming message; its JSON as parsed (None when it is not JSON), which
        whoever else reads the message may take instead of parsing it again."""
        try:
            data = orjson.loads(text)
        except orjson.JSONDecodeError:
            return None
        self.message(data)
        return data

    def message(self, data: Any) -> None:
        """A whole non-streaming message, already parsed."""
        if isinstance(data, dict):
            self._final = True
            self._take(data.get("usage"), data.get("stop_reason"))

    def chunk(self, text: str) -> None:
        """The next piece of an SSE stream."""
        buffered = self._pending + text if self._pending else text
        frames, sep, rest = buffered.rpartition("\n\n")
        self._pending = rest[-_MAX_PENDING:] if len(rest) > _MAX_PENDING else rest
        if not sep or ("message_delta" not in frames and "message_start" not in frames):
            return
        for line in frames.split("\n"):
            if line.startswith("data:") and ("message_delta" in line or "message_start" in line):
                self._frame(line[5:])

    def _frame(self, payload: str) -> None:
        try:
            data = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return
        if isinstance(data, dict):
            self.event(data)

    def event(self, data: dict[str, Any]) -> None:
        """One decoded stream event."""
        if data.get("type") == "message_start" and isinstance(data.get("message"), dict):
            self._take(data["message"].get("usage"), None)
        elif data.get("type") == "message_delta":
            self._final = True
            delta = data.get("delta")
            self._take(data.get("usage"), delta.get("stop_reason") if isinstance(delta, dict) else None)

    def _take(self, usage: Any, stop_reason: Any) -> None:
        if isinstance(usage, dict):
            self.usage.update({k: v for k, v in usage.items() if isinstance(v, int) and not isinstance(v, bool)})
        if isinstance(stop_reason, str):
            self.stop_reason = stop_reason
