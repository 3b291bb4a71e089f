"""Retention: deleting the oldest requests of a journal by age and/or size.

`prune` deletes whole requests, oldest first (by arrival time): a request's events, its text
row and its summary row go in one transaction, never part of one (and are taken out of the
rollups, `journal.rollups`, in it). Deletion runs in short
transactions (each sized to take about `TRANSACTION_S`, from the time the ones before took) so
that a gateway writing the same file waits at most one of them. A request that has not
completed and arrived less than `INFLIGHT_GRACE_S` ago is never deleted: it may still be in
flight, and deleting it would leave the rest of its events without their start. In a file
that ships to a fleet journal (`journal.pg.outbox`), a request that has completed but not
shipped yet is never deleted either: the prune says how many it kept (a log line, and
`unshipped_kept`), and a later one deletes them once they have shipped.

Size is the space the data occupies, `(page_count - freelist_count) * page_size`: pages freed
by a deletion stay in the file and are reused by later writes (a gateway pruning as it writes
keeps its file at about the size it allows). With `shrink`, on journals created by this version
(incremental auto-vacuum), `prune` also gives them back to the OS, so the file shrinks to about
the data's size: SQLite moves each page from the end of the file into a freed one, in steps,
which costs about as much again as the deletion.

Used by `smg journal prune` and, periodically, by the gateway's journal writer
(`--journal-retention`).
"""

from __future__ import annotations

import logging
import os
import re
import sqlite3
import time
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from journal import packed, rollups, schema, search

log = logging.getLogger(__name__)

INFLIGHT_GRACE_S = 3600.0
TRANSACTION_S = 0.25
"""What one delete transaction aims to take: the longest a gateway writing the file waits for it."""
PAUSE_S = 0.05
"""The pause after each delete transaction, in which a waiting writer takes its turn."""
_CHUNK, _CHUNK_MIN, _CHUNK_MAX = 500, 50, 20_000  # requests per delete transaction: first, least, most
_CACHE_KIB = 128 * 1024
_CHECKPOINT_REQUESTS = 10_000  # deleted requests between checkpoints: ~20 KB of log each at 1M requests
_VACUUM_PAGES = 1000  # pages given back to the OS per transaction
_AGE_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_SIZE_UNITS = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_PART = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]+)\s*")


@dataclass(frozen=True)
class PruneResult:
    """What one `prune` did. Sizes are the bytes the data occupies (see the module docstring)."""

    requests_deleted: int
    events_deleted: int
    bytes_before: int
    bytes_after: int
    unshipped_kept: int = 0
    """Requests old enough (or, by size, in the way) to delete, kept because they have not shipped
    to the fleet journal yet (`journal.pg.outbox`): a later prune deletes them once they have."""


def parse_age(text: str) -> float:
    """`30s`, `15m`, `12h`, `7d`, `2w` → seconds."""
    match = _PART.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _AGE_UNITS:
        raise ValueError(f"{text!r} is not an age (a number and s, m, h, d or w: 7d)")
    seconds = float(match.group(1)) * _AGE_UNITS[unit]
    if seconds <= 0:
        raise ValueError(f"{text!r}: an age must be positive")
    return seconds


def parse_size(text: str) -> int:
    """`500MB`, `2GB`, `1.5GiB` → bytes (KB, MB, GB, TB are powers of 1000; KiB… of 1024)."""
    match = _PART.fullmatch(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _SIZE_UNITS:
        raise ValueError(f"{text!r} is not a size (a number and B, KB, MB, GB, TB, KiB, MiB, GiB or TiB: 500MB)")
    size = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if size <= 0:
        raise ValueError(f"{text!r}: a size must be positive")
    return size


def parse_retention(text: str) -> tuple[float | None, int | None]:
    """A `--journal-retention` value: an age, a size or both, comma-separated (`7d`, `500MB`,
    `7d,2GB`) → `(max_age_s, max_bytes)`. Raises ValueError."""
    max_age: float | None = None
    max_bytes: int | None = None
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or any(not p for p in parts):
        raise ValueError(f"{text!r}: expected an age (7d), a size (500MB) or both (7d,2GB)")
    for part in parts:
        match = _PART.fullmatch(part)
        if match and match.group(2).lower() in _AGE_UNITS:
            if max_age is not None:
                raise ValueError(f"{text!r}: two ages")
            max_age = parse_age(part)
        else:
            if max_bytes is not None:
                raise ValueError(f"{text!r}: two sizes")
            try:
                max_bytes = parse_size(part)
            except ValueError:
                raise ValueError(
                    f"{part!r} is neither an age (7d: s, m, h, d, w) nor a size (500MB: B, KB, MB, GB, TB, KiB…)"
                ) from None
    return max_age, max_bytes


def used_bytes(conn: sqlite3.Connection) -> int:
    """The bytes the data occupies: pages in use times the page size."""
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    free = conn.execute("PRAGMA freelist_count").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int((pages - free) * size)


def _delete_oldest(conn: sqlite3.Connection, limit: int, before: float | None, protect_after: float) -> tuple[int, int]:
    """Delete the `limit` oldest deletable requests (arrival before `before`, if given), their
    events, text rows and summary rows, in one transaction: `(requests, events)` deleted.

    The rows go by integer key (`rk`), in key order, so each table and index is walked in the
    order it was written; the keys travel as one JSON array (no limit on how many)."""
    sql = "SELECT rk FROM requests WHERE (completed = 1 OR ts IS NULL OR ts < ?)"
    params: list[object] = [protect_after]
    if _ships(conn):
        sql += f" AND rk NOT IN (SELECT rk FROM {_SINK_QUEUE})"
    if before is not None:
        sql += " AND (ts IS NULL OR ts < ?)"
        params.append(before)
    sql += " ORDER BY ts, rk LIMIT ?"
    params.append(limit)
    conn.execute("BEGIN IMMEDIATE")
    try:
        keys = sorted(row[0] for row in conn.execute(sql, params))
        if not keys:
            conn.execute("COMMIT")
            return 0, 0
        doomed = (orjson.dumps(keys).decode(),)
        chosen = "(SELECT value FROM json_each(?))"
        # A packed row holds several events: count what it holds, not the row.
        runs = conn.execute(f"SELECT data FROM events WHERE rk IN {chosen} AND kind = '{packed.RUN_KIND}'", doomed)
        held = sum(packed.count(data) - 1 for (data,) in runs)
        events = conn.execute(f"DELETE FROM events WHERE rk IN {chosen}", doomed).rowcount + held
        if search.has_index(conn):
            conn.execute(f"DELETE FROM {search.TABLE} WHERE rowid IN {chosen}", doomed)
        if search.has_staging(conn):
            conn.execute(f"DELETE FROM {search.STAGED_TABLE} WHERE rk IN {chosen}", doomed)
        if rollups.present(conn):  # the rollups describe the requests the file holds
            rollups.discount(conn, f"rk IN {chosen}", doomed)
        conn.execute(f"DELETE FROM requests WHERE rk IN {chosen}", doomed)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return len(keys), int(events)


_SINK_QUEUE = "sink_queue"  # journal.pg.outbox.TABLE: requests completed and not yet shipped


def _ships(conn: sqlite3.Connection) -> bool:
    """Whether the file ships to a fleet journal (`journal.pg.outbox`)."""
    found = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (_SINK_QUEUE,))
    return found.fetchone() is not None


def _unshipped_due(conn: sqlite3.Connection, before: float | None) -> int:
    """Unshipped requests that retention would have deleted (arrived before `before`; any, when None)."""
    if not _ships(conn):
        return 0
    if before is None:
        return int(conn.execute(f"SELECT count(*) FROM {_SINK_QUEUE}").fetchone()[0])
    sql = f"SELECT count(*) FROM {_SINK_QUEUE} q JOIN requests r ON r.rk = q.rk WHERE r.ts < ?"
    return int(conn.execute(sql, (before,)).fetchone()[0])


class _Pace:
    """How many requests the next delete transaction takes: as many as fit in `TRANSACTION_S`,
    measured on the ones before (the cost per request depends on the file and the machine).
    Between two transactions it pauses, and now and then checkpoints the write-ahead log."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn
        self.size = _CHUNK
        self.since_checkpoint = 0

    def timed(self, run: Callable[[int], tuple[int, int]], limit: int) -> tuple[int, int]:
        started = time.monotonic()
        done = run(min(limit, self.size))
        elapsed = time.monotonic() - started
        if done[0] >= self.size:
            aim = self.size * TRANSACTION_S / max(elapsed, 1e-3)
            self.size = int(max(self.size / 2, min(aim, self.size * 2, _CHUNK_MAX)))
            self.size = max(_CHUNK_MIN, self.size)
        self.since_checkpoint += done[0]
        if self.since_checkpoint >= _CHECKPOINT_REQUESTS:
            # Outside any transaction: a checkpoint holds no lock a writer needs.
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
            self.since_checkpoint = 0
        # A writer waiting for the lock polls it (SQLite's busy handler sleeps 1 to 100 ms between
        # looks): taking it again at once would starve the gateway, whose look would find it taken
        # every time.
        time.sleep(PAUSE_S)
        return done


def _tune(conn: sqlite3.Connection) -> Callable[[], None]:
    """A page cache that holds the indexes being pruned (each delete transaction then reads
    them from memory, not from the file), temporary results in memory, and no automatic
    checkpoints: `_Pace` checkpoints every `_CHECKPOINT_REQUESTS` deleted requests (a page
    deleted from in many transactions is copied back to the file once per checkpoint instead
    of once per transaction, and the time is not counted as a transaction's); returns what
    puts the connection's settings back."""
    saved = {name: conn.execute(f"PRAGMA {name}").fetchone()[0] for name in ("cache_size", "temp_store")}
    saved["wal_autocheckpoint"] = conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0]
    conn.execute(f"PRAGMA cache_size = -{_CACHE_KIB}")
    conn.execute("PRAGMA temp_store = MEMORY")
    conn.execute("PRAGMA wal_autocheckpoint = 0")

    def restore() -> None:
        for name, value in saved.items():
            conn.execute(f"PRAGMA {name} = {int(value)}")

    return restore


def prune_connection(
    conn: sqlite3.Connection,
    *,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
    shrink: bool = False,
) -> PruneResult:
    """`prune` on an open connection (autocommit mode, as `schema.connect` opens it)."""
    now = time.time() if now is None else now
    protect_after = now - INFLIGHT_GRACE_S
    before = used_bytes(conn)
    requests = events = kept = 0
    pace = _Pace(conn)
    restore = _tune(conn)
    try:
        if max_age_s is not None:
            cutoff = now - max_age_s
            while True:
                done, held = pace.timed(lambda n: _delete_oldest(conn, n, cutoff, protect_after), _CHUNK_MAX)
                if not done:
                    break
                requests += done
                events += held
            kept = _unshipped_due(conn, cutoff)
        if max_bytes is not None:
            size = used_bytes(conn)
            # Counted once: counting every round is a scan of the table per transaction.
            count = conn.execute("SELECT count(*) FROM requests").fetchone()[0] if size > max_bytes else 0
            while size > max_bytes and count > 0:
                # Aim from the average request size; the loop re-measures, so a rough aim only
                # costs another round.
                share = (size - max_bytes) / size
                aim = max(1, int(count * share * 1.1) + 1)
                done, held = pace.timed(lambda n: _delete_oldest(conn, n, None, protect_after), aim)
                if not done:
                    break
                requests += done
                events += held
                count -= done
                size = used_bytes(conn)
            if size > max_bytes:
                kept = max(kept, _unshipped_due(conn, None))
        if shrink and conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # incremental
            # In steps: one long vacuum transaction would hold up the gateway's writer.
            free = conn.execute("PRAGMA freelist_count").fetchone()[0]
            for _ in range(free // _VACUUM_PAGES + 1):
                conn.executescript(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})")
                time.sleep(PAUSE_S)  # a waiting writer's turn, as between deletions
        if requests:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    finally:
        restore()
    if kept:
        log.warning(
            "journal: retention kept %d requests that have not shipped to the fleet journal yet;"
            " they are deleted once shipped",
            kept,
        )
    return PruneResult(requests, events, before, used_bytes(conn), kept)


def prune(
    path: str | os.PathLike[str],
    *,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
    shrink: bool = False,
) -> PruneResult:
    """Delete whole requests, oldest first, until none is older than `max_age_s` seconds and
    the data occupies at most `max_bytes` (see the module docstring); `shrink`: give the freed
    pages back to the OS. Raises FileNotFoundError when there is no journal at `path` (it never
    creates one)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no journal at {os.fspath(path)}")
    conn = schema.connect(path)
    try:
        return prune_connection(conn, max_age_s=max_age_s, max_bytes=max_bytes, now=now, shrink=shrink)
    finally:
        conn.close()
