"""The local side of shipping: which completed requests of a local journal have not shipped yet.

The cursor is a table of the local SQLite file, `sink_queue (rk, queued)`: one row per
completed request not yet in PostgreSQL, filled by triggers on `requests` in the very
transaction in which the journal writer marks a request completed (so nothing the writer
commits can be missed, and the writer itself is unchanged), and emptied by the shipper once
PostgreSQL has committed the request. A crash between that commit and the delete ships the
request again, which PostgreSQL ignores (`journal.pg.ship` is idempotent on replica and id).
A completed request whose summary row changes later (closed as `interrupted` by recovery,
then its real completion written) is queued again and ships again: PostgreSQL then replaces
that request's row, events and text with the new ones, so both journals agree.
`queued` is when the request completed (epoch seconds): the oldest one is the shipping lag.

The table and its triggers exist only in files that ship (`install`, run when a gateway with
a sink starts; the first install queues every completed request already in the file, so a
journal's history ships too). A gateway started without a sink on such a file removes them
(`uninstall`), saying how many requests are left unshipped, so that a single gateway keeps its
file exactly as it would without one, but only while nobody holds the file's ship lock
(`ship_lock`: a live shipper holds it, and makes sure the queue is installed when it takes
it). They are not part of the journal's schema version:
a reader of the file never needs them. Retention (`journal.retention`) never deletes a
request that is still queued.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson

from journal import schema, search

TABLE = "sink_queue"
_NOW = "((julianday('now') - 2440587.5) * 86400.0)"
_QUEUE = f"INSERT OR IGNORE INTO {TABLE} (rk, queued) VALUES (NEW.rk, {_NOW})"
# A completed request whose summary changes (closed as interrupted, then its real completion
# written): queued again, with a `queued` later than the one a shipper may have read, so that
# its `done` for the older version leaves this one queued.
_REQUEUE = (
    f"INSERT OR REPLACE INTO {TABLE} (rk, queued) VALUES (NEW.rk,"
    f" max({_NOW}, coalesce((SELECT queued FROM {TABLE} WHERE rk = NEW.rk) + 0.000001, 0)))"
)
_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in schema.REQUEST_COLUMNS)
_ON_CHANGE = (
    f"CREATE TRIGGER IF NOT EXISTS {TABLE}_on_change AFTER UPDATE ON requests"
    f" WHEN OLD.completed = 1 AND ({_CHANGED}) BEGIN {_REQUEUE}; END"
)
_OBJECTS = (
    f"CREATE TABLE {TABLE} (rk INTEGER PRIMARY KEY, queued REAL NOT NULL)",
    f"CREATE INDEX {TABLE}_queued ON {TABLE} (queued)",
    f"CREATE TRIGGER {TABLE}_on_insert AFTER INSERT ON requests WHEN NEW.completed = 1 BEGIN {_QUEUE}; END",
    f"CREATE TRIGGER {TABLE}_on_update AFTER UPDATE OF completed ON requests"
    f" WHEN NEW.completed = 1 AND OLD.completed = 0 BEGIN {_QUEUE}; END",
    _ON_CHANGE,
)
_CHOSEN = "(SELECT value FROM json_each(?))"


def try_ship_lock(path: str) -> int | None:
    """An fd holding the exclusive ship lock of the journal at `path`, or None when another holds it."""
    fd = os.open(path + ".ship.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def ship_lock(journal_path: str | os.PathLike[str]) -> Iterator[bool]:
    """Hold the journal's ship lock for the block if nobody else does; yields whether it is held
    (False: a live shipper holds it)."""
    fd = try_ship_lock(os.fspath(journal_path))
    try:
        yield fd is not None
    finally:
        if fd is not None:
            os.close(fd)


def installed(conn: sqlite3.Connection) -> bool:
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    return found is not None


def install(conn: sqlite3.Connection) -> int:
    """Make the file ship (idempotent); how many requests the first install queued. `conn` is
    in autocommit mode, as `journal.schema.connect` opens it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if installed(conn):
            conn.execute(_ON_CHANGE)  # a file installed before summaries could change after completion
            conn.execute("COMMIT")
            return 0
        for statement in _OBJECTS:
            conn.execute(statement)
        queued = conn.execute(
            f"INSERT INTO {TABLE} (rk, queued) SELECT rk, {_NOW} FROM requests WHERE completed = 1"
        ).rowcount
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return int(queued)


def uninstall(conn: sqlite3.Connection) -> int:
    """Stop queueing (idempotent); how many requests were still unshipped."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        if not installed(conn):
            conn.execute("COMMIT")
            return 0
        left = int(conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])
        conn.execute(f"DROP TRIGGER IF EXISTS {TABLE}_on_insert")
        conn.execute(f"DROP TRIGGER IF EXISTS {TABLE}_on_update")
        conn.execute(f"DROP TRIGGER IF EXISTS {TABLE}_on_change")
        conn.execute(f"DROP TABLE {TABLE}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return left


def backlog(conn: sqlite3.Connection) -> tuple[int, float | None]:
    """`(unshipped requests, when the oldest of them completed)`."""
    count = int(conn.execute(f"SELECT count(*) FROM {TABLE}").fetchone()[0])
    oldest = conn.execute(f"SELECT min(queued) FROM {TABLE}").fetchone()[0]
    return count, oldest


def next_keys(conn: sqlite3.Connection, limit: int, after: int | None = None) -> list[int]:
    """The keys of up to `limit` unshipped requests, oldest arrival (lowest key) first; only
    those above `after` when given (the batch in flight ends there)."""
    sql = f"SELECT rk FROM {TABLE} WHERE rk > ? ORDER BY rk LIMIT ?"
    return [row[0] for row in conn.execute(sql, (-1 if after is None else after, limit))]


def done(conn: sqlite3.Connection, versions: list[tuple[int, float]]) -> None:
    """Forget the requests PostgreSQL has committed: `(rk, queued)` as `read` found them (one
    queued again since, its summary changed, stays queued)."""
    conn.execute("BEGIN")
    try:
        conn.executemany(f"DELETE FROM {TABLE} WHERE rk = ? AND queued = ?", versions)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


@dataclass
class Batch:
    """The requests to ship, read from the local file as it stores them.

    `requests`: `(local rk, *schema.REQUEST_COLUMNS)`; `events`: `(local rk, seq, kind, t,
    data)` with `data` the stored JSON text or packed bytes; `texts`: `(local rk, body)`."""

    keys: list[int]
    requests: list[tuple[Any, ...]]
    events: list[tuple[Any, ...]]
    texts: list[tuple[int, str]]
    queued: list[tuple[int, float]]  # (rk, queued) of the keys still queued when read: `done`


_REQUESTS = f"SELECT rk, {', '.join(schema.REQUEST_COLUMNS)} FROM requests WHERE rk IN {_CHOSEN}"
_EVENTS = f"SELECT rk, seq, kind, t, data FROM events WHERE rk IN {_CHOSEN} ORDER BY rk, seq"
_TEXTS = f"SELECT rowid, body FROM {search.TABLE} WHERE rowid IN {_CHOSEN}"
# A request completed within the writer's index interval has its text staged, not indexed yet.
_STAGED_TEXTS = f"SELECT rk, body FROM {search.STAGED_TABLE} WHERE rk IN {_CHOSEN}"
_QUEUED = f"SELECT rk, queued FROM {TABLE} WHERE rk IN {_CHOSEN}"


def read(conn: sqlite3.Connection, keys: list[int]) -> Batch:
    """The summary rows, events and text of `keys`, in one read transaction (a consistent view).
    A key whose request is gone (pruned by hand) reads as nothing and is simply done."""
    chosen = (orjson.dumps(keys).decode(),)
    conn.execute("BEGIN")
    try:
        requests = conn.execute(_REQUESTS, chosen).fetchall()
        events = conn.execute(_EVENTS, chosen).fetchall()
        texts = conn.execute(_TEXTS, chosen).fetchall() if search.has_index(conn) else []
        if search.has_staging(conn):
            texts += conn.execute(_STAGED_TEXTS, chosen).fetchall()
        queued = conn.execute(_QUEUED, chosen).fetchall()
    finally:
        conn.execute("COMMIT")
    return Batch(keys, requests, events, texts, queued)
