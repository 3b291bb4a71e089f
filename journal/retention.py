"""Retention: deleting the oldest requests of a journal by age and/or size.

`prune` deletes whole requests, oldest first (by arrival time): a request's events and its
summary row go in one transaction, never part of one. Deletion runs in small transactions so
that a gateway writing the same file waits at most one of them. A request that has not
completed and arrived less than `INFLIGHT_GRACE_S` ago is never deleted: it may still be in
flight, and deleting it would leave the rest of its events without their start.

Size is the space the data occupies, `(page_count - freelist_count) * page_size`: pages freed
by a deletion are reused by later writes, and on journals created by this version (incremental
auto-vacuum) `prune` also gives them back to the OS, so the file shrinks to about that size.

Used by `smg journal prune` and, periodically, by the gateway's journal writer
(`--journal-retention`).
"""

from __future__ import annotations

import os
import re
import sqlite3
import time
from dataclasses import dataclass

from journal import packed, schema, search

INFLIGHT_GRACE_S = 3600.0
_CHUNK = 500  # requests per delete transaction
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


def _oldest(conn: sqlite3.Connection, limit: int, before: float | None, protect_after: float) -> list[str]:
    """Ids of the oldest deletable requests (arrival before `before`, if given)."""
    sql = "SELECT id FROM requests WHERE (completed = 1 OR ts IS NULL OR ts < ?)"
    params: list[object] = [protect_after]
    if before is not None:
        sql += " AND (ts IS NULL OR ts < ?)"
        params.append(before)
    sql += " ORDER BY ts, rowid LIMIT ?"
    params.append(limit)
    return [row[0] for row in conn.execute(sql, params)]


def _delete(conn: sqlite3.Connection, ids: list[str]) -> int:
    """Delete these requests, events and summary rows, in one transaction; the events count."""
    marks = ", ".join("?" * len(ids))
    conn.execute("BEGIN IMMEDIATE")
    try:
        keys = f"SELECT rk FROM requests WHERE id IN ({marks})"
        # A packed row holds several events: count what it holds, not the row.
        runs = conn.execute(f"SELECT data FROM events WHERE kind = '{packed.RUN_KIND}' AND rk IN ({keys})", ids)
        held = sum(packed.count(data) - 1 for (data,) in runs)
        events = conn.execute(f"DELETE FROM events WHERE rk IN ({keys})", ids).rowcount + held
        search.delete_text(conn, ids)
        conn.execute(f"DELETE FROM requests WHERE id IN ({marks})", ids)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return int(events)


def prune_connection(
    conn: sqlite3.Connection,
    *,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
) -> PruneResult:
    """`prune` on an open connection (autocommit mode, as `schema.connect` opens it)."""
    now = time.time() if now is None else now
    protect_after = now - INFLIGHT_GRACE_S
    before = used_bytes(conn)
    requests = events = 0
    if max_age_s is not None:
        cutoff = now - max_age_s
        while ids := _oldest(conn, _CHUNK, cutoff, protect_after):
            events += _delete(conn, ids)
            requests += len(ids)
    if max_bytes is not None:
        size = used_bytes(conn)
        # Counted once: counting every round is a scan of the table per 500 requests deleted.
        count = conn.execute("SELECT count(*) FROM requests").fetchone()[0] if size > max_bytes else 0
        while size > max_bytes:
            if count <= 0:
                break
            # Aim from the average request size; the loop re-measures, so a rough aim only
            # costs another round.
            share = (size - max_bytes) / size
            ids = _oldest(conn, max(1, min(_CHUNK, int(count * share * 1.1) + 1)), None, protect_after)
            if not ids:
                break
            events += _delete(conn, ids)
            requests += len(ids)
            count -= len(ids)
            size = used_bytes(conn)
    if requests and conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:  # incremental
        # In steps: one long vacuum transaction would hold up the gateway's writer.
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        for _ in range(free // _VACUUM_PAGES + 1):
            conn.executescript(f"PRAGMA incremental_vacuum({_VACUUM_PAGES})")
    return PruneResult(requests, events, before, used_bytes(conn))


def prune(
    path: str | os.PathLike[str],
    *,
    max_age_s: float | None = None,
    max_bytes: int | None = None,
    now: float | None = None,
) -> PruneResult:
    """Delete whole requests, oldest first, until none is older than `max_age_s` seconds and
    the data occupies at most `max_bytes` (see the module docstring). Raises FileNotFoundError
    when there is no journal at `path` (it never creates one)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no journal at {os.fspath(path)}")
    conn = schema.connect(path)
    try:
        return prune_connection(conn, max_age_s=max_age_s, max_bytes=max_bytes, now=now)
    finally:
        conn.close()
