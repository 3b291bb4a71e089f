"""One journaled request in portable forms: a curl command, a JSON document, a HAR 1.2 log.

Pure functions over events. The response the client received is rebuilt by `smg.projection`,
which this package cannot import (the journal is the ground floor): callers pass it in as
anything with `status`, `headers`, `body` and `streamed` (`smg.projection.Reconstructed` is
one).
"""

from __future__ import annotations

import http
import json
import shlex
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol
from urllib.parse import parse_qsl

from journal.events import Completed, Event, Received
from journal.pieces import text_piece
from journal.redact import redact_value

DEFAULT_BASE_URL = "http://127.0.0.1:30000"
"""Where `smg launch` listens by default."""

KEY_VARIABLES = {"authorization": "SMG_API_KEY", "x-api-key": "ANTHROPIC_API_KEY"}
"""The environment variable a curl command reads for each redacted credential header."""

# Set by the transport (curl writes its own), or naming the original request: re-sending the
# recorded id would make the gateway journal the copy under the same id as the original.
_DROPPED = frozenset(
    {
        "host",
        "content-length",
        "connection",
        "keep-alive",
        "transfer-encoding",
        "te",
        "trailer",
        "upgrade",
        "expect",
        "accept-encoding",
        "x-request-id",
        "x-correlation-id",
        "x-trace-id",
        "request-id",
        # The gateways the recorded request had passed through: a copy sent again from here has
        # passed through none, and carrying the chain would get it refused (508) by one of them.
        "x-smg-hops",
    }
)
# Linux refuses a single exec argument over 128 KiB; larger bodies go through a pipe.
_INLINE_BODY_LIMIT = 64 * 1024

RawEvent = tuple[int, str, float, dict[str, Any]]
"""`(seq, kind, t, payload)`, as `JournalReader.raw_events` returns them."""


class Response(Protocol):
    """The response as the client received it."""

    @property
    def status(self) -> int | None: ...
    @property
    def headers(self) -> dict[str, str]: ...
    @property
    def body(self) -> bytes: ...
    @property
    def streamed(self) -> bool: ...


def is_redacted(value: str) -> bool:
    # redact_value is idempotent, so only an already-redacted value maps to itself.
    return redact_value(value) == value


# -- curl --------------------------------------------------------------------------------


def as_curl(received: Received, base_url: str = DEFAULT_BASE_URL) -> str:
    """A shell command that sends the recorded request again to `base_url`.

    Method, path and query, headers and body are the recorded ones, except headers the
    transport sets itself and request-id headers (so the gateway mints a fresh id). Redacted
    credentials become shell variables: `Authorization: Bearer $SMG_API_KEY` and
    `x-api-key: $ANTHROPIC_API_KEY` (any other redacted header: `$SMG_<NAME>`).
    """
    url = base_url.rstrip("/") + received.path + (f"?{received.query}" if received.query else "")
    head = "curl -sS -N" if _is_stream(received.body) else "curl -sS"
    # One option per line, so that a long command stays readable.
    lines = [head]
    if received.method != ("POST" if received.body else "GET"):
        lines.append(f"-X {shlex.quote(received.method)}")
    lines.append(shlex.quote(url))
    compressed = False
    for name, value in received.headers.items():
        lower = name.lower()
        compressed = compressed or lower == "accept-encoding"
        if lower in _DROPPED:
            continue
        if is_redacted(value):
            variable = KEY_VARIABLES.get(lower) or "SMG_" + "".join(c if c.isalnum() else "_" for c in lower.upper())
            scheme = "Bearer " if lower == "authorization" else ""
            lines.append(f'-H "{_dquote_literal(f"{name}: {scheme}")}${{{variable}}}"')
        else:
            lines.append(f"-H {shlex.quote(f'{name}: {value}')}")
    if compressed:
        lines.append("--compressed")
    pipe = ""
    if received.body:
        if len(received.body) > _INLINE_BODY_LIMIT:
            pipe = f"printf '%s' {shlex.quote(received.body)} | "
            lines.append("--data-binary @-")
        else:
            lines.append(f"--data-binary {shlex.quote(received.body)}")
    return pipe + " \\\n  ".join(lines)


def _is_stream(body: str | None) -> bool:
    if not body or '"stream"' not in body:
        return False
    try:
        parsed = json.loads(body)
    except ValueError:
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def _dquote_literal(text: str) -> str:
    """`text` escaped for the inside of a double-quoted shell word."""
    return "".join("\\" + c if c in '\\"$`' else c for c in text)


# -- JSON --------------------------------------------------------------------------------


def response_dict(response: Response | None) -> dict[str, Any] | None:
    """The response as JSON: the body as text, or base64 (`encoding`) when it is not UTF-8."""
    if response is None:
        return None
    body, encoding = text_piece(response.body)
    return {
        "status": response.status,
        "headers": dict(response.headers),
        "streamed": response.streamed,
        "body": body,
        "encoding": encoding,
    }


def as_json(
    summary: Mapping[str, Any],
    events: Sequence[RawEvent],
    response: Response | None,
    *,
    response_error: str | None = None,
) -> dict[str, Any]:
    """The whole request as one JSON-ready document: its summary row, its events as stored
    (`t` in seconds since the request arrived), and the response the client received
    (`None`, with `response_unavailable` saying why, when it cannot be rebuilt)."""
    return {
        "request": dict(summary),
        "events": [{"seq": seq, "kind": kind, "t": t, "data": data} for seq, kind, t, data in events],
        "response": response_dict(response),
        "response_unavailable": response_error,
    }


# -- HAR ---------------------------------------------------------------------------------


def as_har(
    events: Sequence[Event],
    response: Response | None,
    base_url: str = DEFAULT_BASE_URL,
    *,
    creator_version: str = "",
) -> dict[str, Any]:
    """A HAR 1.2 log with one entry: the recorded request and the response as received.

    Timings come from the events: `wait` runs from arrival to the first event that carries
    response content (upstream, block, counted or error), `receive` from there to
    `completed`. Headers are the journal's, secrets redacted.
    """
    received = next((e for e in events if isinstance(e, Received)), None)
    if received is None:
        raise ValueError("the events have no `received` event")
    completed = next((e for e in events if isinstance(e, Completed)), None)
    first = next((e.t for e in events if e.kind in ("upstream", "block", "counted", "error", "stream_opened")), None)
    total = completed.duration_ms if completed else max((e.t for e in events), default=0.0) * 1000.0
    wait = min(first * 1000.0, total) if first is not None else total
    url = base_url.rstrip("/") + received.path + (f"?{received.query}" if received.query else "")
    request: dict[str, Any] = {
        "method": received.method,
        "url": url,
        "httpVersion": "HTTP/1.1",
        "cookies": [],
        "headers": _har_headers(received.headers),
        "queryString": [{"name": k, "value": v} for k, v in parse_qsl(received.query, keep_blank_values=True)],
        "headersSize": -1,
        "bodySize": len(received.body.encode()) if received.body else 0,
    }
    if received.body:
        request["postData"] = {"mimeType": _header(received.headers, "content-type"), "text": received.body}
    entry: dict[str, Any] = {
        "startedDateTime": datetime.fromtimestamp(received.ts, tz=UTC).isoformat(timespec="milliseconds"),
        "time": round(total, 3),
        "request": request,
        "response": _har_response(response),
        "cache": {},
        "timings": {
            "blocked": -1,
            "dns": -1,
            "connect": -1,
            "ssl": -1,
            "send": 0,
            "wait": round(wait, 3),
            "receive": round(total - wait, 3),
        },
        "_requestId": received.request_id,
    }
    if completed is not None and completed.disconnected:
        entry["comment"] = "the client disconnected before the response was complete"
    return {
        "log": {
            "version": "1.2",
            "creator": {"name": "smg", "version": creator_version},
            "pages": [],
            "entries": [entry],
        }
    }


def _har_response(response: Response | None) -> dict[str, Any]:
    # HAR's convention for "no response": status 0 and an empty content.
    status = response.status if response is not None and response.status is not None else 0
    headers = dict(response.headers) if response is not None and response.status is not None else {}
    body = response.body if response is not None else b""
    content: dict[str, Any] = {"size": len(body), "mimeType": _header(headers, "content-type")}
    if body:
        content["text"], encoding = text_piece(body)
        if encoding == "base64":
            content["encoding"] = "base64"
    return {
        "status": status,
        "statusText": _phrase(status),
        "httpVersion": "HTTP/1.1",
        "cookies": [],
        "headers": _har_headers(headers),
        "content": content,
        "redirectURL": "",
        "headersSize": -1,
        "bodySize": len(body) if status else -1,
    }


def _har_headers(headers: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": name, "value": value} for name, value in headers.items()]


def _header(headers: Mapping[str, str], name: str) -> str:
    return next((v for k, v in headers.items() if k.lower() == name), "")


def _phrase(status: int) -> str:
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return ""
