"""The journal's write side: one writer task, a bounded queue, group commit.

Serving code calls `append` for every event. That is a `put_nowait` on an in-memory queue
(no I/O, no await on disk); a single writer task takes whatever has queued up, up to
`max_batch` events, writes them and the summary rows they touch in ONE transaction, commits,
and goes back for more. Under load a batch grows with the backlog, so the number of commits
per second stays small however many events arrive; when idle each event is committed on its
own almost at once. `append` only waits when the queue is full (backpressure instead of
unbounded memory).

Durability contract (WAL, `synchronous=NORMAL`):

* A committed batch survives a crash of the process (`kill -9`, OOM, segfault): the commit
  is in the WAL file, which the OS owns once written. Only an OS crash or power loss may
  roll back the last few committed batches (NORMAL does not fsync the WAL on each commit);
  the database is never corrupted either way.
* What a `kill -9` loses is what had not been committed yet: the events still in the queue
  and the batch being written, i.e. at most the current group-commit window (`queue_size`
  events in the worst case, typically the last few milliseconds). A request whose
  `completed` event was lost simply shows `completed = 0`.
* `flush()` returns once everything appended before it is committed; `close()` drains the
  queue and commits before closing.

Events are treated as immutable once appended: they are serialized later, by the writer
task. Secrets are redacted in `append`, before an event is queued (headers of `received` and
upstream `head` events, MCP tokens in the `received` body and the validated summary).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sqlite3
from typing import Any, Protocol

import aiosqlite
import orjson

from journal import schema, summary
from journal.events import Event
from journal.redact import redacted

log = logging.getLogger(__name__)

_STOP = object()
_MAX_INFLIGHT = 100_000  # summaries kept in memory for requests without `completed` yet

_INSERT_EVENT = "INSERT INTO events (request_id, seq, kind, t, data) VALUES (?, ?, ?, ?, ?)"
_FIRST_WINS = frozenset({"ts", "method", "path", "tenant", "replay_of", "ttfe_ms"})


def _upsert_sql() -> str:
    cols = schema.REQUEST_COLUMNS
    updates = []
    for col in cols[1:]:
        if col in schema.FLAG_COLUMNS:
            updates.append(f"{col} = MAX(requests.{col}, excluded.{col})")
        elif col in _FIRST_WINS:
            updates.append(f"{col} = COALESCE(requests.{col}, excluded.{col})")
        else:
            updates.append(f"{col} = COALESCE(excluded.{col}, requests.{col})")
    return (
        f"INSERT INTO requests ({', '.join(cols)}) VALUES ({', '.join('?' * len(cols))})"
        f" ON CONFLICT(id) DO UPDATE SET {', '.join(updates)}"
    )


_UPSERT_REQUEST = _upsert_sql()


class Journal(Protocol):
    """What the server needs from a journal; `JournalWriter` and `NullJournal` provide it."""

    async def start(self) -> None: ...
    async def append(self, request_id: str, seq: int, event: Event) -> None: ...
    async def flush(self) -> None: ...
    async def close(self) -> None: ...
    @property
    def stats(self) -> dict[str, int]: ...


def _default(obj: Any) -> Any:
    # Events hold JSON types only; this is the safety net so bytes never reach the file.
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, set | frozenset):
        return list(obj)
    return str(obj)


def encode(event: Event) -> bytes:
    """The stored JSON payload of an event (already redacted by `append`)."""
    return orjson.dumps(event.to_dict(), default=_default, option=orjson.OPT_NON_STR_KEYS)


class JournalWriter:
    """Appends events to a SQLite journal from one background task (see module docstring)."""

    def __init__(self, path: str | os.PathLike[str], *, queue_size: int = 65536, max_batch: int = 4096) -> None:
        if max_batch < 1 or queue_size < 1:
            raise ValueError("queue_size and max_batch must be positive")
        self.path = os.fspath(path)
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=queue_size)
        self._max_batch = max_batch
        self._conn: aiosqlite.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._close_lock = asyncio.Lock()
        self._summaries: dict[str, dict[str, Any]] = {}
        self._events_written = 0
        self._events_dropped = 0
        self._batches = 0
        self._batches_failed = 0
        self._max_batch_seen = 0

    async def start(self) -> None:
        """Open the file (creating and migrating it) and start the writer task."""
        if self._task is not None or self._closed:
            return
        # Migrations are plain sqlite3 functions; run them on a short-lived connection.
        await asyncio.to_thread(lambda: schema.connect(self.path).close())
        self._conn = await aiosqlite.connect(self.path, isolation_level=None)
        await self._conn.execute("PRAGMA synchronous=NORMAL")
        await self._conn.execute("PRAGMA busy_timeout=5000")
        self._task = asyncio.create_task(self._run(), name=f"journal-writer:{self.path}")

    async def append(self, request_id: str, seq: int, event: Event) -> None:
        """Queue one event, its secrets redacted. Waits only when the queue is full; dropped
        after `close()`."""
        if self._closed:
            self._events_dropped += 1
            return
        item = (request_id, seq, redacted(event))
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            await self._queue.put(item)

    async def flush(self) -> None:
        """Return once every event appended before this call is committed."""
        task = self._task
        if task is None or task.done() or self._closed:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        await self._queue.put(done)
        await asyncio.wait({done, task}, return_when=asyncio.FIRST_COMPLETED)

    async def close(self) -> None:
        """Drain the queue, commit, stop the task and close the file. Idempotent."""
        async with self._close_lock:
            if self._closed:
                return
            self._closed = True
            task = self._task
            if task is not None:
                if not task.done():
                    await self._queue.put(_STOP)
                await asyncio.wait({task})
            if self._conn is not None:
                await self._conn.close()
                self._conn = None

    @property
    def stats(self) -> dict[str, int]:
        return {
            "events_written": self._events_written,
            "batches": self._batches,
            "max_batch_seen": self._max_batch_seen,
            "queue_depth": self._queue.qsize(),
            "events_dropped": self._events_dropped,
            "batches_failed": self._batches_failed,
        }

    # -- the writer task -------------------------------------------------------------------

    async def _run(self) -> None:
        queue = self._queue
        stopping = False
        while True:
            if stopping:
                if queue.empty():
                    return
                first = queue.get_nowait()
            else:
                first = await queue.get()
            batch = [first]
            while len(batch) < self._max_batch:
                try:
                    batch.append(queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            events: list[tuple[str, int, Event]] = []
            waiters: list[asyncio.Future[None]] = []
            for item in batch:
                if item is _STOP:
                    stopping = True  # keep draining what is left, then return
                elif isinstance(item, asyncio.Future):
                    waiters.append(item)
                else:
                    events.append(item)
            try:
                if events:
                    await self._write(events)
            except Exception:
                self._batches_failed += 1
                log.exception("journal: a batch of %d events could not be written", len(events))
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    async def _write(self, events: list[tuple[str, int, Event]]) -> None:
        rows: list[tuple[str, int, str, float, str]] = []
        touched: dict[str, dict[str, Any]] = {}
        finished: list[str] = []
        for request_id, seq, event in events:
            try:
                data = encode(event).decode()
            except Exception:
                self._events_dropped += 1
                log.exception("journal: cannot serialize %s event of %s", event.kind, request_id)
                continue
            rows.append((request_id, seq, event.kind, float(event.t), data))
            row = self._summaries.get(request_id)
            if row is None:
                row = self._summaries[request_id] = {}
            summary.apply(row, request_id, event)
            touched[request_id] = row
            if row.get("completed"):
                finished.append(request_id)
        if not rows:
            return
        requests = [_request_params(row) for row in touched.values()]
        for request_id in finished:
            self._summaries.pop(request_id, None)
        self._evict()

        conn = self._conn
        assert conn is not None
        await conn.execute("BEGIN")
        try:
            try:
                await conn.executemany(_INSERT_EVENT, rows)
            except sqlite3.IntegrityError:
                # A duplicate (request_id, seq) is a caller bug; it must not cost the rest
                # of the batch. Rare, so the slow row-by-row path is fine.
                await conn.execute("ROLLBACK")
                await conn.execute("BEGIN")
                rows = await self._insert_one_by_one(conn, rows)
            await conn.executemany(_UPSERT_REQUEST, requests)
            await conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                await conn.execute("ROLLBACK")
            raise
        self._events_written += len(rows)
        self._batches += 1
        self._max_batch_seen = max(self._max_batch_seen, len(rows))

    async def _insert_one_by_one(
        self, conn: aiosqlite.Connection, rows: list[tuple[str, int, str, float, str]]
    ) -> list[tuple[str, int, str, float, str]]:
        kept = []
        for row in rows:
            try:
                await conn.execute(_INSERT_EVENT, row)
                kept.append(row)
            except sqlite3.IntegrityError:
                self._events_dropped += 1
                log.error("journal: duplicate event %s #%d (%s) dropped", row[0], row[1], row[2])
        return kept

    def _evict(self) -> None:
        # Requests that never complete (a crash mid-pipeline) must not grow memory forever.
        # Evicting is safe: the row is in the table and later upserts only fill it in.
        excess = len(self._summaries) - _MAX_INFLIGHT
        if excess > 0:
            for request_id in list(self._summaries)[:excess]:
                del self._summaries[request_id]


def _request_params(row: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(row.get(col, 0) if col in schema.FLAG_COLUMNS else row.get(col) for col in schema.REQUEST_COLUMNS)


class NullJournal:
    """The journal for `--no-journal`: same interface, keeps nothing."""

    async def start(self) -> None:
        return None

    async def append(self, request_id: str, seq: int, event: Event) -> None:
        return None

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def stats(self) -> dict[str, int]:
        return {"events_written": 0, "batches": 0, "max_batch_seen": 0, "queue_depth": 0}
