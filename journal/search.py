"""The journal's search index: the fields operators filter on, and a full-text index.

Two parts, kept by the writer: the columns in the transaction that writes a request's summary
row, the text a little later (below):

* Columns of `requests` (`COLUMNS`), derived from what every request already journals, so
  they fill whatever the gateway adds later: `trace_id` (the `received` event's own, the
  gateway's span's under `--enable-trace`, else the W3C `traceparent` header's),
  `user_id` (the body's `metadata.user_id`), `session_id` (Claude Code's
  `x-claude-code-session-id` header, or `x-session-id`), `key_fp` (the 12-hex fingerprint the
  redaction left of the caller's key), `thread_key` (the session id, else a digest of the
  conversation's start: system prompt and first message, so every turn of one conversation
  shares it; each string counts by its first `THREAD_KEY_CHARS` characters), `turns`
  (messages in the request), `hung_up` (the client went away before the end) and
  `cut_mid_stream` (a stream that had started and did not reach `message_stop`).
  Each is indexed (v6, `journal.schema`): `user_id` and `key_fp` with `ts`, so a filter on
  one reads its matches in time order and a page stops after its rows; the columns whose
  values only a few requests share (`KEYED`: a trace, a session, a conversation, the client's
  request id) by bucket of arrival first, `(rk >> BUCKET_BITS, column)`: `prune` deletes the
  oldest requests, whose entries then lie together at the front of the index instead of one
  per page all over it. `keyed` is how a lookup reaches them: one probe per bucket.
* `request_text`, an FTS5 table (unicode61 tokenizer) whose rowid is the request's rowid in
  `requests`: one row per completed request holding what the request added (the text of its
  last message; the system prompt too on a first turn), the response text (text, thinking and
  tool input deltas, relayed bodies and SSE) and error messages, at most `TEXT_LIMIT`
  characters. Only the last message is indexed because a conversation resends its history on
  every turn: the text of an earlier turn is found in the request that added it (and
  `smg journal thread` walks the rest). A request's text is staged (`stage_text`) when its
  `completed` event is written and indexed with the others staged about once a second
  (`index_staged`, by the writer); one still in flight is not found by text yet.

`fold` is called for every event by `journal.summary.apply`, `text_rows` once per writer batch,
`stage_text` once per transaction and `index_staged` when the writer indexes. `migrate` is the
schema step that adds all of this and fills it in for the requests already in the file.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
from typing import Any

import orjson

from journal import packed
from journal.events import Block, Completed, Error, Event, Received, Rejected, Upstream, Validated, event_from_dict

COLUMNS: tuple[str, ...] = (
    "trace_id",
    "user_id",
    "session_id",
    "key_fp",
    "thread_key",
    "turns",
    "hung_up",
    "cut_mid_stream",
)
"""The summary columns this module adds to `requests`, in table order."""
FLAGS: tuple[str, ...] = ("hung_up", "cut_mid_stream")
"""Of those, the 0/1 columns."""
FIRST_WINS: tuple[str, ...] = ("trace_id", "user_id", "session_id", "key_fp", "thread_key", "turns")
"""Of those, the columns set from `received` (the first value written stays)."""
TABLE = "request_text"
STAGED_TABLE = "request_text_staged"
"""Texts of completed requests not in `TABLE` yet (`stage_text`, `index_staged`)."""
TEXT_LIMIT = 64 * 1024
THREAD_KEY_CHARS = 1 << 20
"""The digest of a conversation's start takes each of its strings' first million characters:
every turn still shares it, and the writer does not serialize a prompt of megabytes again."""

KEYED: tuple[str, ...] = ("trace_id", "session_id", "thread_key", "client_id")
"""The columns indexed by bucket of arrival first (see the module docstring)."""
BUCKET_BITS = 13
"""A bucket is 8,192 consecutive integer keys (`rk`): a lookup probes about 120 of them at 1M requests."""
_BUCKETS = (
    f"WITH RECURSIVE bucket(b) AS (SELECT (SELECT min(rk) FROM requests) >> {BUCKET_BITS}"
    f" UNION ALL SELECT b + 1 FROM bucket WHERE b < (SELECT max(rk) FROM requests) >> {BUCKET_BITS})"
    " SELECT b FROM bucket"
)

SESSION_HEADERS = ("x-claude-code-session-id", "x-session-id")
_KEY_HEADERS = ("x-api-key", "authorization")
_REDACTED = "[redacted sha256:"
# Private keys of the summary dict (never columns): the text gathered so far, the SSE line
# a relayed chunk ended in the middle of, whether the stream started and reached its end.
_TEXT, _SIZE, _SSE, _STARTED, _STOPPED = "_text", "_text_size", "_sse", "_started", "_stopped"
_SSE_PARTS, _SSE_SIZE = "_sse_parts", "_sse_size"
# A large `received` body waiting for the request's `validated` event (see `AS_RECEIVED`).
_PENDING_BODY = "_pending_body"
AS_RECEIVED = "_as_received"
"""Set by the journal writer in a request's summary dict before it folds the `received` event
when the body it stores is the very text received (no secret redacted, `--journal-bodies full`):
a body over `PARSED_ELSEWHERE_CHARS` is then not parsed again, its columns and text are taken
from the `validated` event's `parsed_body` (validation parsed the same text), or parsed when
the request is refused or ends without one."""
PARSED_ELSEWHERE_CHARS = 1 << 20
_SSE_DRAIN = 256 * 1024  # gathered SSE characters read at once at most
_DELTA_KEYS = ("text", "thinking", "partial_json")
# The SSE events other than deltas that `fold` takes anything from.
_SSE_MARKERS = ('"content_block_start"', '"message_stop"', '"error"')


def migrate(conn: sqlite3.Connection, progress: Callable[[int, int], None] | None = None) -> None:
    """The schema step: the columns, their indexes, the text table, filled in from the events
    of the requests already in the file (runs inside the transaction `schema.migrate` opens)."""
    for column in COLUMNS:
        kind = "INTEGER" if column in (*FLAGS, "turns") else "TEXT"
        default = " NOT NULL DEFAULT 0" if column in FLAGS else ""
        conn.execute(f"ALTER TABLE requests ADD COLUMN {column} {kind}{default}")
    for column in ("trace_id", "user_id", "session_id", "key_fp", "thread_key"):
        conn.execute(f"CREATE INDEX requests_{column}_ts ON requests ({column}, ts)")
    for column in FLAGS:
        conn.execute(f"CREATE INDEX requests_{column}_ts ON requests (ts) WHERE {column} = 1")
    conn.execute(f"CREATE VIRTUAL TABLE {TABLE} USING fts5(body, tokenize='unicode61 remove_diacritics 2')")
    _backfill(conn)


def _backfill(conn: sqlite3.Connection) -> None:
    kinds = f"('received', 'block', 'upstream', 'error', 'rejected', 'completed', '{packed.RUN_KIND}')"
    last = -1
    while True:
        batch = conn.execute(
            "SELECT rowid, id, completed, stream FROM requests WHERE rowid > ? ORDER BY rowid LIMIT 1000", (last,)
        ).fetchall()
        if not batch:
            return
        last = batch[-1][0]
        updates: list[tuple[Any, ...]] = []
        texts: list[tuple[int, str]] = []
        for rowid, request_id, completed, stream in batch:
            row: dict[str, Any] = {"stream": stream}
            # v4 keys events by the request's integer key (its rowid) and packs streaming runs.
            events = conn.execute(
                f"SELECT seq, kind, t, data FROM events WHERE rk = ? AND kind IN {kinds} ORDER BY seq", (rowid,)
            )
            for seq, kind, t, data in events:
                try:
                    if kind == packed.RUN_KIND:
                        for _, inner, inner_t, payload in packed.unpack(seq, t, data):
                            fold(row, event_from_dict(inner, payload, inner_t))
                    else:
                        fold(row, event_from_dict(kind, orjson.loads(data), t))
                except Exception:  # an event an older smg wrote that this one cannot read
                    continue
            updates.append((*(row.get(c, 0) if c in FLAGS else row.get(c) for c in COLUMNS), rowid))
            if completed:
                texts.append((rowid, text_of(row)))
        sets = ", ".join(f"{c} = ?" for c in COLUMNS)
        conn.executemany(f"UPDATE requests SET {sets} WHERE rowid = ?", updates)
        conn.executemany(f"INSERT INTO {TABLE} (rowid, body) VALUES (?, ?)", [t for t in texts if t[1]])


# -- folding events ---------------------------------------------------------------------


def fold(row: dict[str, Any], event: Event) -> None:
    """Fold one event into a summary dict: this module's columns and the text gathered."""
    if isinstance(event, Block):
        payload = event.event
        kind = payload.get("type")
        row[_STARTED] = True
        if kind == "content_block_delta":
            delta = payload.get("delta") or {}
            for key in _DELTA_KEYS:
                value = delta.get(key)
                if isinstance(value, str):
                    _add(row, value)
        elif kind == "content_block_start":
            block = payload.get("content_block") or {}
            if isinstance(block.get("name"), str):
                _add(row, block["name"])
        elif kind == "message_stop":
            row[_STOPPED] = True
        elif kind == "error":
            error = payload.get("error") or {}
            _add(row, str(error.get("message") or ""))
    elif isinstance(event, Upstream):
        _fold_upstream(row, event)
    elif isinstance(event, Received):
        _fold_received(row, event)
    elif isinstance(event, Validated):
        if (pending := row.pop(_PENDING_BODY, None)) is not None:
            text, session = pending
            _fold_body(row, _parsed(row, text) if event.parsed_body is None else event.parsed_body, session)
    elif isinstance(event, Error | Rejected):
        _settle_pending(row)
        _add(row, event.message)
    elif isinstance(event, Completed):
        _settle_pending(row)
        _drain_sse(row)
        if event.disconnected:
            row["hung_up"] = 1
        if row.get(_STARTED) and not row.get(_STOPPED) and row.get("stream"):
            row["cut_mid_stream"] = 1


def _fold_received(row: dict[str, Any], event: Received) -> None:
    headers = {k.lower(): v for k, v in event.headers.items()}
    trace = _trace_id(f"00-{event.trace_id}-0000000000000001-01" if event.trace_id else headers.get("traceparent"))
    if trace:
        row["trace_id"] = trace
    session = next((headers[h] for h in SESSION_HEADERS if headers.get(h)), None)
    if session:
        row["session_id"] = session
    for name in _KEY_HEADERS:
        value = headers.get(name, "")
        if value.startswith(_REDACTED) and value.endswith("]"):
            row["key_fp"] = value[len(_REDACTED) : -1]
            break
    as_received = row.pop(AS_RECEIVED, False)
    if as_received and event.body and len(event.body) > PARSED_ELSEWHERE_CHARS:
        row[_PENDING_BODY] = (event.body, session)
        return
    _fold_body(row, _parsed(row, event.body) if event.body else None, session)


def _parsed(row: dict[str, Any], text: str) -> Any:
    """A `received` body parsed; None (and its text indexed as it is) when it is not JSON."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        _add(row, text)
        return None


def _settle_pending(row: dict[str, Any]) -> None:
    """A large body whose request ended without a `validated` event: parsed after all."""
    if (pending := row.pop(_PENDING_BODY, None)) is not None:
        text, session = pending
        _fold_body(row, _parsed(row, text), session)


def _fold_body(row: dict[str, Any], body: Any, session: str | None) -> None:
    if not isinstance(body, dict):
        if session:
            row["thread_key"] = f"s:{session}"
        return
    metadata = body.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        row["user_id"] = metadata["user_id"]
    messages = body.get("messages")
    messages = messages if isinstance(messages, list) else []
    row["turns"] = len(messages)
    if session:
        row["thread_key"] = f"s:{session}"
    elif messages:
        system = body.get("system")
        system = [{"type": "text", "text": system}] if isinstance(system, str) else system
        start = orjson.dumps(comparable([system, messages[0]], THREAD_KEY_CHARS), option=orjson.OPT_SORT_KEYS)
        row["thread_key"] = "h:" + hashlib.sha256(start).hexdigest()[:16]
    if len(messages) <= 1:
        _add(row, " ".join(_texts(body.get("system"))))
    if messages:
        _add(row, " ".join(_texts(messages[-1])))


def comparable(value: Any, cap: int | None = None) -> Any:
    """A message as compared across turns: without `cache_control`, and a string content as the
    one text block it means (Claude Code sends a message as a block list while it carries a cache
    breakpoint, as a string once the breakpoint has moved on). `cap`: every string cut to that
    many characters."""
    if isinstance(value, dict):
        if "role" in value and isinstance(value.get("content"), str):
            value = {**value, "content": [{"type": "text", "text": value["content"]}]}
        return {k: comparable(v, cap) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [comparable(v, cap) for v in value]
    if cap is not None and isinstance(value, str) and len(value) > cap:
        return value[:cap]
    return value


def _trace_id(traceparent: str | None) -> str | None:
    """The trace id of a W3C `traceparent` (`00-<32 hex>-<16 hex>-<2 hex>`), lower case."""
    if not traceparent:
        return None
    parts = traceparent.strip().split("-")
    if len(parts) < 4 or len(parts[1]) != 32:
        return None
    trace = parts[1].lower()
    if trace == "0" * 32 or any(c not in "0123456789abcdef" for c in trace):
        return None
    return trace


def _texts(value: Any) -> list[str]:
    """Every string a message (or a system prompt, a content block) holds as text."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [t for item in value for t in _texts(item)]
    if isinstance(value, dict):
        out: list[str] = []
        for key in ("text", "content", "thinking", "name"):
            if key in value:
                out.extend(_texts(value[key]))
        if isinstance(value.get("input"), dict):
            out.append(orjson.dumps(value["input"]).decode())
        return out
    return []


def _fold_upstream(row: dict[str, Any], event: Upstream) -> None:
    if event.part not in ("body", "chunk") or not event.data or event.encoding != "utf-8":
        return
    row[_STARTED] = True
    if event.part == "body":
        body = event.parsed
        if body is None:
            try:
                body = orjson.loads(event.data)
            except orjson.JSONDecodeError:
                _add(row, event.data)
                return
        if isinstance(body, dict):
            _add(row, " ".join(_texts(body.get("content"))))
            error = body.get("error")
            if isinstance(error, dict):
                _add(row, str(error.get("message") or ""))
            if body.get("type") == "message":
                row[_STOPPED] = True
        return
    # SSE chunks are gathered as they come and read in one pass when the request completes
    # (or the gathered text grows large): far cheaper than splitting every chunk on its own.
    parts = row.get(_SSE_PARTS)
    if parts is None:
        parts = row[_SSE_PARTS] = []
        row[_SSE_SIZE] = 0
    parts.append(event.data)
    row[_SSE_SIZE] += len(event.data)
    if row[_SSE_SIZE] > _SSE_DRAIN:
        _drain_sse(row)


def _drain_sse(row: dict[str, Any]) -> None:
    """Read the SSE gathered so far: only whole `data:` lines (a line cut between two chunks
    waits for the rest)."""
    parts = row.pop(_SSE_PARTS, None)
    if not parts:
        return
    row[_SSE_SIZE] = 0
    lines = (row.pop(_SSE, "") + "".join(parts)).split("\n")
    row[_SSE] = lines[-1][-TEXT_LIMIT:]
    # Once per stream, over every delta it carried: the text is gathered in locals (`_add`'s
    # rules, inlined) and written back around anything else.
    pieces: list[str] | None = row.get(_TEXT)
    size = row.get(_SIZE, 0)
    for line in lines[:-1]:
        if not line.startswith("data:"):
            continue
        line = line[5:]
        # Most lines of a stream are deltas: read those straight into the text, and skip the
        # ones that add nothing (message_start/delta, ping, block stops) without parsing them.
        if '"content_block_delta"' in line:
            if size >= TEXT_LIMIT:
                continue
            try:
                delta = orjson.loads(line).get("delta")
            except (orjson.JSONDecodeError, AttributeError):
                continue
            if isinstance(delta, dict):
                for key in _DELTA_KEYS:
                    value = delta.get(key)
                    if value and isinstance(value, str) and size < TEXT_LIMIT:
                        piece = value[: TEXT_LIMIT - size]
                        if pieces is None:
                            pieces = row[_TEXT] = []
                        pieces.append(piece)
                        size += len(piece) + 1
            continue
        if not any(marker in line for marker in _SSE_MARKERS):
            continue
        try:
            payload = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(payload, dict):
            if size:
                row[_SIZE] = size
            fold(row, Block(event=payload))
            pieces, size = row.get(_TEXT), row.get(_SIZE, 0)
    if size:
        row[_SIZE] = size


def _add(row: dict[str, Any], text: str) -> None:
    size = row.get(_SIZE, 0)
    if not text or size >= TEXT_LIMIT:
        return
    piece = text[: TEXT_LIMIT - size]
    row.setdefault(_TEXT, []).append(piece)
    row[_SIZE] = size + len(piece) + 1


def text_of(row: dict[str, Any]) -> str:
    """The text gathered for a request (what its `request_text` row holds); text UTF-8
    cannot hold (lone surrogates) spelled as escapes, as the writer stores it."""
    _drain_sse(row)
    text = "\n".join(row.get(_TEXT, ()))
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


# -- the writer's part ------------------------------------------------------------------


def text_rows(finished: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """`(text, request id)` for the requests of a batch that completed in it."""
    out = []
    for row in finished:
        text = text_of(row)
        if text:
            out.append((text, row["id"]))
    return out


def write_text(conn: sqlite3.Connection, rows: list[tuple[int, str]]) -> None:
    """Index `(rowid, text)` rows, the rowid of each one's summary row. Given as values: FTS5
    takes an `INSERT … SELECT` four times slower than the same rows bound one by one."""
    if rows:
        conn.executemany(f"INSERT OR REPLACE INTO {TABLE} (rowid, body) VALUES (?, ?)", rows)


def create_staging(conn: sqlite3.Connection, progress: Callable[[int, int], None] | None = None) -> None:
    """The schema step (v9) that adds `STAGED_TABLE`."""
    conn.execute(f"CREATE TABLE IF NOT EXISTS {STAGED_TABLE} (rk INTEGER PRIMARY KEY, body TEXT NOT NULL)")


def stage_text(conn: sqlite3.Connection, rows: list[tuple[int, str]]) -> None:
    """Keep the text of requests completed in this transaction for the next `index_staged`.

    FTS5 writes a segment of its index per transaction that inserts into it (and merges them
    later): a commit every few milliseconds that indexed its few requests paid that each time.
    A plain table's row costs a fraction of it, and the text index takes a second's worth at once."""
    if rows:
        conn.executemany(f"INSERT OR REPLACE INTO {STAGED_TABLE} (rk, body) VALUES (?, ?)", rows)


def index_staged(conn: sqlite3.Connection) -> int:
    """Move the staged texts into the text index (in the caller's transaction); how many.
    A text whose request was pruned meanwhile is dropped with it."""
    rows = conn.execute(f"SELECT s.rk, s.body FROM {STAGED_TABLE} AS s JOIN requests AS r ON r.rk = s.rk").fetchall()
    write_text(conn, rows)
    conn.execute(f"DELETE FROM {STAGED_TABLE}")
    return len(rows)


def keyed(condition: str) -> str:
    """SQL over `requests`: the rows for which `condition` (over one `KEYED` column, which it
    must name with `IS NOT NULL` or a comparison) holds, looked up in that column's index one
    bucket at a time. The buckets are the file's, from its lowest key to its highest, read
    when the query runs (a query compiled once and run again sees requests added since).
    Being a set of keys, it is also what a query is driven from: the few matches are fetched
    and sorted, rather than the time index walked in the hope of meeting them."""
    return f"rk IN (SELECT rk FROM requests WHERE (rk >> {BUCKET_BITS}) IN ({_BUCKETS}) AND {condition})"


def has_index(conn: sqlite3.Connection) -> bool:
    """Whether the file has the text index (a file written before it was added has not)."""
    return _has_table(conn, TABLE)


def has_staging(conn: sqlite3.Connection) -> bool:
    """Whether the file has `STAGED_TABLE` (schema v9 and later)."""
    return _has_table(conn, STAGED_TABLE)


def _has_table(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone() is not None


def match_expression(text: str, *, prefix: bool) -> str | None:
    """`text` as an FTS5 query: its words as one phrase (the last a prefix when `prefix`);
    None when it has no word the tokenizer would index."""
    if not any(c.isalnum() for c in text):
        return None
    phrase = '"' + text.replace('"', '""') + '"'
    return phrase + "*" if prefix else phrase
