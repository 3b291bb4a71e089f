"""The journal's write side: one writer task, a bounded queue, group commit.

Serving code calls `append` for every event. That is a `put_nowait` on an in-memory queue
(no I/O, no await on disk); a single writer task takes whatever has queued up, up to
`max_batch` events, and hands them to the writer thread, which serializes them and writes
them and the summary rows they touch in ONE transaction, commits, and goes back for more.
A request's streaming events (`tokens`, `block`, `upstream`) that follow each other in one
batch are packed into one compact row (`journal.packed`); every other event is a JSON row.
The same transaction stages the text of the requests that completed in the batch
(`journal.search.stage_text`), and the rollup triggers note them (`journal.rollups`). The
derived indexes are brought up to date about once every `index_interval_s` (1 s), in the
transaction of whichever batch is due then (or of an empty one, when none comes): the staged
texts go into the text index (`journal.search.index_staged`) and the notes into the rollups
(`journal.rollups.fold`). Both are per-transaction work whatever they hold (a text-index
segment, the rollup rows' upserts): done every 10 ms, they had cost more than the events.
Search and `stats` therefore see a completed request up to that interval late; `flush()` and
`close()` bring them up to date, and what a crash leaves staged or noted is taken by the
next writer's first commit. Under load a batch grows with the
backlog, so the number of commits per second stays small however many events arrive; an
idle writer waits `commit_interval_s` from the first event that arrives, so a short request's
events share one commit, made after its answer rather than while it is being served.
`append` only waits when the queue is full (backpressure instead of unbounded memory).

Durability contract (WAL, `synchronous=NORMAL`):

* An event is durable once the transaction holding it commits: a committed batch survives a
  crash of the process (`kill -9`, OOM, segfault), since the commit is in the WAL file,
  which the OS owns once written. The file is never left corrupt. Only an OS crash or power
  loss may also roll back the last few commits (NORMAL does not fsync each one).
* What a `kill -9` loses is what had not been committed: the events still queued and the
  batch being written. That is the commit window. The writer starts the next commit as soon
  as the last one ends but not sooner than `commit_interval_s` (10 ms) after the previous one
  started (or, idle, after the first event arrived), so an event waits for that interval,
  the batch in progress and the events queued ahead of it: about ten milliseconds under
  normal load; at worst, with the queue full (the writer not
  keeping up, `append` already applying backpressure), `queue_size` events at the write
  rate: about a quarter of a second by default (16,384 events at the 60–100k events/s that
  `tools/bench/journal.py` measures on two cores; less while the event loop, which shares
  the GIL with the writer thread, keeps both cores busy). The queue is kept that small on
  purpose: a bigger one lets a saturated gateway run further ahead of its journal.
* Batches commit whole and in append order, so after a crash every request's stored events
  are a prefix of what was appended (no gaps) and its summary row agrees with them; a
  request whose `completed` event was lost shows `completed = 0`.
* `flush()` returns once everything appended before it is committed; `close()` drains the
  queue and commits before closing.

When commits fail (a full disk, a lock held past `busy_timeout_ms`, an I/O error) or one
waits on a lock for over a second, serving goes on: the prepared batch is held and retried
every `retry_interval_s` with what queued up meanwhile, and a full queue moves its events to a
backlog behind it instead of blocking `append`. Events are dropped only once `max_held` are
held in all (queued, backlog, prepared: new events then, or the oldest batches beyond it).
`problem` says why the journal is failing: commits fail, one has waited over a second, or
events were dropped (None once a commit succeeds again; `/readiness` reports it). One log line
marks the start of an incident (its first failed commit, stalled commit or drop), one its first drop
and then at most one per `drop_log_interval_s` the drops since the last line, and one its end
with the count dropped during it, counted at the same moment as `stats`' `events_dropped`
(which also counts events that cannot be stored at all). A request whose `completed` event was
dropped is closed once the writer has caught up (`journal.recovery.dropped`). An event that cannot be serialized,
or a row SQLite refuses, is dropped alone; text UTF-8 cannot hold (lone surrogates) is stored
escaped.

Events are treated as immutable once appended: they are serialized later, by the writer
thread. Secrets are redacted in `append`, before an event is queued (headers of `received` and
upstream `head` events, MCP tokens in the `received` body and the validated summary), except a
`received` body over `INLINE_REDACT_CHARS`: that one is redacted by the writer thread, before
anything else reads it (a pass over megabytes on the event loop stalls every other client, and
the thread scans it a window at a time, `journal.redact.SCAN_WINDOW_CHARS`); either way nothing
is stored unredacted. The body capture mode (`bodies`, see `journal.bodies`) is applied by the
writer thread, in order. A payload of megabytes is escaped a window at a time (`encode`) and
stored as the bytes built (a BLOB; readers decode TEXT and BLOB payloads alike).
With `retention`, a companion task prunes the file (`journal.retention`) at start and every
`retention_interval_s`, on a connection and a thread of its own; the writer waits at most for
one of its small delete transactions.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import functools
import json
import logging
import os
import sqlite3
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, Protocol

import orjson

from journal import packed, recovery, rollups, schema, search, summary
from journal import retention as retention_mod
from journal.bodies import BodyFilter
from journal.events import Event, Received, Upstream
from journal.prices import PriceTable
from journal.redact import redacted, redacted_body

log = logging.getLogger(__name__)

INLINE_REDACT_CHARS = 1 << 20
"""The longest `received` body `append` redacts on the caller's (event loop's) time; a longer one
is redacted by the writer thread."""
ESCAPE_WINDOW_CHARS = 1 << 15
"""How much of a long text one escaping call of `encode` covers at most (orjson reserves 16
bytes of buffer per character, and keeps them in its result: 512 KiB a window, from the heap)."""
LONG_TEXT_CHARS = 1 << 20
"""A text field longer than this is escaped a window at a time."""
STORED_AS_TEXT_BYTES = 1 << 20
"""The longest payload stored as TEXT; a longer one is stored as the bytes `encode` built (a BLOB,
which every reader decodes the same way), not copied once more into a `str`."""

_STOP = object()
_INDEX = object()  # queued by the index timer: an idle writer brings the derived indexes up to date
_MAX_INFLIGHT = 100_000  # summaries kept in memory for requests without `completed` yet
# What SQLite refuses about one row, as opposed to the file (locked, full: OperationalError).
_ROW_ERRORS = (
    sqlite3.IntegrityError,
    sqlite3.InterfaceError,
    sqlite3.DataError,
    sqlite3.ProgrammingError,
    OverflowError,
)
_FINAL_ATTEMPTS = 3  # retries of what is still pending when the writer closes
_STALL_S = 1.0  # a commit running longer than this counts as stalled: a full queue drops, not waits

_INSERT_EVENT = "INSERT INTO events (rk, seq, kind, t, data) VALUES (?, ?, ?, ?, ?)"
_MAX_RUN = 1024  # events per packed row: bounds a row's size (and what one bad event takes with it)
_FIRST_WINS = frozenset(
    {"ts", "method", "path", "tenant", "replay_of", "ttfe_ms", "bodies", "client_id", *search.FIRST_WINS}
)


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
        f" ON CONFLICT(id) DO UPDATE SET {', '.join(updates)} RETURNING rk"
    )


_UPSERT_REQUEST = _upsert_sql()


def _merge(col: str) -> str:
    """How a new value of `col` meets the stored one: the upsert's rules, as SQL with one `?`."""
    if col in schema.FLAG_COLUMNS:
        return f"MAX({col}, ?)"
    if col in _FIRST_WINS:
        return f"COALESCE({col}, ?)"
    return f"COALESCE(?, {col})"


@functools.lru_cache(maxsize=512)
def _update_sql(changed: tuple[int, ...]) -> str:
    sets = ", ".join(f"{schema.REQUEST_COLUMNS[i]} = {_merge(schema.REQUEST_COLUMNS[i])}" for i in changed)
    return f"UPDATE requests SET {sets} WHERE rk = ?"


_COMPLETED = schema.REQUEST_COLUMNS.index("completed")


class Journal(Protocol):
    """What the server needs from a journal; `JournalWriter` and `NullJournal` provide it."""

    async def start(self) -> None: ...
    async def append(self, request_id: str, seq: int, event: Event) -> None: ...
    async def flush(self) -> None: ...
    async def close(self) -> None: ...
    @property
    def stats(self) -> dict[str, int]: ...
    @property
    def problem(self) -> str | None: ...


def _default(obj: Any) -> Any:
    # Events hold JSON types only; this is the safety net so bytes never reach the file.
    if isinstance(obj, bytes | bytearray | memoryview):
        return base64.b64encode(bytes(obj)).decode("ascii")
    if isinstance(obj, set | frozenset):
        return list(obj)
    return str(obj)


def clean_text(text: str) -> str:
    """`text` as UTF-8 can hold it: lone surrogates (Sanic decodes header bytes that are not
    UTF-8 with `surrogateescape`) spelled as `\\udcXX` escapes; other text unchanged."""
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def _cleaned(value: Any) -> Any:
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, dict):
        return {clean_text(k) if isinstance(k, str) else k: _cleaned(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_cleaned(v) for v in value]
    return value


def encode(event: Event) -> bytes:
    """The stored JSON payload of an event (already redacted by `append`). Text that UTF-8
    cannot hold (lone surrogates) is stored escaped rather than failing the event.

    A text field over `LONG_TEXT_CHARS` (a `received` body, a relayed answer of megabytes)
    is escaped a window at a time and spliced in: one C call over the whole text would hold
    the GIL, and the event loop with it, for tens of milliseconds per 20 MiB."""
    payload = event.to_dict()
    for value in payload.values():  # a loop, not any(<genexpr>): this runs for every event
        if type(value) is str and len(value) > LONG_TEXT_CHARS:
            return _spliced(payload)
    return _dumps(payload)


def _dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:
        # Lone surrogates, or an integer past 64 bits (a client's JSON may hold one): the
        # standard library writes big integers; the reader falls back to it too.
        text = json.dumps(_cleaned(value), default=_default, ensure_ascii=False, separators=(",", ":"))
        return text.encode("utf-8")


def _spliced(payload: dict[str, Any]) -> bytes:
    """`payload` as `_dumps` writes it, its long texts escaped a window at a time (a JSON
    string's escaping is per character, so the windows' escapes joined are the whole one's)."""
    parts: list[bytes] = [b"{"]
    for name, value in payload.items():
        if len(parts) > 1:
            parts.append(b",")
        parts.append(_dumps(name))
        parts.append(b":")
        if type(value) is str and len(value) > LONG_TEXT_CHARS:
            parts.append(b'"')
            for at in range(0, len(value), ESCAPE_WINDOW_CHARS):
                # Copied out: orjson's result keeps the buffer it reserved, 16 times the window.
                parts.append(memoryview(_dumps(value[at : at + ESCAPE_WINDOW_CHARS]))[1:-1].tobytes())
            parts.append(b'"')
        else:
            parts.append(_dumps(value))
    parts.append(b"}")
    return b"".join(parts)


def _stored(payload: bytes) -> str | bytes:
    """What the `data` column is given for a payload: text, or the bytes of a long one."""
    return payload if len(payload) > STORED_AS_TEXT_BYTES else payload.decode()


# (request id, seq, kind, t, data, events in the row): the text id becomes `rk` at commit time.
_Rows = list[tuple[str, int, str, float, str | bytes, int]]
_Params = list[tuple[Any, ...]]
_Texts = list[tuple[str, str]]  # (text, request id): keyed for `journal.search.stage_text` at commit


class JournalWriter:
    """Appends events to a SQLite journal from one background task and thread (see module docstring)."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        queue_size: int = 16384,
        max_held: int = 131072,
        max_batch: int = 4096,
        bodies: str = "full",
        retention: tuple[float | None, int | None] | None = None,
        retention_interval_s: float = 60.0,
        retry_interval_s: float = 1.0,
        busy_timeout_ms: int = 5000,
        commit_interval_s: float = 0.01,
        index_interval_s: float = 1.0,
        recover: bool = False,
        drop_log_interval_s: float = 10.0,
        secret: bytes | None = None,
        prices: PriceTable | None = None,
    ) -> None:
        """`bodies`: `full`, `redacted` or `none` (see `journal.bodies`). `retention`:
        `(max_age_s, max_bytes)` as `journal.retention.parse_retention` gives it; None (or
        both None) keeps everything. `max_held`: the events kept in memory while commits fail
        or stall, the queue's included (the queue is at most half of it: a small `max_held`
        shrinks `queue_size`). While commits fail, they are retried every
        `retry_interval_s`; `busy_timeout_ms` is how long one commit waits for a lock. A commit
        starts at most every `commit_interval_s` (what arrives meanwhile joins it): fewer,
        larger transactions and longer packed runs, for that much more commit window.
        `index_interval_s`: how often the text index and the rollups take what the commits
        since have staged and noted (0: in every commit). `recover`: at start, close the
        requests a stopped writer left in flight as `interrupted` (`journal.recovery`; one
        process of those sharing a file does it).
        `drop_log_interval_s`: while events are dropped, at most one log line per interval
        says how many were since the last one. `secret`: what the fingerprints of redacted
        secrets are keyed with (`journal.redact`; None: bare SHA-256). `prices`: the operator's
        price table (`journal.prices`); a completed request of a model it prices gets its
        `cost_usd` in the fold that completes it."""
        if max_batch < 1 or queue_size < 1 or max_held < 2:
            raise ValueError("queue_size and max_batch must be positive, max_held at least 2")
        queue_size = min(queue_size, max_held // 2)
        if commit_interval_s < 0:
            raise ValueError("commit_interval_s cannot be negative")
        self._commit_interval = commit_interval_s
        if index_interval_s < 0:
            raise ValueError("index_interval_s cannot be negative")
        self._index_interval = index_interval_s
        self._indexed_at: float | None = None  # when a commit last indexed (None: not yet)
        self._unindexed = True  # a crashed writer may have left texts staged, notes unfolded
        self._index_timer: asyncio.Handle | None = None
        if retention_interval_s <= 0 or retry_interval_s <= 0:
            raise ValueError("retention_interval_s and retry_interval_s must be positive")
        self.path = os.fspath(path)
        self._bodies = BodyFilter(bodies)
        self._prices = prices
        self._retention = retention if retention is not None and retention != (None, None) else None
        self._retention_interval = retention_interval_s
        self._retention_task: asyncio.Task[None] | None = None
        self._retry_interval = retry_interval_s
        self._busy_timeout_ms = int(busy_timeout_ms)
        self._requests_pruned = 0
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize=queue_size)
        self._max_batch = max_batch
        # One thread owns the connection and does all of a batch's work (serializing, summary
        # folding, SQL, commit): one hand-off per batch, whatever the load on the event loop.
        self._thread: ThreadPoolExecutor | None = None
        self._conn: sqlite3.Connection | None = None
        self._task: asyncio.Task[None] | None = None
        self._recover = recover
        self._registration: recovery.Registration | None = None
        self._closed = False
        self._close_lock = asyncio.Lock()
        self._summaries: dict[str, dict[str, Any]] = {}
        # In-flight requests' summary parameters and integer key as last committed: a batch
        # that changes nothing of a summary (a stream's tokens) neither upserts it nor looks up
        # its key.
        self._committed: dict[str, tuple[tuple[Any, ...], int]] = {}
        # Prepared batches whose commit failed, retried with the next one (oldest first);
        # at most `_max_pending` events, the oldest batches given up beyond that.
        self._pending: list[tuple[_Rows, _Params, _Texts]] = []
        self._pending_events = 0
        self._max_pending = max(max_held - queue_size, queue_size)
        # Appended events moved out of a full queue while a commit stalls or fails, oldest
        # first and older than everything still queued: the rest of the held buffer, so that
        # nothing is dropped before `max_held` events are held in all.
        self._backlog: collections.deque[Any] = collections.deque()
        self._writing = 0  # events taken for the batch in the writer thread, not yet prepared
        self._given_up = 0  # oldest held batches the writer thread gave up, not counted yet
        self._problem: str | None = None
        self._incident_since: float | None = None
        self._incident_dropped = 0
        self._drop_log_interval = drop_log_interval_s
        self._secret = secret
        self._drop_logged_at = 0.0
        self._unlogged_drops = 0
        # Requests whose `completed` event was dropped: (seq, t) of it, closed once commits
        # have caught up (`journal.recovery.dropped`), so none stays in flight for a drop.
        self._unclosed: dict[str, tuple[int, float]] = {}
        self._given_up_completions: list[tuple[str, int, float]] = []  # by the writer thread
        self._commit_started: float | None = None
        self._events_written = 0
        self._events_dropped = 0
        self._events_refused = 0  # by the writer thread: events that cannot be serialized or stored
        self._batches = 0
        self._batches_failed = 0
        self._max_batch_seen = 0
        self._incidents = 0
        self._commit_us_last = 0
        self._commit_us_max = 0
        self._commit_us_total = 0

    async def start(self) -> None:
        """Open the file (creating and migrating it) and start the writer task."""
        if self._task is not None or self._closed:
            return
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="journal-writer")
        try:
            self._conn = await self._in_thread(schema.connect, self.path)  # creates and migrates
            await self._in_thread(self._conn.execute, f"PRAGMA busy_timeout={self._busy_timeout_ms}")
            # Unregistered, its requests in flight would look like a dead writer's to another
            # process's recovery: a writer that cannot register does not start.
            self._registration = await self._in_thread(recovery.Registration, self.path)
        except BaseException:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            self._thread.shutdown(wait=False)
            self._thread = None
            raise
        try:  # what a stopped writer left staged or noted is indexed now, not at the first event
            await self._in_thread(self._write, [], True)
        except sqlite3.Error as exc:  # the first commit that can will
            log.warning("journal: cannot bring the text index and rollups of %s up to date (%s)", self.path, exc)
        self._task = asyncio.create_task(self._run(), name=f"journal-writer:{self.path}")
        await self._close_orphans()
        if self._retention is not None:
            self._retention_task = asyncio.create_task(self._retain(), name=f"journal-retention:{self.path}")

    async def _close_orphans(self) -> None:
        """With `recover`, close what dead writers left in flight."""
        assert self._registration is not None
        try:
            if not self._recover:
                return
            before = await self._in_thread(self._registration.earliest_live_start)
            orphans = await self._in_thread(recovery.orphans, self._conn, before)
        except (OSError, sqlite3.Error) as exc:
            log.warning("journal: cannot look for requests a stopped gateway left in flight (%s)", exc)
            return
        for request_id, seq, events in orphans:
            for offset, event in enumerate(events):
                await self.append(request_id, seq + offset, event)
        if orphans:
            log.warning(
                "journal: %d requests a stopped gateway left in flight are closed as %s",
                len(orphans),
                recovery.INTERRUPTED,
            )

    async def append(self, request_id: str, seq: int, event: Event) -> None:
        """Queue one event, its secrets redacted. Waits only when the queue is full and the
        writer is keeping up; while commits fail (or one has hung for a second) a full queue
        drops the event instead, so serving never waits on a broken disk. Dropped after
        `close()`."""
        if self._closed:
            self._events_dropped += 1
            return
        try:
            item = (request_id, seq, redacted(event, self._secret, body_up_to=INLINE_REDACT_CHARS))
        except Exception:
            # Never store what could not be redacted; never fail the request over it.
            self._events_dropped += 1
            log.exception("journal: cannot redact %s event of %s; dropped", event.kind, clean_text(request_id))
            return
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            if not self._stalled():
                await self._queue.put(item)
            elif not self._hold(item):
                self._drop(item)

    def offer(self, request_id: str, seq: int, event: Event) -> bool:
        """`append` without the coroutine, for the per-token path: False only when the event
        must wait for room in the queue (then `append` it); otherwise it is queued, or dropped
        as `append` would drop it."""
        if self._closed:
            self._events_dropped += 1
            return True
        try:
            item = (request_id, seq, redacted(event, self._secret, body_up_to=INLINE_REDACT_CHARS))
        except Exception:
            self._events_dropped += 1
            log.exception("journal: cannot redact %s event of %s; dropped", event.kind, clean_text(request_id))
            return True
        try:
            self._queue.put_nowait(item)
        except asyncio.QueueFull:
            if not self._stalled():
                return False
            if not self._hold(item):
                self._drop(item)
        return True

    def _stalled(self) -> bool:
        started = self._commit_started
        return self._problem is not None or (started is not None and time.monotonic() - started > _STALL_S)

    def _hold(self, item: Any) -> bool:
        """Queue `item` behind what the full queue holds by moving the queue's contents to the
        backlog, as far as the held buffer has room; False when it is full (then drop)."""
        self._relieve()
        if self._queue.full():
            return False
        self._queue.put_nowait(item)
        return True

    async def _committing(self, events: list[tuple[str, int, Event]], index: bool) -> None:
        """`_write` in the writer thread. While it waits on a lock, the appends blocked on a
        full queue are let through every `_STALL_S` by moving the queue to the backlog."""
        assert self._thread is not None
        commit = asyncio.get_running_loop().run_in_executor(self._thread, self._write, events, index)
        while not (await asyncio.wait({commit}, timeout=_STALL_S))[0]:
            if self._incident_since is None:  # not ready from now on (`problem`): say why in the log
                self._begin_incident(f"a commit has waited over {_STALL_S:.0f}s for the file")
            self._relieve()
        commit.result()

    def _relieve(self) -> None:
        queue, backlog = self._queue, self._backlog
        room = self._max_pending - self._pending_events - self._writing - len(backlog)
        for _ in range(max(min(room, queue.qsize()), 0)):
            backlog.append(queue.get_nowait())

    def _drop(self, item: tuple[str, int, Event]) -> None:
        request_id, seq, event = item
        if event.kind == "completed":
            self._lost_completion(request_id, seq, float(event.t))
        self._dropped(1)

    def _lost_completion(self, request_id: str, seq: int, t: float) -> None:
        if len(self._unclosed) < _MAX_INFLIGHT:
            self._unclosed[request_id] = (seq, t)

    def _dropped(self, count: int) -> None:
        """Count events given up for lack of room, in the metric and in the incident's log
        lines together: an incident starts (and is logged) with its first drop if no failed
        commit has started it already (a commit stalled on a lock, not failed yet); its first
        drop is logged at once, later ones at most every `drop_log_interval_s` with the
        count since the last line."""
        if self._incident_since is None:
            self._begin_incident(f"a commit has waited over {_STALL_S:.0f}s for the file")
        first = self._incident_dropped == 0
        self._events_dropped += count
        self._incident_dropped += count
        self._unlogged_drops += count
        now = time.monotonic()
        if first or now - self._drop_logged_at >= self._drop_log_interval:
            self._log_drops(now)

    def _log_drops(self, now: float) -> None:
        log.error(
            "journal: dropped %d events since the last line (%d in this incident); the %d held in"
            " memory for %s are all taken",
            self._unlogged_drops,
            self._incident_dropped,
            self._max_pending + self._queue.maxsize,
            self.path,
        )
        self._unlogged_drops = 0
        self._drop_logged_at = now

    async def flush(self) -> None:
        """Return once every event appended before this call is committed (or, while commits
        fail, has been tried once)."""
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
            if self._index_timer is not None:
                self._index_timer.cancel()
                self._index_timer = None
            if self._pending_events:
                log.error(
                    "journal: closing %s with %d events that could not be committed (%s); they are lost",
                    self.path,
                    self._pending_events,
                    self._problem,
                )
                self._events_dropped += self._pending_events
                self._pending.clear()
                self._pending_events = 0
            if self._conn is not None:
                await self._in_thread(self._conn.close)
                self._conn = None
            if self._registration is not None:
                self._registration.close()
                self._registration = None
            if self._thread is not None:
                self._thread.shutdown(wait=False)
                self._thread = None

    @property
    def problem(self) -> str | None:
        """Why the journal is failing right now (None: it is not): commits fail, or one has
        waited past `_STALL_S`, or events have been dropped since commits last caught up.
        `/readiness` reports it."""
        if self._problem is not None:
            return self._problem
        started = self._commit_started
        if started is not None and (waited := time.monotonic() - started) > _STALL_S:
            return f"a commit to {self.path} has waited {waited:.1f}s (the file locked by another process, or slow)"
        if self._incident_since is not None and self._incident_dropped:
            return f"{self._incident_dropped} events dropped: commits to {self.path} are not keeping up"
        return None

    @property
    def stats(self) -> dict[str, int]:
        """Counters for a metrics layer: events written and dropped, batches committed and
        failed, what waits in memory (`queue_depth`, `pending_events`: prepared but not yet
        committed), commit latency in microseconds, incidents (runs of failing commits)."""
        return {
            "events_written": self._events_written,
            "batches": self._batches,
            "max_batch_seen": self._max_batch_seen,
            "queue_depth": self._queue.qsize() + len(self._backlog),
            "pending_events": self._pending_events,
            "events_dropped": self._events_dropped + self._events_refused,
            "batches_failed": self._batches_failed,
            "incidents": self._incidents,
            "failing": int(self._problem is not None),
            "commit_us_last": self._commit_us_last,
            "commit_us_max": self._commit_us_max,
            "commit_us_total": self._commit_us_total,
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
        final_attempts = 0
        last_start = 0.0
        while True:
            batch: list[Any] = []
            limit = self._max_batch
            backlog = self._backlog
            if self._problem is not None:
                # Failing: try again every retry interval with all that queued up meanwhile
                # (the held bound, not the batch size, limits what is held).
                await asyncio.sleep(self._retry_interval)
                limit = max(min(len(backlog) + queue.qsize(), self._max_pending - self._pending_events), 1)
            else:
                batch.append(backlog.popleft() if backlog else await queue.get())
                # An idle writer waits the interval too, from the first event: the rest of its
                # request joins the same commit, after the request's own work, not during it.
                wait = max(last_start, time.monotonic()) + self._commit_interval - time.monotonic()
                if wait > 0 and batch[0] is not _STOP:
                    await asyncio.sleep(wait)
            last_start = time.monotonic()
            while backlog and len(batch) < limit:  # the backlog is older than the queue
                batch.append(backlog.popleft())
            while len(batch) < limit:
                try:
                    batch.append(queue.get_nowait())
                except asyncio.QueueEmpty:
                    break
            events: list[tuple[str, int, Event]] = []
            waiters: list[asyncio.Future[None]] = []
            index = False
            while batch:
                for item in batch:
                    if item is _STOP:
                        stopping = True  # drain what is left, then return
                    elif item is _INDEX:
                        index = True
                    elif isinstance(item, asyncio.Future):
                        waiters.append(item)
                    else:
                        events.append(item)
                batch = []
                while stopping and backlog:  # the rest joins the final commit
                    batch.append(backlog.popleft())
                while stopping and not queue.empty():
                    batch.append(queue.get_nowait())
            # What `flush()` and `close()` wait for includes the derived indexes.
            index = index or stopping or bool(waiters)
            try:
                if events or self._pending or (index and self._unindexed):
                    self._writing = len(events)
                    await self._committing(events, index)
            except Exception as exc:
                self._failed(exc)
            else:
                if self._incident_since is not None and not self._pending:
                    self._recovered()
            finally:
                self._writing = 0
                if self._given_up:  # counted here, on the loop, with the incident's count
                    given_up, self._given_up = self._given_up, 0
                    for request_id, seq, t in self._given_up_completions:
                        self._lost_completion(request_id, seq, t)
                    self._given_up_completions.clear()
                    self._dropped(given_up)
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
                if self._unindexed and self._index_timer is None and not stopping:
                    self._index_timer = asyncio.get_running_loop().call_later(self._index_interval, self._index_due)
            if stopping:
                if not self._pending or final_attempts >= _FINAL_ATTEMPTS:
                    return
                final_attempts += 1  # closing while failing: a few more tries, then give up
            elif self._unclosed and self._incident_since is None and not backlog and queue.empty():
                await self._close_dropped()

    def _index_due(self) -> None:
        """The index timer: wake an idle writer for the derived indexes (a busy one, with a full
        queue, is committing anyway and indexes when its interval is up)."""
        self._index_timer = None
        if not self._closed:
            try:
                self._queue.put_nowait(_INDEX)
            except asyncio.QueueFull:
                pass

    async def _close_dropped(self) -> None:
        """Close the requests whose `completed` was dropped, now that everything appended
        before has been committed (what is left of them is stored); the next start's
        recovery closes those this misses."""
        unclosed, self._unclosed = self._unclosed, {}
        try:
            closing = await self._in_thread(recovery.dropped, self._conn, unclosed)
        except sqlite3.Error as exc:
            log.warning("journal: cannot look for the requests whose completion was dropped (%s)", exc)
            return
        for request_id, seq, events in closing:
            for offset, event in enumerate(events):
                self._backlog.append((request_id, seq + offset, event))
        if closing:
            log.warning(
                "journal: %d requests whose completion was dropped are closed as %s",
                len(closing),
                recovery.DROPPED,
            )

    def _failed(self, exc: Exception) -> None:
        self._batches_failed += 1
        if self._problem is None:
            self._problem = f"{type(exc).__name__}: {exc}"
            if self._incident_since is None:
                self._begin_incident(self._problem)

    def _begin_incident(self, why: str) -> None:
        self._incidents += 1
        self._incident_since = time.monotonic()
        self._incident_dropped = 0
        # One line per incident, not per batch: a full disk fails every attempt.
        log.error(
            "journal: cannot commit to %s (%s); serving continues, up to %d events are held in memory"
            " and retried every %.1fs, events beyond that are dropped",
            self.path,
            why,
            self._max_pending + self._queue.maxsize,
            self._retry_interval,
        )

    def _recovered(self) -> None:
        since = self._incident_since
        assert since is not None
        if self._unlogged_drops:
            self._log_drops(time.monotonic())
        log.warning(
            "journal: commits to %s resumed after %.1fs; %d events were dropped during the incident",
            self.path,
            time.monotonic() - since,
            self._incident_dropped,
        )
        self._problem = None
        self._incident_since = None

    def _write(self, events: list[tuple[str, int, Event]], index: bool = False) -> None:
        """One batch, in the writer thread: prepare it, then commit it with whatever earlier
        batches failed to commit, and with the derived indexes when `index` or when they are
        due. Raises when the commit fails (the batches stay pending)."""
        prepared = self._prepare(events)
        if prepared is not None:
            self._pending.append(prepared)
            self._pending_events += _event_count(prepared[0])
            self._bound_pending()
        self._writing = 0
        indexed_at = self._indexed_at
        index = index or indexed_at is None or time.monotonic() - indexed_at >= self._index_interval
        if not self._pending and not (index and self._unindexed):
            return
        rows = [row for batch_rows, _, _ in self._pending for row in batch_rows]
        requests = [params for _, batch_params, _ in self._pending for params in batch_params]
        texts = [text for _, _, batch_texts in self._pending for text in batch_texts]
        conn = self._conn
        assert conn is not None
        started = self._commit_started = time.monotonic()
        try:
            rows, keys = self._transaction(conn, rows, requests, texts, index)
        finally:
            self._commit_started = None
        if index:
            self._indexed_at, self._unindexed = time.monotonic(), False
        else:
            self._unindexed = True
        committed = self._committed
        for params in requests:
            request_id = params[0]
            if params[_COMPLETED] == 1:
                committed.pop(request_id, None)
            elif request_id in keys:
                committed[request_id] = (params, keys[request_id])
        elapsed_us = int((time.monotonic() - started) * 1e6)
        self._commit_us_last = elapsed_us
        self._commit_us_max = max(self._commit_us_max, elapsed_us)
        self._commit_us_total += elapsed_us
        self._pending.clear()
        self._pending_events = 0
        written = _event_count(rows)
        self._events_written += written
        if written:  # not an empty commit that only brought the indexes up to date
            self._batches += 1
        self._max_batch_seen = max(self._max_batch_seen, written)

    def _bound_pending(self) -> None:
        while self._pending_events > self._max_pending and len(self._pending) > 1:
            rows, _, _ = self._pending.pop(0)
            count = _event_count(rows)
            self._pending_events -= count
            self._given_up += count
            self._given_up_completions.extend((row[0], row[1], row[3]) for row in rows if row[2] == "completed")

    def _prepare(self, events: list[tuple[str, int, Event]]) -> tuple[_Rows, _Params, _Texts] | None:
        """Capture, serialize and fold each event; an event that cannot be is dropped alone.

        The streaming events (`journal.packed.PACKABLE`) of one request that follow each other
        in this batch are packed into one row; any other event is a row of its own.
        """
        rows: _Rows = []
        touched: dict[str, dict[str, Any]] = {}
        finished: list[str] = []
        body_filter = self._bodies
        prices = self._prices
        filtering = body_filter.mode != "full"  # `full` keeps every event as it is
        runs: dict[str, list[tuple[int, Event]]] = {}
        for request_id, seq, event in events:
            try:
                if not request_id.isascii():
                    request_id = clean_text(request_id)
                received = event
                if isinstance(event, Received):
                    event = redacted_body(event, INLINE_REDACT_CHARS, self._secret)
                if filtering:
                    event = body_filter(request_id, event)
                seq = int(seq)
                packable = event.kind in packed.PACKABLE
                data = None if packable else _stored(encode(event))
                row = self._summaries.get(request_id)
                if row is None:
                    row = {"bodies": body_filter.mode}
                if isinstance(event, Received) and event.body is not None:
                    row[search.AS_RECEIVED] = event.body is getattr(received, "body", None)
                elif isinstance(event, Upstream) and event.parsed is not None:
                    if event.data is not getattr(received, "data", None):  # what was parsed is not stored
                        event = replace(event, parsed=None)
                summary.apply(row, request_id, event)
                if prices is not None and event.kind == "completed":
                    summary.price(row, prices)
            except Exception:
                self._events_refused += 1
                log.exception("journal: cannot capture or serialize %s event of %s", event.kind, request_id)
                continue
            self._summaries[request_id] = row
            touched[request_id] = row
            run = runs.get(request_id)
            if run is not None and (not packable or run[-1][0] + 1 != seq or len(run) >= _MAX_RUN):
                self._close_run(rows, request_id, runs.pop(request_id))
                run = None
            if packable:
                if run is None:
                    runs[request_id] = [(seq, event)]
                else:
                    run.append((seq, event))
            else:
                assert data is not None
                rows.append((request_id, seq, event.kind, float(event.t), data, 1))
            if row.get("completed"):
                finished.append(request_id)
        for request_id, run in runs.items():
            self._close_run(rows, request_id, run)
        if not rows:
            return None
        committed = self._committed
        requests = [
            params
            for params in map(_request_params, touched.values())
            if (last := committed.get(params[0])) is None or last[0] != params
        ]
        texts = search.text_rows([touched[request_id] for request_id in dict.fromkeys(finished)])
        for request_id in finished:
            self._summaries.pop(request_id, None)
        self._evict()
        return rows, requests, texts

    def _close_run(self, rows: _Rows, request_id: str, run: list[tuple[int, Event]]) -> None:
        """The row of a run of streaming events (rows, when some event cannot be packed)."""
        seq, first = run[0]
        t0 = float(first.t)
        try:
            data = packed.pack([event for _, event in run], t0, encode)
        except Exception:
            self._split_run(rows, request_id, run)
            return
        rows.append((request_id, seq, packed.RUN_KIND, t0, data, len(run)))

    def _split_run(self, rows: _Rows, request_id: str, run: list[tuple[int, Event]]) -> None:
        # What the compact form cannot hold (text UTF-8 cannot hold, numbers past 64 bits) is
        # stored one row each, as JSON, the way anything else is; the events around it are packed.
        part: list[tuple[int, Event]] = []
        for seq, event in run:
            try:
                packed.pack([event], float(event.t), encode)
            except Exception:
                if part:
                    self._close_run(rows, request_id, part)
                    part = []
                try:
                    rows.append((request_id, seq, event.kind, float(event.t), _stored(encode(event)), 1))
                except Exception:
                    self._events_refused += 1
                    log.exception("journal: cannot serialize %s event of %s", event.kind, request_id)
            else:
                part.append((seq, event))
        if part:
            self._close_run(rows, request_id, part)

    def _transaction(
        self, conn: sqlite3.Connection, rows: _Rows, requests: _Params, texts: _Texts, index: bool
    ) -> tuple[_Rows, dict[str, int]]:
        """Upsert the summary rows (which gives each request its integer key), insert the
        events under those keys, stage the text of the requests that completed
        (`journal.search`) and, with `index`, bring the text index and the rollups up to date
        (`journal.rollups.fold`), in one transaction; the rows written.

        `BEGIN IMMEDIATE` takes the write lock up front: with several gateway processes writing
        one file, a deferred transaction that upgrades from a read could fail at once instead
        of waiting. A row SQLite refuses (a duplicate event, a value it cannot bind) costs
        itself only: the batch is retried row by row without it. Failures of the file itself
        (locked, full, I/O) raise, and the caller keeps the batch for a later attempt. Returns
        the rows written and the keys of the requests upserted.
        """
        known = {request_id: rk for request_id, (_, rk) in self._committed.items()}
        # Retried batches may hold several snapshots of one summary: the last one has it all.
        requests = list({params[0]: params for params in requests}.values())
        changes, changed, requests = self._changes(requests)
        conn.execute("BEGIN IMMEDIATE")
        try:
            try:
                for sql, values in changes.items():
                    conn.executemany(sql, values)
                keys = {params[0]: conn.execute(_UPSERT_REQUEST, params).fetchone()[0] for params in requests}
                upserted = changed | keys
                keys = known | keys
                missing = {row[0] for row in rows} - keys.keys()
                for request_id in missing:  # only when a summary row was refused: never lose its events
                    keys[request_id] = self._key(conn, request_id)
                conn.executemany(_INSERT_EVENT, [(keys[r[0]], *r[1:5]) for r in rows])
                search.stage_text(conn, self._keyed_texts(conn, texts, keys))
                if index:
                    search.index_staged(conn)
                    rollups.fold(conn)
            except _ROW_ERRORS:
                # Rare, so the slow row-by-row path is fine.
                conn.execute("ROLLBACK")
                conn.execute("BEGIN IMMEDIATE")
                upserted = dict(changed)
                for sql, values in changes.items():
                    for value in values:
                        try:
                            conn.execute(sql, value)
                        except _ROW_ERRORS as exc:
                            log.error("journal: summary update of key %s dropped: %s", value[-1], exc)
                for params in requests:
                    try:
                        upserted[params[0]] = conn.execute(_UPSERT_REQUEST, params).fetchone()[0]
                    except _ROW_ERRORS as exc:
                        log.error("journal: summary row %s dropped: %s", params[0], exc)
                keys = known | upserted
                rows = self._one_by_one(conn, rows, keys)
                search.stage_text(conn, self._keyed_texts(conn, texts, keys))
                if index:
                    search.index_staged(conn)
                    _fold_or_skip(conn)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return rows, upserted

    def _changes(self, requests: _Params) -> tuple[dict[str, list[tuple[Any, ...]]], dict[str, int], _Params]:
        """Split `requests` into updates and upserts. A summary already committed by this
        writer changes only the columns whose values differ from its last commit: an
        `UPDATE … WHERE rk = ?` of those columns (same merge rules as the upsert; a column sent
        again unchanged would merge to what it already holds), so SQLite rewrites only the
        indexes on them, not all of the table's. Returns the statements with their
        parameters, the keys of the requests they update, and the requests to upsert."""
        updates: dict[str, list[tuple[Any, ...]]] = {}
        updated: dict[str, int] = {}
        rest: _Params = []
        committed = self._committed
        for params in requests:
            last = committed.get(params[0])
            if last is None:
                rest.append(params)
                continue
            before, rk = last
            changed = tuple(i for i in range(1, len(params)) if params[i] != before[i])
            if changed:
                updates.setdefault(_update_sql(changed), []).append((*(params[i] for i in changed), rk))
                updated[params[0]] = rk
        return updates, updated, rest

    @staticmethod
    def _keyed_texts(conn: sqlite3.Connection, texts: _Texts, keys: dict[str, int]) -> list[tuple[int, str]]:
        """`(rowid, text)` for `journal.search.stage_text`; a request without a key here (its
        summary row refused, its events too) is looked up, and left out when it has no row."""
        keyed = []
        for text, request_id in texts:
            rk = keys.get(request_id)
            if rk is None:
                found = conn.execute("SELECT rk FROM requests WHERE id = ?", (request_id,)).fetchone()
                if found is None:
                    continue
                rk = found[0]
            keyed.append((rk, text))
        return keyed

    @staticmethod
    def _key(conn: sqlite3.Connection, request_id: str) -> int:
        conn.execute("INSERT INTO requests (id) VALUES (?) ON CONFLICT(id) DO NOTHING", (request_id,))
        return int(conn.execute("SELECT rk FROM requests WHERE id = ?", (request_id,)).fetchone()[0])

    def _one_by_one(self, conn: sqlite3.Connection, rows: _Rows, keys: dict[str, int]) -> _Rows:
        kept = []
        for row in rows:
            try:
                key = keys.get(row[0])
                if key is None:
                    key = keys[row[0]] = self._key(conn, row[0])
                conn.execute(_INSERT_EVENT, (key, *row[1:5]))
                kept.append(row)
            except _ROW_ERRORS as exc:
                self._events_refused += row[5]
                log.error("journal: event %s #%s dropped: %s", row[0], row[1], exc)
        return kept

    def _evict(self) -> None:
        # Requests that never complete (a crash mid-pipeline) must not grow memory forever.
        # Evicting is safe: the row is in the table and later upserts only fill it in.
        for inflight in (self._summaries, self._committed):
            excess = len(inflight) - _MAX_INFLIGHT
            if excess > 0:
                for request_id in list(inflight)[:excess]:
                    del inflight[request_id]


def _fold_or_skip(conn: sqlite3.Connection) -> None:
    """`rollups.fold`, where a value SQLite refuses costs the batch's rollups, not its events."""
    conn.execute("SAVEPOINT fold")
    try:
        rollups.fold(conn)
    except _ROW_ERRORS as exc:
        conn.execute("ROLLBACK TO fold")
        conn.execute(f"DELETE FROM {rollups.PENDING_TABLE}")
        log.error("journal: a batch's completed requests were left out of the rollups: %s", exc)
    conn.execute("RELEASE fold")


def _event_count(rows: _Rows) -> int:
    return sum(row[5] for row in rows)


_COLUMN_DEFAULTS = tuple(0 if col in schema.FLAG_COLUMNS else None for col in schema.REQUEST_COLUMNS)
_INT64 = 1 << 63


def _request_params(row: dict[str, Any]) -> tuple[Any, ...]:
    # Run per request and batch: a row whose values SQLite binds as they are (nearly every
    # one) is not passed through `_sql_value` value by value.
    values = tuple(map(row.get, schema.REQUEST_COLUMNS, _COLUMN_DEFAULTS))
    for value in values:
        if value is not None:
            kind = type(value)
            if not (kind is float or (kind is str and value.isascii()) or (kind is int and -_INT64 <= value < _INT64)):
                return tuple(map(_sql_value, values))
    return values


def _sql_value(value: Any) -> Any:
    """A summary value SQLite can bind: what an upstream body put there (a usage count past
    64 bits, a stop reason that is an object) must not fail the batch."""
    if value is None or isinstance(value, float):
        return value
    if isinstance(value, str):
        return clean_text(value)
    if isinstance(value, int):
        return int(value) if -(1 << 63) <= value < (1 << 63) else None
    return clean_text(orjson.dumps(value, default=_default).decode()) if isinstance(value, dict | list) else None


class NullJournal:
    """The journal for `--no-journal`: same interface, keeps nothing."""

    async def start(self) -> None:
        return None

    def offer(self, request_id: str, seq: int, event: Event) -> bool:
        return True

    async def append(self, request_id: str, seq: int, event: Event) -> None:
        return None

    async def flush(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def problem(self) -> str | None:
        return None

    @property
    def stats(self) -> dict[str, int]:
        return {"events_written": 0, "batches": 0, "max_batch_seen": 0, "queue_depth": 0}
