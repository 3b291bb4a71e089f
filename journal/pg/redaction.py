"""Old secrets never ship: the redaction by rule (`journal.redact`) applied again to each event
row that can hold a secret, on its way to PostgreSQL.

The writer redacts every event before it is stored, but a file written before redaction went
by rule (when only five headers were redacted) holds `x-goog-api-key`, `anthropic-api-key`,
URL userinfo and query tokens in clear, and the first install of a sink ships the file's whole
history. Redaction is idempotent, so applying it again to what the current writer stored
changes nothing. Only the rows that can hold a secret are parsed: `received` events (headers,
query, body), `validated` events with a summary, and `upstream` heads with headers, stored
one row each or inside a packed `run`; any other row goes as stored, byte for byte, and so
does a row the pass leaves unchanged.
"""

from __future__ import annotations

import json
from typing import Any

import orjson

from journal import packed
from journal.events import Validated, event_from_dict
from journal.redact import redact_body, redact_headers, redact_query, redacted

_FIELDS = {"received": ("headers", "query", "body"), "validated": ("summary",), "upstream": ("headers",)}
# Spelled so only in a payload's own JSON (inside a piece or a string a quote is escaped): a
# row without it cannot hold the field as a non-empty object.
_OBJECT_MARKS = {"validated": '"summary":{', "upstream": '"headers":{'}
_RUN_MARK = b'"headers":{'
KINDS = frozenset({*_FIELDS, packed.RUN_KIND})
"""The kinds of the rows that may hold a secret (any other row ships as stored)."""


def _redacted_payload(kind: str, payload: dict[str, Any], key: bytes | None) -> dict[str, Any] | None:
    """`payload` with its secrets redacted (fingerprints keyed with `key`), or None when it holds none."""
    changed: dict[str, Any] = {}
    headers = payload.get("headers")
    if isinstance(headers, dict) and headers:
        clean_headers = redact_headers(headers, key)
        if clean_headers != headers:
            changed["headers"] = clean_headers
    if kind == "received":
        query, body = payload.get("query"), payload.get("body")
        if isinstance(query, str) and query and (clean_query := redact_query(query, key)) != query:
            changed["query"] = clean_query
        if isinstance(body, str) and body and (clean_body := redact_body(body, key)) != body:
            changed["body"] = clean_body
    elif kind == "validated":
        summary = payload.get("summary")
        if isinstance(summary, dict) and summary:
            clean = redacted(Validated(model="", summary=summary), key)
            assert isinstance(clean, Validated)
            if clean.summary != summary:
                changed["summary"] = clean.summary
    return {**payload, **changed} if changed else None


def row_data(kind: str, t: float, data: str | bytes, key: bytes | None = None) -> str | bytes:
    """An event row's stored data with its secrets redacted, fingerprints keyed with `key` (the
    journal's, `journal.redact.read_secret`, as its writer keys them; the very same object when
    it holds none). Raises when the row cannot be read: such a row must not ship as it is."""
    if kind == packed.RUN_KIND:
        if not isinstance(data, bytes | memoryview) or _RUN_MARK not in data:
            return data
        return _run(t, bytes(data), data, key)
    fields = _FIELDS.get(kind)
    if fields is None:
        return data
    text = data if isinstance(data, str) else bytes(data).decode("utf-8", "surrogatepass")
    mark = _OBJECT_MARKS.get(kind)
    if mark is not None and mark not in text:
        return data
    payload = orjson.loads(text) if isinstance(data, str) else orjson.loads(data)
    clean = _redacted_payload(kind, payload, key)
    if clean is None:
        return data
    try:
        return orjson.dumps(clean, option=orjson.OPT_NON_STR_KEYS).decode()
    except TypeError:  # lone surrogates or a big integer, as the writer's own fallback
        return json.dumps(clean, ensure_ascii=False, separators=(",", ":"))


def _run(t0: float, data: bytes, original: str | bytes, key: bytes | None) -> str | bytes:
    from journal.writer import encode

    # The pieces spelled as JSON objects are the generic entries' payloads: only a run where
    # one of them holds headers to redact is unpacked and packed again.
    pieces = data[: data.index(b"\x00")].split(b"\x01")
    if not any(
        _RUN_MARK in piece and piece[:1] == b"{" and _redacted_payload("upstream", orjson.loads(piece), key) is not None
        for piece in pieces
    ):
        return original
    entries = packed.unpack(0, t0, data)
    changed = False
    for i, (seq, kind, t, payload) in enumerate(entries):
        if kind == "upstream" and payload.get("headers"):
            clean = _redacted_payload(kind, payload, key)
            if clean is not None:
                entries[i] = (seq, kind, t, clean)
                changed = True
    if not changed:
        return original
    return packed.pack([event_from_dict(kind, payload, t) for _, kind, t, payload in entries], t0, encode)
