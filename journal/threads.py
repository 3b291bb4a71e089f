"""Conversations across requests, and a structural diff of two requests' bodies.

A conversation is the requests sharing a `thread_key` (`journal.search`): the Claude Code
session header when the client sent one, else a digest of the conversation's start (system
prompt and first message), which every later turn resends. `thread` lists them oldest first
and says what each turn added to the history an earlier one sent: the new messages beyond the
longest earlier history this one extends, else that the history was rewritten (a client
that compacts or edits its context). `cache_control` markers are left out of the comparison,
and a string content counts as its one text block: Claude Code moves its cache breakpoints to
the newest messages on every turn, rewriting the older ones from block lists to strings.

`json_diff` compares two JSON values path by path (`messages[3].content[0].text`), the way
`replay.diff` compares two responses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from journal.events import Received
from journal.search import comparable
from journal.store import JournalStore

_PREVIEW = 80


@dataclass(frozen=True)
class Turn:
    """One request of a conversation."""

    row: dict[str, Any]
    messages: int
    added: list[dict[str, Any]]  # the messages this turn added (all of them when `rewritten`)
    rewritten: bool  # no earlier turn's history is a prefix of this one's

    @property
    def id(self) -> str:
        return str(self.row["id"])

    def summary(self) -> str:
        """What the turn added, in one line."""
        if not self.added:
            return "(no new message)"
        last = self.added[-1]
        head = f"+{len(self.added)} message{'s' if len(self.added) != 1 else ''}"
        if self.rewritten:
            head = f"history rewritten ({self.messages} messages)"
        return f"{head}; {last.get('role', '?')}: {preview(last.get('content'))}"


def preview(content: Any, limit: int = _PREVIEW) -> str:
    """A message's content as one short line of text."""
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for block in content:
            if not isinstance(block, dict):
                continue
            kind = block.get("type")
            if kind == "text":
                parts.append(str(block.get("text", "")))
            elif kind in ("tool_use", "server_tool_use"):
                parts.append(f"[tool_use {block.get('name')}]")
            elif kind == "tool_result":
                parts.append(f"[tool_result {preview(block.get('content'), 30)}]")
            else:
                parts.append(f"[{kind}]")
        text = " ".join(parts)
    else:
        text = "" if content is None else str(content)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def request_body(reader: JournalStore, request_id: str) -> Any:
    """The parsed body of a request's `received` event (None when there is none, or it is not JSON)."""
    received = next((e for _, e in reader.events(request_id) if isinstance(e, Received)), None)
    if received is None:
        return None
    body = received.body
    if not isinstance(body, str):
        return None
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError:
        return None


def thread(reader: JournalStore, request_id: str, limit: int = 500) -> list[Turn] | None:
    """The conversation `request_id` belongs to, oldest first (at most `limit` turns); None
    when the request has no conversation key (no messages, or a file without the column)."""
    row = reader.get_request(request_id)
    if row is None or not row.get("thread_key"):
        return None
    rows = reader.thread_ids(row["thread_key"], limit)
    turns: list[Turn] = []
    earlier: list[list[Any]] = []  # the histories sent so far
    for rid in rows:
        summary = reader.get_request(rid)
        if summary is None:
            continue
        body = request_body(reader, rid)
        messages = body.get("messages") if isinstance(body, dict) else None
        messages = messages if isinstance(messages, list) else []
        plain = [comparable(m) for m in messages]
        # The turn this one continues: the longest history sent before that this one extends
        # (a session also carries side requests, a title or a summary, with histories of their own).
        base = max((len(h) for h in earlier if len(h) <= len(plain) and plain[: len(h)] == h), default=None)
        rewritten = base is None and bool(earlier)
        added = messages[base or 0 :]
        turns.append(Turn(summary, len(messages), [m for m in added if isinstance(m, dict)], rewritten))
        earlier.append(plain)
    return turns


def json_diff(left: Any, right: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """`(path, left, right)` for every leaf where two JSON values differ; a key or list item
    only one side has is reported with None on the other (a list's length too)."""
    out: list[tuple[str, Any, Any]] = []
    if isinstance(left, dict) and isinstance(right, dict):
        for key in list(left) + [k for k in right if k not in left]:
            sub = f"{path}.{key}" if path else str(key)
            if key not in left or key not in right:
                out.append((sub, left.get(key), right.get(key)))
            else:
                out.extend(json_diff(left[key], right[key], sub))
    elif isinstance(left, list) and isinstance(right, list):
        for i, (x, y) in enumerate(zip(left, right, strict=False)):
            out.extend(json_diff(x, y, f"{path}[{i}]"))
        if len(left) != len(right):
            out.append((f"{path}.length" if path else "length", len(left), len(right)))
    elif left != right or type(left) is not type(right):
        out.append((path or "(value)", left, right))
    return out
