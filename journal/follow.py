"""Following a journal: which requests completed since the last look (`smg journal tail`).

A request's summary row appears with its first event and is completed later, and the filter
(an SQL boolean expression over `requests`, as `journal.query.compile_query` makes it) may
depend on columns only known at the end (status, tokens), so it is applied to a request once
it has completed, never when it first shows up. Each `poll` reads only rows that arrived
since the previous one plus the requests still in flight; nothing scans the whole table.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable, Sequence
from typing import Any

_CHUNK = 500  # ids per `IN (…)`: far below SQLite's variable limit


class Follower:
    """Yields the ids of requests that complete after it was created, matching `where`.

    `lag` (seconds) re-reads a short window before the newest arrival seen, because rows are
    not committed in exact arrival order (concurrent requests). A request still in flight
    `horizon` seconds after it arrived is given up on (a gateway that crashed never completes
    it).
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        where: str = "",
        params: Sequence[Any] = (),
        *,
        lag: float = 5.0,
        horizon: float = 3600.0,
        now: float | None = None,
    ) -> None:
        self._conn = conn
        self._where = f"({where})" if where.strip() else "1"
        self._params = list(params)
        self._lag = lag
        self._horizon = horizon
        start = time.time() if now is None else now
        self._cursor = start - lag
        # What is already there is history: only requests in flight now may still be shown.
        self._waiting = dict(
            conn.execute("SELECT id, ts FROM requests WHERE ts > ? AND completed = 0", (start - horizon,)).fetchall()
        )
        self._recent = dict(conn.execute("SELECT id, ts FROM requests WHERE ts > ?", (self._cursor,)).fetchall())
        self._cursor = max([self._cursor, *self._recent.values()])

    @property
    def in_flight(self) -> int:
        """Requests seen but not completed yet."""
        return len(self._waiting)

    def poll(self, now: float | None = None) -> list[str]:
        """Ids of the matching requests that completed since the last poll, by arrival time."""
        now = time.time() if now is None else now
        done: list[str] = []
        rows = self._conn.execute(
            "SELECT id, ts, completed FROM requests WHERE ts > ? ORDER BY ts", (self._cursor - self._lag,)
        ).fetchall()
        for request_id, ts, completed in rows:
            if request_id in self._recent or ts is None:
                continue
            self._recent[request_id] = ts
            if completed:
                done.append(request_id)
            else:
                self._waiting[request_id] = ts
        if rows:
            self._cursor = max(self._cursor, max(ts for _, ts, _ in rows if ts is not None))
        floor = self._cursor - self._lag
        self._recent = {k: ts for k, ts in self._recent.items() if ts > floor}

        finished = self._select("completed = 1", self._waiting)
        done.extend(finished)
        for request_id in finished:
            del self._waiting[request_id]
        give_up = now - self._horizon
        self._waiting = {k: ts for k, ts in self._waiting.items() if ts > give_up}

        return self._select(self._where, done, self._params)

    def _select(self, condition: str, ids: Iterable[str], params: Sequence[Any] = ()) -> list[str]:
        """The ids among `ids` whose row satisfies `condition`, by arrival."""
        ids = list(ids)
        out: list[tuple[float, str]] = []
        for i in range(0, len(ids), _CHUNK):
            chunk = ids[i : i + _CHUNK]
            marks = ", ".join("?" * len(chunk))
            out.extend(
                self._conn.execute(
                    f"SELECT ts, id FROM requests WHERE {condition} AND id IN ({marks})", [*params, *chunk]
                ).fetchall()
            )
        return [request_id for _, request_id in sorted(out)]
