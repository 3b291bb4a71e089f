"""The fleet journal's day partitions: created ahead as shipping needs them, dropped whole by retention.

A partition covers one UTC day, `[day, day + 1)`, and is named `<table>_pYYYYMMDD`; each of
`TABLES` has one per day, so a day is dropped from all of them in one transaction. Creating
one takes a lock on its parent table, so the shipper creates them ahead (today and the next
`AHEAD` days) rather than at midnight under load, and remembers which exist. Two replicas
creating the same day serialize on an advisory lock.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

TABLES: tuple[str, ...] = ("requests", "events", "request_text")
"""The partitioned tables, parents first (a day's partitions are created in this order, dropped in the reverse)."""
AHEAD = 2
"""Days created ahead of today."""
UNDATED = date(1970, 1, 1)
"""The day of a request whose arrival time was never journaled (or is no time at all)."""
_LOCK = 0x534D4750  # advisory lock key ("SMGP") held while creating or dropping partitions
_NAME = re.compile(r"^(?P<table>[a-z_]+)_p(?P<day>\d{8})$")


def day_of(ts: float | None) -> date:
    """The partition day of a request that arrived at `ts` (epoch seconds)."""
    if ts is None or not math.isfinite(ts):
        return UNDATED
    try:
        return datetime.fromtimestamp(ts, UTC).date()
    except (OverflowError, OSError, ValueError):  # a time no calendar day holds: filed as undated
        return UNDATED


def name(table: str, day: date) -> str:
    return f"{table}_p{day:%Y%m%d}"


def _tables(conn: psycopg.Connection[Any]) -> tuple[str, ...]:
    present = {
        row[0]
        for row in conn.execute(
            "SELECT c.relname FROM pg_class c WHERE c.relkind = 'p' AND c.relname = ANY(%s)"
            " AND c.relnamespace = current_schema()::regnamespace",
            (list(TABLES),),
        )
    }
    return tuple(t for t in TABLES if t in present)


def existing(conn: psycopg.Connection[Any]) -> dict[str, set[date]]:
    """The days each partitioned table has a partition for."""
    out: dict[str, set[date]] = {t: set() for t in _tables(conn)}
    rows = conn.execute(
        "SELECT parent.relname, child.relname FROM pg_inherits i"
        " JOIN pg_class parent ON parent.oid = i.inhparent JOIN pg_class child ON child.oid = i.inhrelid"
        " WHERE parent.relname = ANY(%s) AND parent.relnamespace = current_schema()::regnamespace",
        (list(TABLES),),
    ).fetchall()
    for parent, child in rows:
        match = _NAME.match(child)
        if match and match["table"] == parent and parent in out:
            out[parent].add(datetime.strptime(match["day"], "%Y%m%d").date())
    return out


def days(conn: psycopg.Connection[Any]) -> list[date]:
    """The days the journal has partitions for (of `requests`), oldest first."""
    return sorted(existing(conn).get("requests", set()))


def ensure(conn: psycopg.Connection[Any], wanted: Iterable[date]) -> list[date]:
    """Create the partitions of the `wanted` days that are missing (in one transaction of its
    own, committed; `conn` must not be inside one). Returns the days created."""
    wanted = sorted(set(wanted))
    created: list[date] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        have = existing(conn)
        for day in wanted:
            fresh = False
            for table in have:
                if day in have[table]:
                    continue
                conn.execute(
                    sql.SQL("CREATE TABLE {} PARTITION OF {} FOR VALUES FROM ({}) TO ({})").format(
                        sql.Identifier(name(table, day)),
                        sql.Identifier(table),
                        sql.Literal(day.isoformat()),
                        sql.Literal((day + timedelta(days=1)).isoformat()),
                    )
                )
                fresh = True
            if fresh:
                created.append(day)
    return created


def ahead(today: date | None = None) -> list[date]:
    """Today (UTC) and the `AHEAD` days after it."""
    start = today or datetime.now(UTC).date()
    return [start + timedelta(days=i) for i in range(AHEAD + 1)]


def drop_before(conn: psycopg.Connection[Any], cutoff: date) -> list[date]:
    """Drop every day older than `cutoff` (its partitions of every table, with all their rows),
    in one transaction; the days dropped. This is the fleet journal's retention: no row is
    deleted one by one. The rollup rows of those days go in the same transaction
    (`journal.pg.rollups`: dropping a table fires no trigger)."""
    dropped: list[date] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
        found = conn.execute("SELECT to_regclass('rollups') IS NOT NULL").fetchone()
        if found and found[0]:
            conn.execute("DELETE FROM rollups WHERE day < %s", (cutoff,))
        have = existing(conn)
        old = sorted({day for table_days in have.values() for day in table_days if day < cutoff})
        for day in old:
            for table in reversed(tuple(have)):
                if day in have[table]:
                    conn.execute(sql.SQL("DROP TABLE {}").format(sql.Identifier(name(table, day))))
            dropped.append(day)
    return dropped
