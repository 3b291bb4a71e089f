"""Rollups: the completed requests counted per minute and breakdown, kept by the journal itself.

`rollups` holds one row per minute (and per hour, and per day: `GRAINS`) of arrival and
combination of the columns a breakdown or a
filter names (`DIMENSIONS`: model, tenant, key, worker, backend, status, error code and type,
stop reason, stream, hung up, cut), with the sums `journal.stats` and `journal.groups` need:
requests, tokens, cost, duration and time-to-first-event counts, sums and maxima, output rate.
Each rollup row also has its latency sketches (`journal.sketch`: counts per log-scale bucket
of the duration, the time to the first event and the output rate) as one value per metric
(`SKETCHES`, in `rollup_sketches` under the row's `rid`), which merge by addition, so any
range and breakdown reads and adds rows, never requests, and a row's cost does not grow with
the spread of its latencies.

Counting happens in batches, grouped (`fold`): the writer folds about once a second, at the end
of whichever batch's transaction is due (`journal.writer`), prune before it deletes. What to
fold is noted by
small SQL triggers on `requests`, one plain insert into `rollup_pending` each: the values of a
row that becomes `completed` (sign 1), and, for the rare completed row that changes afterwards
(a request closed as interrupted and then completed, a late event, a price set later), its
old values (sign -1) and its new ones. `fold` adds the noted rows into the rollups by group (a
few upserts for all the notes, not a dozen per request) and empties the table, in the same
transaction; notes not folded yet stay in the table, committed, for the next fold. Whoever
reads the rollups right after writing `requests` (a tool, a test) calls `fold` first.
Requests in flight are not in the rollups: a query reads them from the summary table through
the partial index `requests_in_flight`, which holds only them.

Pruning (`journal.retention`) subtracts the requests it deletes (`discount`) in its own
transaction: the rollups always describe the requests the file holds, and a scan of the same
selection gives the same counts and sums. Max durations are kept as maxima (a subtraction
cannot lower one), so after a prune or a moved row a max is an upper bound. A row a
subtraction empties is deleted.

The sums and sketches are computed in Python (the same code for the writer's fold, prune and
the migration's backfill); the upsert merges a stored sketch with SQL function
`smg_sketch_add` (`register`, which `journal.schema.connect` calls on every connection it opens).
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from journal import sketch

TABLE = "rollups"
SKETCHES_TABLE = "rollup_sketches"
"""The sketches of each rollup row (`rid`): one value per metric, `SKETCHES`. Beside the sums,
not among them, so that a read of the sums stays a read of small rows."""
PENDING_TABLE = "rollup_pending"
V7_SKETCH_TABLE = "rollup_sketch"
"""Where schema v7 kept the sketches, a row per bucket (`upgrade` replaces it)."""
MINUTE = 60
GRAINS: tuple[int, ...] = (86400, 3600, 60)
"""The widths (seconds) a request is counted at, coarsest first: a day, an hour, a minute. A
range is read from the coarsest rows that fit in it (a week: seven day rows per combination, not
10,080 minute rows), the minutes at its ends from minute rows."""

DIMENSIONS: tuple[str, ...] = (
    "model",
    "tenant",
    "key_fp",
    "worker",
    "backend",
    "status",
    "error_code",
    "error_type",
    "stop_reason",
    "stream",
    "hung_up",
    "cut_mid_stream",
)
"""The `requests` columns a rollup row is keyed by (beside its minute, `ts`), named as there."""

METRICS: dict[str, int] = {"duration": 0, "ttfe": 1, "rate": 2}
"""The sketches kept per rollup row, in the order of `SKETCHES`."""
SKETCHES: tuple[str, ...] = ("duration_sketch", "ttfe_sketch", "rate_sketch")
"""The rollup columns holding each metric's sketch (`journal.sketch.encode`)."""

_INTEGER_DIMENSIONS = frozenset({"status", "stream", "hung_up", "cut_mid_stream"})
_SENTINEL = "X'00'"  # what NULL is in the unique key: a blob, which no column holds


_KEY = ("grain", "ts", *DIMENSIONS)
_KEY_EXPRS = ", ".join(f"IFNULL({c}, {_SENTINEL})" for c in _KEY)
_MEASURES: tuple[str, ...] = (
    "requests",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "priced",
    "duration_n",
    "duration_sum",
    "ttfe_n",
    "ttfe_sum",
    "rated",
    "rated_output",
    "rated_ms",
)
_MAXIMA: tuple[str, ...] = ("first_ts", "last_ts", "duration_max", "ttfe_max")

_DDL = f"""
    CREATE TABLE {TABLE} (
        rid          INTEGER PRIMARY KEY,
        grain        INTEGER NOT NULL,  -- the width of the row's time bucket (GRAINS)
        ts           INTEGER,  -- its start (epoch seconds, a multiple of grain)
        {", ".join(f"{c} {'INTEGER' if c in _INTEGER_DIMENSIONS else 'TEXT'}" for c in DIMENSIONS)},
        requests     INTEGER NOT NULL DEFAULT 0,
        input_tokens INTEGER NOT NULL DEFAULT 0,
        output_tokens INTEGER NOT NULL DEFAULT 0,
        cost_usd     REAL NOT NULL DEFAULT 0,
        priced       INTEGER NOT NULL DEFAULT 0,   -- requests with a cost
        duration_n   INTEGER NOT NULL DEFAULT 0,
        duration_sum REAL NOT NULL DEFAULT 0,
        ttfe_n       INTEGER NOT NULL DEFAULT 0,
        ttfe_sum     REAL NOT NULL DEFAULT 0,
        rated        INTEGER NOT NULL DEFAULT 0,   -- requests with output tokens and a duration
        rated_output INTEGER NOT NULL DEFAULT 0,
        rated_ms     REAL NOT NULL DEFAULT 0,
        first_ts     REAL,
        last_ts      REAL,
        duration_max REAL,
        ttfe_max     REAL
    )
"""
_SKETCHES_DDL = (
    f"CREATE TABLE {SKETCHES_TABLE} (rid INTEGER PRIMARY KEY,"  # rollups.rid
    f" {', '.join(f'{c} BLOB' for c in SKETCHES)})"  # journal.sketch.encode
)

_NOTED: tuple[str, ...] = ("ts", *DIMENSIONS, "input_tokens", "output_tokens", "cost_usd", "duration_ms", "ttfe_ms")
"""The `requests` columns a rollup row is made of: what `rollup_pending` notes of a request."""
_PENDING_DDL = f"CREATE TABLE {PENDING_TABLE} (sign INTEGER NOT NULL, {', '.join(_NOTED)})"
_CHANGED = " OR ".join(f"OLD.{c} IS NOT NEW.{c}" for c in _NOTED)


def _note(r: str, sign: int) -> str:
    return f"INSERT INTO {PENDING_TABLE} VALUES ({sign}, {', '.join(f'{r}.{c}' for c in _NOTED)});"


_TRIGGERS = (
    f"CREATE TRIGGER {TABLE}_insert AFTER INSERT ON requests WHEN NEW.completed = 1 BEGIN {_note('NEW', 1)} END",
    f"CREATE TRIGGER {TABLE}_complete AFTER UPDATE OF completed ON requests"
    f" WHEN OLD.completed = 0 AND NEW.completed = 1 BEGIN {_note('NEW', 1)} END",
    f"CREATE TRIGGER {TABLE}_change AFTER UPDATE OF {', '.join(_NOTED)} ON requests"
    f" WHEN OLD.completed = 1 AND ({_CHANGED}) BEGIN {_note('OLD', -1)} {_note('NEW', 1)} END",
)

_COLUMNS = ", ".join((*_KEY, *_MEASURES, *_MAXIMA))
_MERGE = ", ".join(
    [
        *(f"{m} = {m} + excluded.{m}" for m in _MEASURES),
        "first_ts = min(IFNULL(first_ts, excluded.first_ts), IFNULL(excluded.first_ts, first_ts))",
        *(f"{m} = max(IFNULL({m}, excluded.{m}), IFNULL(excluded.{m}, {m}))" for m in _MAXIMA[1:]),
    ]
)
_UPSERT = (
    f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES ({', '.join('?' * (len(_KEY) + len(_MEASURES) + len(_MAXIMA)))})"
    f" ON CONFLICT ({_KEY_EXPRS}) DO UPDATE SET {_MERGE}"
)
_ROW_OF_KEY = " AND ".join(f"IFNULL({c}, {_SENTINEL}) = IFNULL(?, {_SENTINEL})" for c in _KEY)
_UPSERT_SKETCHES = (
    f"INSERT INTO {SKETCHES_TABLE} (rid, {', '.join(SKETCHES)}) SELECT rid, ?, ?, ? FROM {TABLE} WHERE {_ROW_OF_KEY}"
    f" ON CONFLICT (rid) DO UPDATE SET {', '.join(f'{c} = smg_sketch_add({c}, excluded.{c})' for c in SKETCHES)}"
)
_SELECTED = ", ".join(f"r.{c}" for c in _NOTED)
_BIG = 1e15  # an arrival no calendar holds has no time bucket (as in the fleet journal)


def register(conn: sqlite3.Connection) -> None:
    """Give `conn` the SQL function the rollups' upsert merges sketches with."""
    conn.create_function("smg_sketch_add", 2, sketch.add_encoded, deterministic=True)


def _num(v: Any) -> bool:
    return isinstance(v, int | float)


class _Sums:
    """What requests add up to in one rollup row, in `_UPSERT`'s order (after the key)."""

    __slots__ = ("measures", "maxima", "sketches")

    def __init__(self) -> None:
        self.measures: list[float] = [0] * len(_MEASURES)
        self.maxima: list[float | None] = [None] * len(_MAXIMA)
        self.sketches: tuple[dict[int, int], ...] = ({}, {}, {})

    def params(self, key: tuple[Any, ...]) -> tuple[Any, ...]:
        return (*key, *self.measures, *self.maxima)

    def sketch_params(self, key: tuple[Any, ...]) -> tuple[Any, ...] | None:
        stored = [sketch.encode(s) for s in self.sketches]
        return None if stored == [None, None, None] else (*stored, *key)


def _top(current: float | None, value: float) -> float:
    return value if current is None or value > current else current


def _accumulate(groups: dict[tuple[Any, ...], _Sums], rows: Iterable[Sequence[Any]]) -> bool:
    """Add `rows` (a sign, then the `_NOTED` columns) into `groups`, at every grain; whether
    any row was subtracted. Requests are added into their minute rows, and the minutes into
    their hours and days (a minute of many requests is one addition there, not many)."""
    subtracted = False
    bucket = sketch.bucket
    finest = GRAINS[-1]
    minutes: dict[tuple[Any, ...], _Sums] = {}
    for row in rows:
        sign, ts, *dims = row[: 2 + len(DIMENSIONS)]
        tin, tout, cost, dur, ttfe = row[2 + len(DIMENSIONS) :]
        subtracted = subtracted or sign < 0
        key = (finest, math.trunc(ts / finest) * finest if _num(ts) and abs(ts) < _BIG else None, *dims)
        sums = minutes.get(key)
        if sums is None:
            sums = minutes[key] = _Sums()
        m = sums.measures
        m[0] += sign
        if isinstance(tin, int):
            m[1] += sign * tin
        if isinstance(tout, int):
            m[2] += sign * tout
        if _num(cost):
            m[3] += sign * cost
            m[4] += sign
        x = sums.maxima
        if _num(ts):
            x[0] = ts if x[0] is None or ts < x[0] else x[0]
            x[1] = _top(x[1], ts)
        duration, first_event, rate = sums.sketches
        if _num(dur):
            m[5] += sign
            m[6] += sign * dur
            x[2] = _top(x[2], dur)
            b = bucket(dur)
            duration[b] = duration.get(b, 0) + sign
            if isinstance(tout, int) and dur > 0:
                m[9] += sign
                m[10] += sign * tout
                m[11] += sign * dur
                b = bucket(tout * 1000.0 / dur)
                rate[b] = rate.get(b, 0) + sign
        if _num(ttfe):
            m[7] += sign
            m[8] += sign * ttfe
            x[3] = _top(x[3], ttfe)
            b = bucket(ttfe)
            first_event[b] = first_event.get(b, 0) + sign
    for key, sums in minutes.items():
        _add(groups, key, sums)
        for grain in GRAINS[:-1]:
            _add(groups, (grain, None if key[1] is None else math.trunc(key[1] / grain) * grain, *key[2:]), sums)
    return subtracted


def _add(groups: dict[tuple[Any, ...], _Sums], key: tuple[Any, ...], sums: _Sums) -> None:
    into = groups.get(key)
    if into is None:
        into = groups[key] = _Sums()
    into.measures = [a + b for a, b in zip(into.measures, sums.measures, strict=True)]
    lo, top = into.maxima, sums.maxima
    into.maxima = [
        top[0] if lo[0] is None or (top[0] is not None and top[0] < lo[0]) else lo[0],
        *(b if a is None or (b is not None and b > a) else a for a, b in zip(lo[1:], top[1:], strict=True)),
    ]
    for counts, more in zip(into.sketches, sums.sketches, strict=True):
        for b, c in more.items():
            counts[b] = counts.get(b, 0) + c


def _write(conn: sqlite3.Connection, groups: dict[tuple[Any, ...], _Sums], subtracted: bool) -> None:
    conn.executemany(_UPSERT, [sums.params(key) for key, sums in groups.items()])
    stored = [sums.sketch_params(key) for key, sums in groups.items()]
    conn.executemany(_UPSERT_SKETCHES, [p for p in stored if p is not None])
    if subtracted:  # the rows a subtraction emptied go
        spans = list({(key[0], key[1]) for key in groups})
        emptied = f"SELECT rid FROM {TABLE} WHERE grain = ? AND ts IS ? AND requests <= 0"
        conn.executemany(f"DELETE FROM {SKETCHES_TABLE} WHERE rid IN ({emptied})", spans)
        conn.executemany(f"DELETE FROM {TABLE} WHERE grain = ? AND ts IS ? AND requests <= 0", spans)


def fold(conn: sqlite3.Connection) -> int:
    """Count what `rollup_pending` notes into the rollups, grouped, and empty it (in the
    caller's transaction); how many notes were folded."""
    notes = conn.execute(f"SELECT * FROM {PENDING_TABLE}").fetchall()
    if not notes:
        return 0
    groups: dict[tuple[Any, ...], _Sums] = {}
    _write(conn, groups, _accumulate(groups, notes))
    conn.execute(f"DELETE FROM {PENDING_TABLE}")
    return len(notes)


def create(conn: sqlite3.Connection, progress: Callable[[int, int], None] | None = None) -> None:
    """Create the rollup tables, their triggers and the in-flight index, and count every
    completed request already in the file (part of the migration)."""
    _tables(conn)
    conn.execute("CREATE INDEX requests_in_flight ON requests (ts) WHERE completed = 0")
    backfill(conn, progress)


def _tables(conn: sqlite3.Connection) -> None:
    conn.execute(_DDL)
    conn.execute(f"CREATE UNIQUE INDEX {TABLE}_key ON {TABLE} ({_KEY_EXPRS})")
    conn.execute(f"CREATE INDEX {TABLE}_ts ON {TABLE} (grain, ts)")
    conn.execute(_SKETCHES_DDL)
    conn.execute(_PENDING_DDL)
    for trigger in _TRIGGERS:
        conn.execute(trigger)


def upgrade(conn: sqlite3.Connection, progress: Callable[[int, int], None] | None = None) -> None:
    """Schema v8: rollups of schema v7 (per-row triggers, a `rollup_sketch` row per bucket) are
    rebuilt as one sketch value per row, noted by the small triggers and folded per batch. A
    file that came to v7 from an older one through this version's `create` has them already."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (V7_SKETCH_TABLE,)).fetchone() is None:
        return
    for trigger in ("insert", "complete", "change"):
        conn.execute(f"DROP TRIGGER IF EXISTS {TABLE}_{trigger}")
    conn.execute(f"DROP TABLE {V7_SKETCH_TABLE}")
    conn.execute(f"DROP TABLE {TABLE}")
    _tables(conn)
    backfill(conn, progress)


_CHUNK = 50_000


def backfill(conn: sqlite3.Connection, progress: Callable[[int, int], None] | None = None) -> None:
    """Count every completed request of the file (the rollups must be empty), in chunks of
    the table's order; `progress(done, total)` after each."""
    total = int(conn.execute("SELECT count(*) FROM requests WHERE completed = 1").fetchone()[0])
    done, after = 0, None
    while True:
        chunk = conn.execute(
            f"SELECT rk, 1, {_SELECTED} FROM requests AS r WHERE completed = 1"
            f"{'' if after is None else ' AND rk > ?'} ORDER BY rk LIMIT {_CHUNK}",
            () if after is None else (after,),
        ).fetchall()
        if not chunk:
            break
        after = chunk[-1][0]
        groups: dict[tuple[Any, ...], _Sums] = {}
        _accumulate(groups, (row[1:] for row in chunk))
        _write(conn, groups, False)
        done += len(chunk)
        if progress is not None:
            progress(done, total)


def discount(conn: sqlite3.Connection, where: str, params: Sequence[object]) -> None:
    """Take the completed requests `where` selects out of the rollups (before deleting them;
    in the caller's transaction). The rows it empties are deleted: a journal pruned to a size
    must not keep the rollups of requests it no longer holds."""
    fold(conn)  # what is noted and not folded yet is counted before it is taken out
    rows = conn.execute(
        f"SELECT -1, {_SELECTED} FROM requests AS r WHERE completed = 1 AND ({where})", list(params)
    ).fetchall()
    if rows:
        groups: dict[tuple[Any, ...], _Sums] = {}
        _accumulate(groups, rows)
        _write(conn, groups, True)


def present(conn: sqlite3.Connection) -> bool:
    """Whether the file keeps rollups this version reads (schema v8 and later; a v7 file's
    are not, and a reader scans it until a writer migrates it)."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (SKETCHES_TABLE,)).fetchone()
    return row is not None
