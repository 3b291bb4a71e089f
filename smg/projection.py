"""The HTTP response as a projection of a request's events.

Sans-IO: a `Projection` is fed events in order and answers with actions for the server to
carry out (`Whole` for a buffered response, `Head`/`Send`/`End` for a stream). The live
server and `reconstruct` (journal views, replay) run the same code, so what the journal
shows is what the client received.

- Relay backends: `upstream` parts; a success passes through byte for byte (an `original`
  part, the upstream's bytes before the gateway re-serialized them, is the journal's alone),
  an error status becomes the Messages envelope.
- Engine backends: `block` events; a stream is their SSE frames, a buffered answer is the
  message they build.
- `counted`: the gateway's own count_tokens answer.
- `stream_opened`: a stream's head is sent before any block (the MCP tool loop).
- Any `error` event: the envelope before the first byte, an SSE `error` frame after it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson

from journal.events import Block, Counted, Error, Event, Received, StreamOpened, Upstream, Validated
from smg.protocol.errors import envelope, error_from_upstream
from smg.protocol.fold import BlockFold
from smg.protocol.stream import error_event, sse_frame


@dataclass
class Whole:
    status: int
    headers: dict[str, str]
    body: bytes


@dataclass
class Head:
    status: int
    headers: dict[str, str]


@dataclass
class Send:
    data: bytes


@dataclass
class End:
    pass


Action = Whole | Head | Send | End

SSE_HEADERS = {"content-type": "text/event-stream; charset=utf-8", "cache-control": "no-cache"}


def _json_headers(request_id: str) -> dict[str, str]:
    # Anthropic SDKs read `request-id` (`APIStatusError.request_id`), others `x-request-id`.
    return {"content-type": "application/json", "x-request-id": request_id, "request-id": request_id}


def error_response(request_id: str, error: Error) -> Whole:
    body = orjson.dumps(envelope(error.error_type, error.message, request_id))
    return Whole(error.status, {**error.headers, **_json_headers(request_id)}, body)


class Projection:
    """Feed events, get actions. `started` turns true with the first byte of a stream."""

    def __init__(self, request_id: str, stream: bool = False) -> None:
        self.request_id = request_id
        self.stream = stream
        self.started = False
        self.done = False
        self.status: int | None = None
        self._worker: str | None = None
        self._head: Upstream | None = None
        self._error_body: list[bytes] = []
        self._message: dict[str, Any] | None = None
        self._content = BlockFold()
        # The error envelope made from an upstream's error answer, for the journal to record
        # as an `error` event (a projection that is done ignores it on a rebuild).
        self.relayed_error: Error | None = None

    def feed(self, event: Event) -> list[Action]:
        if self.done:
            return []
        if isinstance(event, Upstream):
            return self._upstream(event)
        if isinstance(event, Block):
            return self._block(event.event)
        if isinstance(event, Error):
            return self._error(event)
        if isinstance(event, StreamOpened):
            return self._open() if self.stream and not self.started else []
        if isinstance(event, Counted):
            self.done = True
            self.status = 200
            body = orjson.dumps({"input_tokens": event.input_tokens})
            return [Whole(200, _json_headers(self.request_id), body)]
        return []

    def finish(self) -> list[Action]:
        """The events ran out: close what is open."""
        if self.done:
            return []
        if self._head is not None and self._head.status and self._head.status >= 400:
            return self._upstream_error()
        if self.started:
            self.done = True
            return [End()]
        return []

    # relay backends

    def _upstream(self, event: Upstream) -> list[Action]:
        if event.part == "original" or event.part.startswith("prefill:"):
            return []  # the journal's alone: the upstream's own bytes, a prefill leg's answer
        if event.part == "head":
            self._head = event
            self._worker = event.worker
            status = event.status or 502
            if status < 400 and self.stream:
                self.started = True
                self.status = status
                return [Head(status, self._success_headers(event))]
            return []
        head = self._head
        if head is None:
            return []
        data = event.payload()
        if head.status is not None and head.status >= 400:
            self._error_body.append(data)
            return self._upstream_error() if event.part == "body" else []
        if event.part == "chunk":
            return [Send(data)] if self.started else []
        self.done = True
        self.status = head.status
        return [Whole(head.status or 200, self._success_headers(head), data)]

    def _success_headers(self, head: Upstream) -> dict[str, str]:
        headers = dict(head.headers or {})
        headers["x-request-id"] = self.request_id
        if not any(k.lower() == "request-id" for k in headers):  # an upstream's own wins
            headers["request-id"] = self.request_id
        if head.worker:
            headers["x-smg-routed-worker-id"] = head.worker
        return headers

    def _upstream_error(self) -> list[Action]:
        head = self._head
        assert head is not None and head.status is not None
        err = error_from_upstream(head.status, b"".join(self._error_body), head.headers)
        error = Error(
            stage="upstream", status=err.status, error_type=err.type, message=err.message, headers=err.headers
        )
        self.relayed_error = error
        return self._error(error)

    # engine backends

    def _block(self, payload: dict[str, Any]) -> list[Action]:
        kind = payload.get("type")
        if self.stream:
            actions: list[Action] = [] if self.started else self._open()
            actions.append(Send(sse_frame(payload)))
            if kind == "message_stop":
                self.done = True
                actions.append(End())
            return actions
        if kind == "message_start":
            self._message = dict(payload["message"], content=[])
        elif self._message is None:
            return []
        elif kind == "message_delta":
            _apply_message_delta(self._message, payload)
        elif kind == "message_stop":
            self._message["content"] = self._content.content()
            self.done = True
            self.status = 200
            body = orjson.dumps(self._message)
            return [Whole(200, _json_headers(self.request_id), body)]
        else:
            self._content.feed(payload)
        return []

    def _open(self) -> list[Action]:
        self.started = True
        self.status = 200
        return [Head(200, {**SSE_HEADERS, "x-request-id": self.request_id, "request-id": self.request_id})]

    # failures

    def _error(self, error: Error) -> list[Action]:
        self.done = True
        if self.started:
            frame = sse_frame(error_event(error.error_type, error.message))
            return [Send(frame), End()]
        self.status = error.status
        return [error_response(self.request_id, error)]


def _apply_message_delta(message: dict[str, Any], payload: dict[str, Any]) -> None:
    """The message-level part of a stream: how it ended and the final usage."""
    delta = payload.get("delta", {})
    message["stop_reason"] = delta.get("stop_reason")
    message["stop_sequence"] = delta.get("stop_sequence")
    usage = dict(message.get("usage") or {})
    usage.update(payload.get("usage") or {})
    message["usage"] = usage


@dataclass
class Reconstructed:
    status: int | None
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    streamed: bool = False


def reconstruct(events: Iterable[Event]) -> Reconstructed:
    """Replay a journaled request's events through the projection: the response as sent."""
    events = list(events)
    request_id = next((e.echoed_id for e in events if isinstance(e, Received)), "")
    stream = next((e.stream for e in events if isinstance(e, Validated)), False)
    projection = Projection(request_id, stream)
    out = Reconstructed(status=None)
    actions: list[Action] = []
    for event in events:
        actions.extend(projection.feed(event))
    actions.extend(projection.finish())
    for action in actions:
        if isinstance(action, Whole):
            out.status, out.headers, out.body = action.status, action.headers, action.body
        elif isinstance(action, Head):
            out.status, out.headers, out.streamed = action.status, action.headers, True
        elif isinstance(action, Send):
            out.body += action.data
    return out
