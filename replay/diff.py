"""A structural diff of two Messages responses.

Each side is given as the list of stream event payloads (the journal's `block` events), or as
an HTTP response (status, headers, body: JSON or SSE text), or as an already normalised
`Outcome`. Both are folded into the same shape — status, error type and code, the message's
content blocks, stop reason, stop sequence and usage — and compared field by field. What is
compared:

- always: status, `error.type`, `error.code` (the gateway's `x-smg-error-code`), model, the
  kinds of the content blocks in order, tool names, `stop_reason`, `stop_sequence`, usage;
- with `text=True` (a deterministic run): the text, thinking and tool input of each block;
- with `exact=True`: ids too (the message id, tool_use ids) and thinking signatures.

The result is a list of `Difference(path, left, right)`; `render` shows it as a rich table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import orjson
from rich.table import Table
from rich.text import Text

from smg.protocol.fold import BlockFold

_TOOL_BLOCKS = frozenset({"tool_use", "server_tool_use", "mcp_tool_use"})
_CLIP = 300


@dataclass(frozen=True)
class Difference:
    """`path` names the field (`content[1].text`, `usage.output_tokens`, `events[7]`)."""

    path: str
    left: Any
    right: Any


@runtime_checkable
class HttpLike(Protocol):
    """What `smg.projection.Reconstructed` and a replayed response both have."""

    @property
    def status(self) -> int | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def body(self) -> bytes: ...


@dataclass
class Outcome:
    """A response folded into the fields the diff compares."""

    status: int | None
    error_type: str | None = None
    error_code: str | None = None
    message: dict[str, Any] | None = None  # id, model, content, stop_reason, stop_sequence, usage
    other: dict[str, Any] | None = None  # a JSON body that is neither a message nor an error
    events: list[dict[str, Any]] = field(default_factory=list)  # the stream events, when streamed


Side = Outcome | Sequence[dict[str, Any]] | HttpLike


def from_events(events: Sequence[dict[str, Any]], status: int | None = 200) -> Outcome:
    """A streamed answer (or the journal's block payloads), folded as a client SDK folds it."""
    out = Outcome(status=status, events=list(events))
    fold = BlockFold()
    message: dict[str, Any] | None = None
    for event in events:
        kind = event.get("type")
        if kind == "message_start" and isinstance(event.get("message"), dict):
            message = dict(event["message"], content=[])
        elif kind == "message_delta" and message is not None:
            delta = event.get("delta") or {}
            message["stop_reason"] = delta.get("stop_reason")
            message["stop_sequence"] = delta.get("stop_sequence")
            message["usage"] = {**(message.get("usage") or {}), **(event.get("usage") or {})}
        elif kind == "error":
            error = event.get("error") or {}
            out.error_type = error.get("type")
        else:
            fold.feed(event)
    if message is not None:
        message["content"] = fold.content()
    out.message = message
    return out


def from_http(status: int | None, headers: Mapping[str, str], body: bytes) -> Outcome:
    """An HTTP response as received: a JSON body or an SSE stream."""
    lowered = {k.lower(): v for k, v in headers.items()}
    code = lowered.get("x-smg-error-code")
    if "text/event-stream" in lowered.get("content-type", ""):
        out = from_events(parse_sse(body), status)
        out.error_code = code
        return out
    out = Outcome(status=status, error_code=code)
    try:
        data = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        data = None
    if not isinstance(data, dict):
        if body:
            out.other = {"body": body.decode("utf-8", "replace")}
        return out
    if data.get("type") == "error":
        error = data.get("error") or {}
        out.error_type = error.get("type") if isinstance(error, dict) else None
    elif data.get("type") == "message":
        out.message = data
    else:
        out.other = data
    return out


def parse_sse(body: bytes | str) -> list[dict[str, Any]]:
    """The JSON payloads of an SSE body's `data:` lines, frame by frame (`ping`s included)."""
    text = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
    events: list[dict[str, Any]] = []
    for frame in text.replace("\r\n", "\n").split("\n\n"):
        data = "\n".join(line[5:].lstrip(" ") for line in frame.split("\n") if line.startswith("data:"))
        if not data:
            continue
        try:
            payload = orjson.loads(data)
        except orjson.JSONDecodeError:
            continue
        if isinstance(payload, dict):
            events.append(payload)
    return events


def as_outcome(side: Side) -> Outcome:
    if isinstance(side, Outcome):
        return side
    if isinstance(side, HttpLike):
        return from_http(side.status, side.headers, side.body)
    return from_events(list(side))


def deterministic(body: Any) -> bool:
    """Whether the request asked for greedy decoding (`temperature: 0` or `top_k: 1`), so its
    text can be expected to come out the same again."""
    if not isinstance(body, Mapping):
        return False
    return body.get("temperature") == 0 or body.get("top_k") == 1


def diff(left: Side, right: Side, *, text: bool = True, exact: bool = False) -> list[Difference]:
    """The differences between two responses (see the module docstring for what counts)."""
    a, b = as_outcome(left), as_outcome(right)
    out: list[Difference] = []

    def cmp(path: str, x: Any, y: Any) -> None:
        if x != y:
            out.append(Difference(path, x, y))

    cmp("status", a.status, b.status)
    cmp("error.type", a.error_type, b.error_type)
    cmp("error.code", a.error_code, b.error_code)
    ma, mb = a.message, b.message
    if ma is None or mb is None:
        cmp("message", _kinds(ma), _kinds(mb))
    else:
        _diff_messages(cmp, ma, mb, text=text, exact=exact)
    if a.other is not None or b.other is not None:
        oa, ob = a.other or {}, b.other or {}
        for key in sorted(set(oa) | set(ob)):
            cmp(key, oa.get(key), ob.get(key))
    return out


def _diff_messages(cmp: Any, a: dict[str, Any], b: dict[str, Any], *, text: bool, exact: bool) -> None:
    if exact:
        cmp("id", a.get("id"), b.get("id"))
    cmp("model", a.get("model"), b.get("model"))
    cmp("content.kinds", _kinds(a), _kinds(b))
    for i, (x, y) in enumerate(zip(_content(a), _content(b), strict=False)):
        kind = x.get("type")
        if kind != y.get("type"):
            continue  # already reported in content.kinds
        if kind in _TOOL_BLOCKS:
            cmp(f"content[{i}].name", x.get("name"), y.get("name"))
        if text:
            for key in ("text", "thinking", "input", "data"):
                if key in x or key in y:
                    cmp(f"content[{i}].{key}", x.get(key), y.get(key))
        if exact:
            for key in ("id", "signature"):
                if key in x or key in y:
                    cmp(f"content[{i}].{key}", x.get(key), y.get(key))
    cmp("stop_reason", a.get("stop_reason"), b.get("stop_reason"))
    cmp("stop_sequence", a.get("stop_sequence"), b.get("stop_sequence"))
    ua, ub = a.get("usage") or {}, b.get("usage") or {}
    for key in sorted(set(ua) | set(ub)):
        cmp(f"usage.{key}", ua.get(key), ub.get(key))


def _content(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [c for c in content if isinstance(c, dict)] if isinstance(content, list) else []


def _kinds(message: dict[str, Any] | None) -> list[str] | None:
    return None if message is None else [str(c.get("type")) for c in _content(message)]


def diff_blocks(left: Sequence[dict[str, Any]], right: Sequence[dict[str, Any]]) -> list[Difference]:
    """Two lists of block payloads that should be byte-identical: the structural differences
    (text and ids included), then the first event that differs, which pins down a difference
    the structure does not show (a delta cut in another place)."""
    out = diff(left, right, text=True, exact=True)
    for i, (x, y) in enumerate(zip(left, right, strict=False)):
        if orjson.dumps(x) != orjson.dumps(y):
            out.append(Difference(f"events[{i}]", x, y))
            break
    if len(left) != len(right):
        out.append(Difference("events.length", len(left), len(right)))
    return out


def render(
    differences: Sequence[Difference],
    *,
    left: str = "recorded",
    right: str = "replayed",
    title: str | None = None,
) -> Table:
    """The differences as a table: one row per field."""
    table = Table(title=title, title_justify="left", show_lines=True)
    table.add_column("field", style="bold", no_wrap=True)
    table.add_column(left, overflow="fold")
    table.add_column(right, overflow="fold")
    for d in differences:
        table.add_row(d.path, Text(_show(d.left), style="red"), Text(_show(d.right), style="green"))
    return table


def _show(value: Any) -> str:
    shown = orjson.dumps(value).decode()
    return shown if len(shown) <= _CLIP else shown[: _CLIP - 1] + "…"
