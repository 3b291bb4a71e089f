"""The journal's write side: one writer task, a bounded queue, group commit.

Serving code calls `append` for every event. That is a `put_nowait` on an in-memory queue
(no I/O, no await on disk); a single writer task takes whatever has queued up, up to
`max_batch` events, and hands them to the writer thread, which serializes them and writes
them and the summary rows they touch in ONE transaction, commits, and goes back for more.
Under load a batch grows with the backlog, so the number of commits per second stays small
however many events arrive; when idle each event is committed on its own almost at once.
`append` only waits when the queue is full (backpressure instead of unbounded memory).

Durability contract (WAL, `synchronous=NORMAL`):

* An event is durable once the transaction holding it commits: a committed batch survives a
  crash of the process (`kill -9`, OOM, segfault), since the commit is in the WAL file,
  which the OS owns once written. The file is never left corrupt. Only an OS crash or power
  loss may also roll back the last few commits (NORMAL does not fsync each one).
* What a `kill -9` loses is what had not been committed: the events still queued and the
  batch being written. That is the commit window. The writer starts the next commit as soon
  as the last one ends, so an event waits for the batch in progress and the events queued
  ahead of it: milliseconds under normal load; at worst, with the queue full (the writer not
  keeping up, `append` already applying backpressure), `queue_size` events at the write
  rate: about a second by default (65,536 events at the 60–100k events/s that
  `tools/bench/journal.py` measures on two cores).
* Batches commit whole and in append order, so after a crash every request's stored events
  are a prefix of what was appended (no gaps) and its summary row agrees with them; a
  request whose `completed` event was lost shows `completed = 0`.
* `flush()` returns once everything appended before it is committed; `close()` drains the
  queue and commits before closing.

Events are treated as immutable once appended: they are serialized later, by the writer
thread. Secrets are redacted in `append`, before an event is queued (headers of `received` and
upstream `head` events, MCP tokens in the `received` body and the validated summary); the
body capture mode (`bodies`, see `journal.bodies`) is applied by the writer thread, in order.
With `retention`, a companion task prunes the file (`journal.retention`) at start and every
`retention_interval_s`, on a connection and a thread of its own; the writer waits at most for
one of its small delete transactions.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import os
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import orjson

from journal import retention as retention_mod
from journal import schema, summary
from journal.bodies import BodyFilter
from journal.events import Event
from journal.redact import redacted

log = logging.getLogger(__name__)

_STOP = object()
_MAX_INFLIGHT = 100_000  # summaries kept in memory for requests without `completed` yet
_LOCKED_ATTEMPTS = 3  # each waits up to the connection's busy timeout (5 s)

_INSERT_EVENT = "INSERT INTO events (request_id, seq, kind, t, data) VALUES (?, ?, ?, ?, ?)"
_FIRST_WINS = frozenset({"ts", "method", "path", "tenant", "replay_of", "ttfe_ms", "bodies"})


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
    """Appends events to a SQLite journal from one background task and thread (see module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        queue_size: int = 65536,
        max_batch: int = 4096,
        bodies: str = "full",
        retention: tuple[float | None, int | None] | None = None,
        retention_interval_s: float = 60.0,
    ) -> None:
        """`bodies`: `full`, `redacted` or `none` (see `journal.bodies`). `retention`:
        `(max_age_s, max_bytes)` as `journal.retention.parse_retention` gives it; None (or
        both None) keeps everything."""
        if max_batch < 1 or queue_size < 1:
            raise ValueError("queue_size and max_batch must be positive")
        if retention_interval_s <= 0:
            raise ValueError("retention_interval_s must be positive")
        self.path = os.fspath(path)
        self._bodies = BodyFilter(bodies)
        self._retention = retention if retention is not None and retention != (None, None) else None
        self._retention_interval = retention_interval_s
        self._retention_task: asyncio.Task[None] | None = None
        self._requests_pruned = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=queue_size)
        self._max_batch = max_batch
        # One thread owns the connection and does all of a batch's work (serializing, summary
        # folding, SQL, commit): one hand-off per batch, whatever the load on the event loop.
        self._thread: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
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
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-writer")
        try:
            self._conn = await self._in_thread(schema.connect, self.path)  # creates and migrates
        except BaseException:
            self._thread.shutdown(wait=False)
            self._thread = None
            raise
        self._task = asyncio.create_task(self._run(), name=f"journal-writer:{self.path}")
        if self._retention is not None:
            self._retention_task = asyncio.create_task(self._retain(), name=f"journal-retention:{self.path}")

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
            if self._retention_task is not None:
                self._retention_task.cancel()
                await asyncio.wait({self._retention_task})
            task = self._task
            if task is not None:
                if not task.done():
                    await self._queue.put(_STOP)
                await asyncio.wait({task})
            if self._conn is not None:
                await self._in_thread(self._conn.close)
                self._conn = None
            if self._thread is not None:
                self._thread.shutdown(wait=False)
                self._thread = None

    @property
    def stats(self) -> dict[str, int]:
        return {
            "events_written": self._events_written,
            "batches": self._batches,
            "max_batch_seen": self._max_batch_seen,
            "queue_depth": self._queue.qsize(),
            "events_dropped": self._events_dropped,
            "batches_failed": self._batches_failed,
            "requests_pruned": self._requests_pruned,
        }

    async def _in_thread(self, fn: Any, *args: Any) -> Any:
        assert self._thread is not None
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    # -- retention ---------------------------------------------------------------------------

    async def _retain(self) -> None:
        assert self._retention is not None
        max_age_s, max_bytes = self._retention
        while True:
            try:
                result = await asyncio.to_thread(
                    retention_mod.prune, self.path, max_age_s=max_age_s, max_bytes=max_bytes
                )
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("journal: retention failed on %s", self.path)
            else:
                self._requests_pruned += result.requests_deleted
                if result.requests_deleted:
                    log.info(
                        "journal: pruned %d requests (%d events), %d -> %d bytes",
                        result.requests_deleted,
                        result.events_deleted,
                        result.bytes_before,
                        result.bytes_after,
                    )
            await asyncio.sleep(self._retention_interval)

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
                    await self._in_thread(self._write, events)
            except Exception:
                self._batches_failed += 1
                log.exception("journal: a batch of %d events could not be written", len(events))
            finally:
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)

    def _write(self, events: list[tuple[str, int, Event]]) -> None:
        """One batch, in the writer thread: capture, serialize, fold summaries, one transaction."""
        rows: list[tuple[str, int, str, float, str]] = []
        touched: dict[str, dict[str, Any]] = {}
        finished: list[str] = []
        body_filter = self._bodies
        for request_id, seq, event in events:
            try:
                event = body_filter(request_id, event)
                data = encode(event).decode()
            except Exception:
                self._events_dropped += 1
                log.exception("journal: cannot capture or serialize %s event of %s", event.kind, request_id)
                continue
            rows.append((request_id, seq, event.kind, float(event.t), data))
            row = self._summaries.get(request_id)
            if row is None:
                row = self._summaries[request_id] = {"bodies": body_filter.mode}
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
        for attempt in range(1, _LOCKED_ATTEMPTS + 1):
            try:
                rows = self._transaction(conn, rows, requests)
                break
            except sqlite3.OperationalError as exc:
                # Another process (`smg journal prune`, a migration) held the file past the
                # busy timeout: try again rather than lose the batch.
                if attempt == _LOCKED_ATTEMPTS or "locked" not in str(exc):
                    raise
                log.warning("journal: %s; retrying a batch of %d events", exc, len(rows))
        self._events_written += len(rows)
        self._batches += 1
        self._max_batch_seen = max(self._max_batch_seen, len(rows))

    def _transaction(
        self,
        conn: sqlite3.Connection,
        rows: list[tuple[str, int, str, float, str]],
        requests: list[tuple[Any, ...]],
    ) -> list[tuple[str, int, str, float, str]]:
        """Insert the events and upsert the summary rows in one transaction; the rows written."""
        conn.execute("BEGIN")
        try:
            try:
                conn.executemany(_INSERT_EVENT, rows)
            except sqlite3.IntegrityError:
                # A duplicate (request_id, seq) is a caller bug; it must not cost the rest
                # of the batch. Rare, so the slow row-by-row path is fine.
                conn.execute("ROLLBACK")
                conn.execute("BEGIN")
                rows = self._insert_one_by_one(conn, rows)
            conn.executemany(_UPSERT_REQUEST, requests)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return rows

    def _insert_one_by_one(
        self, conn: sqlite3.Connection, rows: list[tuple[str, int, str, float, str]]
    ) -> list[tuple[str, int, str, float, str]]:
        kept = []
        for row in rows:
            try:
                conn.execute(_INSERT_EVENT, row)
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
