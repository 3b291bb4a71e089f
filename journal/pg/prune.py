"""`smg journal prune` on the fleet journal: whole days dropped, the boundary day trimmed.

`--older-than AGE` drops every day partition (of `requests`, `events` and `request_text`
together: `journal.pg.partitions.drop_before`) that ends before the cutoff, and deletes the
requests of the day the cutoff falls in that arrived before it, with their events and text,
in one transaction. `--max-size SIZE` drops the oldest whole days until the three tables
occupy at most SIZE (their partitions' `pg_total_relation_size`: table, indexes, TOAST),
never the day that holds the newest request: its granularity is the day. `--shrink` has
nothing to do: a dropped partition's space goes back to the file system at once, and rows
deleted from the boundary day are reused by PostgreSQL's vacuum. Only completed requests
are ever shipped, so none of them is in flight.
"""

from __future__ import annotations

import time
from datetime import date, timedelta
from typing import Any

import psycopg
from psycopg import sql

from journal import packed
from journal.pg import partitions
from journal.retention import PruneResult


def used_bytes(conn: psycopg.Connection[Any]) -> int:
    """What the partitions of the fleet journal's tables occupy, indexes and TOAST included."""
    row = conn.execute(
        "SELECT COALESCE(sum(pg_total_relation_size(i.inhrelid)), 0) FROM pg_inherits i"
        " JOIN pg_class parent ON parent.oid = i.inhparent"
        " WHERE parent.relname = ANY(%s) AND parent.relnamespace = current_schema()::regnamespace",
        (list(partitions.TABLES),),
    ).fetchone()
    return int(row[0]) if row else 0


def _day_bytes(conn: psycopg.Connection[Any], day: date) -> int:
    total = 0
    for table in partitions.TABLES:
        row = conn.execute("SELECT pg_total_relation_size(to_regclass(%s))", (partitions.name(table, day),)).fetchone()
        total += int(row[0]) if row and row[0] is not None else 0
    return total


def _held(conn: psycopg.Connection[Any], condition: sql.Composable, params: dict[str, Any]) -> int:
    """How many events more than rows the packed runs matching `condition` hold (a run is one
    row of several events: counted as what it holds, as the local prune counts)."""
    extra = 0
    with conn.cursor(name="smg_prune_runs") as cur:
        cur.execute(
            sql.SQL("SELECT data FROM events WHERE kind = {} AND ").format(sql.Literal(packed.RUN_KIND)) + condition,
            params,
        )
        for (data,) in cur:
            extra += packed.count(bytes(data)) - 1
    return extra


def _counts(conn: psycopg.Connection[Any], days: list[date]) -> tuple[int, int]:
    """Requests and events (those packed runs hold counted one by one) in these days."""
    row = conn.execute(
        "SELECT (SELECT count(*) FROM requests WHERE day = ANY(%(days)s)),"
        " (SELECT count(*) FROM events WHERE day = ANY(%(days)s))",
        {"days": days},
    ).fetchone()
    requests, events = (int(row[0]), int(row[1])) if row else (0, 0)
    with conn.transaction():  # a named cursor lives in a transaction
        events += _held(conn, sql.SQL("day = ANY(%(days)s)"), {"days": days})
    return requests, events


def _drop(conn: psycopg.Connection[Any], cutoff: date) -> tuple[int, int]:
    old = [day for day in partitions.days(conn) if day < cutoff]
    if not old:
        return 0, 0
    counted = _counts(conn, old)
    partitions.drop_before(conn, cutoff)
    return counted


_DOOMED = "day = %(day)s AND rk IN (SELECT rk FROM requests WHERE day = %(day)s AND ts < %(cutoff)s)"
_TRIM = """
WITH gone AS (
    DELETE FROM requests WHERE day = %(day)s AND ts < %(cutoff)s RETURNING rk
), gone_text AS (
    DELETE FROM request_text WHERE day = %(day)s AND rk IN (SELECT rk FROM gone) RETURNING 1
), gone_events AS (
    DELETE FROM events WHERE day = %(day)s AND rk IN (SELECT rk FROM gone) RETURNING 1
)
SELECT (SELECT count(*) FROM gone), (SELECT count(*) FROM gone_events), (SELECT count(*) FROM gone_text)
"""


def prune(
    url: str, *, max_age_s: float | None = None, max_bytes: int | None = None, now: float | None = None
) -> PruneResult:
    """Prune the fleet journal at `url` (see the module docstring). Raises `psycopg.Error`
    when the server cannot be reached or refuses."""
    now = time.time() if now is None else now
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
        before = used_bytes(conn)
        requests = events = 0
        if max_age_s is not None:
            cutoff = now - max_age_s
            boundary = partitions.day_of(cutoff)
            dropped, held = _drop(conn, boundary)
            requests, events = requests + dropped, events + held
            trim = {"day": boundary, "cutoff": cutoff}
            with conn.transaction():
                held = _held(conn, sql.SQL(_DOOMED), trim)
                row = conn.execute(_TRIM, trim).fetchone()
            if row:
                requests, events = requests + int(row[0]), events + int(row[1]) + held
        if max_bytes is not None:
            days = partitions.days(conn)
            newest = conn.execute("SELECT max(day) FROM requests").fetchone()
            keep = newest[0] if newest and newest[0] is not None else max(days, default=None)
            size = used_bytes(conn)
            for day in days:
                if size <= max_bytes or keep is None or day >= keep:
                    break
                size -= _day_bytes(conn, day)
                dropped, held = _drop(conn, day + timedelta(days=1))
                requests, events = requests + dropped, events + held
        return PruneResult(requests, events, before, used_bytes(conn))
