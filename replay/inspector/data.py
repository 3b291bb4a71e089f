"""What the inspector reads: pages of summary rows, one request's details, tokenizers.

`RequestSource` keeps the list a contiguous, newest-first prefix of the filtered result set,
so the next page is always at `offset = rows loaded`, and live refresh only asks for rows
newer than the newest one it has (`since_ts`), never the whole journal.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from journal.events import Error, Event, Received, Rejected, Rendered, Tokens, event_from_dict, event_kinds
from journal.query import QueryError, compile_query
from journal.reader import JournalError, JournalReader
from journal.store import JournalStore, open_journal
from smg.projection import Reconstructed, reconstruct

__all__ = ["QueryError", "RequestDetail", "RequestSource", "Search", "decode", "load_detail", "load_tokenizer"]

# A request whose summary row is committed a moment after a newer one's (the writer batches
# concurrent requests) still lands inside this window of the live poll.
_LATE_COMMIT_S = 2.0
# At most this many new rows are taken in one live poll; a bigger burst is announced instead.
FOLLOW_MAX = 2000


class RequestSource:
    """Paged, filtered access to the `requests` table.

    The rows handed out so far are always the first `loaded` rows of the filtered set,
    newest first: pages extend it at the old end, `newer` at the new end.
    """

    def __init__(self, reader: JournalStore, page_size: int = 100, follow_max: int = FOLLOW_MAX) -> None:
        if page_size < 1 or follow_max < 1:
            raise ValueError("page_size and follow_max must be positive")
        self.follow_max = follow_max
        self.reader = reader
        self.page_size = page_size
        self.query = ""
        self.has_more = True
        self._ts: dict[str, float] = {}  # id -> ts of every row handed out
        self.newest_ts: float | None = None
        self._looked = time.time()  # with nothing matching yet, only what arrives after this is new

    @property
    def loaded(self) -> int:
        return len(self._ts)

    def set_query(self, text: str) -> None:
        """Validate and adopt a filter and start over; raises `QueryError` (a message for the
        user) when the query is bad, leaving the current filter in place."""
        text = text.strip()
        compile_query(text)
        self.query = text
        self.reset()

    def reset(self) -> None:
        self._ts.clear()
        self.has_more = True
        self.newest_ts = None
        self._looked = time.time()

    def adopt(self, query: str, rows: list[dict[str, Any]], has_more: bool, looked: float) -> None:
        """Start over with a filter whose first page a `Search` read (at `looked`, wall clock)."""
        self.query = query
        self.reset()
        self._looked = looked
        self._take(rows)
        self.has_more = has_more

    def count(self) -> int:
        return self.reader.count(self.query)

    def next_page(self) -> list[dict[str, Any]]:
        """The next `page_size` rows after those loaded so far, newest first."""
        if not self.has_more:
            return []
        rows = self.reader.list_requests(self.page_size, query=self.query, offset=self.loaded, descending=True)
        self.has_more = len(rows) == self.page_size
        rows = [r for r in rows if r["id"] not in self._ts]
        self._take(rows)
        return rows

    def newer(self) -> tuple[list[dict[str, Any]], bool]:
        """Rows that arrived since the newest one handed out, oldest first.

        Returns `(rows, overflow)`: at most `follow_max` rows; `overflow` means more than
        that arrived, and the caller should offer to start over from the newest page rather
        than follow. With nothing matching so far, only rows that arrived since the last look
        are asked for (an index read), not the whole filter again.
        """
        if self.newest_ts is None:
            if self.loaded:
                return [], False
            now = time.time()
            since = self._looked - _LATE_COMMIT_S
            rows = self.reader.list_requests(self.follow_max + 1, query=self.query, descending=False, since_ts=since)
            if len(rows) > self.follow_max:
                return [], True
            self._looked = now
            self._take(rows)
            return rows, False
        since = self.newest_ts - _LATE_COMMIT_S
        in_window = sum(1 for ts in self._ts.values() if ts >= since)
        limit = self.follow_max + in_window + 1
        rows = self.reader.list_requests(limit, query=self.query, descending=False, since_ts=since)
        fresh = [r for r in rows if r["id"] not in self._ts]
        if len(fresh) > self.follow_max or len(rows) >= limit:
            return [], True
        self._take(fresh)
        return fresh, False

    def forget(self, ids: list[str]) -> None:
        """The caller dropped these rows (the oldest ones it had): they are the next page again."""
        for request_id in ids:
            self._ts.pop(request_id, None)
        if ids:
            self.has_more = True

    def _take(self, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            ts = float(row.get("ts") or 0.0)
            self._ts[row["id"]] = ts
            if self.newest_ts is None or ts > self.newest_ts:
                self.newest_ts = ts

    def refreshed(self, ids: list[str]) -> list[dict[str, Any]]:
        """The current summary rows of `ids` (requests still in flight when listed)."""
        out = []
        for request_id in ids:
            row = self.reader.get_request(request_id)
            if row is not None:
                out.append(row)
        return out


class Search:
    """A filter's first page and count, read on a connection of its own so that the caller can
    run it off the UI thread, watch its progress and cancel it."""

    def __init__(self, path: str | os.PathLike[str], query: str, page_size: int) -> None:
        compile_query(query)  # a bad query fails here, before any thread
        self.path = path
        self.query = query
        self.page_size = page_size
        self.steps = 0  # thousands of SQLite VM steps so far (a file's; the fleet journal's stay 0)
        self.cancelled = False
        self._reader: JournalStore | None = None

    def cancel(self) -> None:
        """Stop the search at its next step (`run` raises `sqlite3.OperationalError`, or
        `JournalError` from the fleet journal, whose query is interrupted)."""
        self.cancelled = True
        reader = self._reader
        if reader is not None and not isinstance(reader, JournalReader):
            reader.interrupt()

    def _tick(self) -> int:
        self.steps += 1
        return 1 if self.cancelled else 0

    def run(self) -> tuple[list[dict[str, Any]], int, bool, float]:
        """`(first page, count, has_more, when)`; blocking, for a worker thread."""
        looked = time.time()
        reader = open_journal(self.path)
        self._reader = reader
        try:
            if isinstance(reader, JournalReader):
                reader.connection.set_progress_handler(self._tick, 1000)
            elif self.cancelled:  # before there was a query to interrupt
                raise JournalError("search cancelled")
            rows, total = reader.page(self.page_size, query=self.query, descending=True)
        finally:
            self._reader = None
            reader.close()
        return rows, total, len(rows) == self.page_size, looked


@dataclass
class RequestDetail:
    """Everything the detail view shows about one request."""

    row: dict[str, Any]
    raw: list[tuple[int, str, float, dict[str, Any]]]
    events: list[Event]
    response: Reconstructed | None
    response_error: str | None = None
    seqs: list[int] = field(default_factory=list)

    @property
    def id(self) -> str:
        return str(self.row["id"])

    @property
    def received(self) -> Received | None:
        return next((e for e in self.events if isinstance(e, Received)), None)

    @property
    def rendered(self) -> Rendered | None:
        return next((e for e in self.events if isinstance(e, Rendered)), None)

    @property
    def bodies(self) -> str:
        """How much content the journal kept (`full`, `redacted`, `none`; see `journal.bodies`)."""
        return str(self.row.get("bodies") or "full")

    @property
    def is_grpc(self) -> bool:
        """Generated by the gateway from engine token ids (so it can be recomputed offline)."""
        return self.rendered is not None and any(isinstance(e, Tokens) for e in self.events)

    def tokens(self) -> list[tuple[int, Tokens]]:
        return [(seq, e) for seq, e in zip(self.seqs, self.events, strict=True) if isinstance(e, Tokens)]

    def errors(self) -> list[tuple[int, Error | Rejected]]:
        return [(seq, e) for seq, e in zip(self.seqs, self.events, strict=True) if isinstance(e, Error | Rejected)]


def load_detail(reader: JournalStore, request_id: str) -> RequestDetail | None:
    row = reader.get_request(request_id)
    if row is None:
        return None
    raw = reader.raw_events(row["id"])
    known = set(event_kinds())
    pairs = [(seq, event_from_dict(kind, data, t)) for seq, kind, t, data in raw if kind in known]
    events = [e for _, e in pairs]
    try:
        response: Reconstructed | None = reconstruct(events)
        why = None
    except Exception as exc:  # a projection bug must not hide the rest of the request
        response, why = None, f"reconstruct failed: {type(exc).__name__}: {exc}"
    return RequestDetail(row, raw, events, response, why, [seq for seq, _ in pairs])


# --- tokenizers ---------------------------------------------------------------------------

_tokenizer_errors: dict[str, str] = {}
_tokenizer_lock = threading.Lock()


def load_tokenizer(source: str | None) -> tuple[Any | None, str | None]:
    """The tokenizer a `rendered` event names, loaded once per source: `(tokenizer, None)`,
    or `(None, why)` when it cannot be loaded without the network."""
    if not source:
        return None, "the request names no tokenizer"
    with _tokenizer_lock:
        if source in _tokenizer_errors:
            return None, _tokenizer_errors[source]
        try:
            # Imported here: it brings in transformers, which the list does not need. Shared
            # with offline replay, so `r` reuses the tokenizer the Tokens tab loaded.
            from replay.offline import load_tokenizer as load_shared

            tokenizer = load_shared(_local_dir(source))
        except Exception as exc:  # any failure means ids only, never a crash
            why = f"tokenizer {source} unavailable: {type(exc).__name__}: {exc}"
            _tokenizer_errors[source] = why
            return None, why
        return tokenizer, None


def _local_dir(source: str) -> str:
    if Path(source).is_dir():
        return source
    # A hub id: only a copy already in the local cache, so inspecting never downloads.
    from huggingface_hub import snapshot_download

    return str(snapshot_download(source, local_files_only=True))


def decode(tokenizer: Any, ids: list[int]) -> str:
    try:
        return str(tokenizer.decode(ids, skip_special_tokens=False))
    except Exception as exc:  # an id outside the vocabulary, say
        return f"<decode failed: {exc}>"
