"""What the journal keeps of request and response content: `--journal-bodies full|redacted|none`.

`BodyFilter(mode)` maps each event to the event the journal stores. Secrets are handled
apart (`journal.redact`, in every mode); this module decides about content: what the client
sent and what the model answered.

* `full`: everything, as today.
* `redacted`: content is replaced by fingerprints, structure is kept. A fingerprint is
  `[text sha256:<12 hex> len=<N>]` (N characters; for bytes that are not UTF-8,
  `[bytes sha256:… len=<N>]`, N bytes), so equal texts can be matched and sizes read, but
  short texts can be guessed by brute force: use `none` when that matters.
  In JSON (request bodies, response bodies, each SSE `data:` line, `block` payloads, the MCP
  loop's requests and tool inputs, the gRPC generation settings and constraint) every string
  is replaced by its fingerprint except values under the structural keys `_KEEP` (`type`,
  `role`, `model`, `id`, `name`, `stop_reason`, …) and values the secret redaction already
  replaced; keys, numbers (token counts, indexes), booleans and nulls stay. A payload that
  is not JSON becomes one fingerprint. Relayed SSE streams are redacted line by line (`event:`
  lines kept, `data:` lines as JSON, anything else fingerprinted); a chunk holds the redacted
  form of the complete lines that ended in it, so a line split across network reads is
  stored with the chunk where it ends, and an unfinished last line of a stream that was cut
  is dropped. gRPC `tokens` events keep their length, each id replaced by -1;
  `mcp_result.content` becomes a fingerprint.
* `none`: no content. `received.body`, upstream `chunk`/`body`/`original` data and
  `model_result.data` are dropped (None); in the structured payloads listed above every
  string outside `_KEEP` is emptied (""), so block kinds and order, tool names, usage and
  stop reasons stay; token ids are dropped ([]) and `mcp_result.content` is "".

In every mode the request's headers (secrets redacted), its `validated` summary, error
messages (`error`, `rejected`: the gateway's own words, which may quote a field) and the
`completed` event (usage, stop reason, sizes) are kept, so the `requests` summary row is the
same whatever the mode. Replay and `smg journal show` need `full` bodies; the summary column
`bodies` says which mode wrote a request.
"""

from __future__ import annotations

import base64
import hashlib
from collections import OrderedDict
from dataclasses import replace
from typing import Any

import orjson

from journal.events import (
    Block,
    Completed,
    Event,
    McpCall,
    McpResult,
    ModelCall,
    ModelResult,
    Received,
    Rendered,
    Tokens,
    Upstream,
)

MODES: tuple[str, ...] = ("full", "redacted", "none")

_KEEP = frozenset(
    {
        "type",
        "role",
        "model",
        "id",
        "tool_use_id",
        "name",
        "stop_reason",
        "media_type",
        "service_tier",
        "ttl",
        "message_id",
        "tool_parser",
        "reasoning_parser",
        "forced_tool",
    }
)
_SECRET_PREFIX = "[redacted sha256:"
_FINGERPRINT_PREFIXES = ("[text sha256:", "[bytes sha256:")
_MAX_OPEN_STREAMS = 10_000  # per-request line state kept for streams that never complete


def fingerprint(text: str) -> str:
    """`[text sha256:<12 hex> len=<characters>]`."""
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"[text sha256:{digest} len={len(text)}]"


def fingerprint_bytes(data: bytes) -> str:
    """`[bytes sha256:<12 hex> len=<bytes>]`."""
    return f"[bytes sha256:{hashlib.sha256(data).hexdigest()[:12]} len={len(data)}]"


def scrub(value: Any, empty: bool, key: str | None = None) -> Any:
    """`value` with every content string fingerprinted (or emptied, `empty=True`); see the
    module docstring. Strings in a list count as being under the list's key."""
    if isinstance(value, str):
        if key in _KEEP or value.startswith(_SECRET_PREFIX) or value.startswith(_FINGERPRINT_PREFIXES):
            return value
        return "" if empty else fingerprint(value)
    if isinstance(value, dict):
        return {k: scrub(v, empty, k) for k, v in value.items()}
    if isinstance(value, list):
        return [scrub(v, empty, key) for v in value]
    return value


def _dumps(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS).decode()


def redact_json_text(text: str) -> str | None:
    """A JSON document with its content fingerprinted, or None when `text` is not JSON."""
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError:
        return None
    return _dumps(scrub(value, empty=False))


def redact_sse_line(line: str) -> str:
    """One SSE line (without its newline; a trailing CR is kept) in redacted form."""
    body, cr = (line[:-1], "\r") if line.endswith("\r") else (line, "")
    if not body or body.startswith("event:"):
        return line
    if body.startswith("data:"):
        data = body[5:].lstrip(" ")
        redacted = redact_json_text(data) if data else ""
        return f"data: {redacted if redacted is not None else fingerprint(data)}{cr}"
    return fingerprint(body) + cr


def redact_payload(text: str) -> str:
    """A whole payload (a JSON body, or SSE text): JSON scrubbed, SSE line by line, anything
    else one fingerprint."""
    redacted = redact_json_text(text)
    if redacted is not None:
        return redacted
    if "data:" in text or "event:" in text:
        return "\n".join(redact_sse_line(line) for line in text.split("\n"))
    return fingerprint(text)


def _redact_piece(data: str, encoding: str) -> str:
    if encoding == "base64":
        try:
            return fingerprint_bytes(base64.b64decode(data))
        except ValueError:
            return fingerprint(data)
    return redact_payload(data)


class BodyFilter:
    """Applies one `--journal-bodies` mode to events, in order, per request (stateful only
    for relayed SSE chunks in `redacted` mode)."""

    def __init__(self, mode: str = "full") -> None:
        if mode not in MODES:
            raise ValueError(f"journal bodies mode must be one of {', '.join(MODES)}, not {mode!r}")
        self.mode = mode
        self._tails: OrderedDict[str, str] = OrderedDict()  # request id -> unfinished SSE line

    def __call__(self, request_id: str, event: Event) -> Event:
        if self.mode == "full":
            return event
        if isinstance(event, Completed):
            self._tails.pop(request_id, None)
            return event
        empty = self.mode == "none"
        if isinstance(event, Block):
            return replace(event, event=scrub(event.event, empty))
        if isinstance(event, Upstream):
            return self._upstream(request_id, event, empty)
        if isinstance(event, Tokens):
            ids = [] if empty else [-1] * len(event.ids)
            stop = event.matched_stop
            if isinstance(stop, str):
                stop = None if empty else fingerprint(stop)
            return replace(event, ids=ids, matched_stop=stop)
        if isinstance(event, Received):
            if event.body is None:
                return event
            return replace(event, body=None if empty else redact_payload(event.body))
        if isinstance(event, Rendered):
            return replace(event, settings=scrub(event.settings, empty), constraint=scrub(event.constraint, empty))
        if isinstance(event, ModelCall):
            return replace(event, request=scrub(event.request, empty), added=scrub(event.added, empty))
        if isinstance(event, ModelResult):
            if event.data is None:
                return event
            data = None if empty else _redact_piece(event.data, event.encoding)
            return replace(event, data=data, encoding="utf-8")
        if isinstance(event, McpCall):
            return replace(event, input=scrub(event.input, empty))
        if isinstance(event, McpResult):
            return replace(event, content="" if empty else fingerprint(event.content))
        return event

    def _upstream(self, request_id: str, event: Upstream, empty: bool) -> Upstream:
        if event.part == "head" or event.data is None:
            return event
        if empty:
            return replace(event, data=None, encoding="utf-8")
        if event.part != "chunk" or event.encoding != "utf-8":
            return replace(event, data=_redact_piece(event.data, event.encoding), encoding="utf-8")
        text = self._tails.pop(request_id, "") + event.data
        cut = text.rfind("\n") + 1
        if cut < len(text):
            self._tails[request_id] = text[cut:]
            while len(self._tails) > _MAX_OPEN_STREAMS:
                self._tails.popitem(last=False)
        lines = text[:cut].split("\n")[:-1]
        return replace(event, data="".join(redact_sse_line(line) + "\n" for line in lines))
