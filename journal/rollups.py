"""Rollups: the completed requests counted per minute and breakdown, kept by the journal itself.

`rollups` holds one row per minute (and per hour, and per day: `GRAINS`) of arrival and
combination of the columns a breakdown or a
filter names (`DIMENSIONS`: model, tenant, key, worker, backend, status, error code and type,
stop reason, stream, hung up, cut), with the sums `journal.stats` and `journal.groups` need:
requests, tokens, cost, duration and time-to-first-event counts, sums and maxima, output rate.
`rollup_sketch` holds, per rollup row, the latency sketches (`journal.sketch`: counts per
log-scale bucket of the duration, the time to the first event and the output rate), which merge
by addition, so any range and breakdown adds rows instead of reading requests.

SQL triggers on `requests` keep them: a request is counted when its summary row says
`completed` (in the commit that writes it, whoever writes it: the writer's batch, recovery, an
upsert), and moved when a completed row changes (a request closed as interrupted and then
completed). The writer's hot path awaits nothing new; its commit does a few more B-tree writes.
Requests in flight are not in the rollups: a query reads them from the summary table through
the partial index `requests_in_flight`, which holds only them.

Pruning (`journal.retention`) subtracts the requests it deletes, grouped, in its own
transaction: the rollups always describe the requests the file holds, and a scan of the same
selection gives the same counts and sums. Max durations are kept as maxima (a subtraction
cannot lower one), so after a prune or a moved row a max is an upper bound.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from journal import sketch

TABLE = "rollups"
SKETCH_TABLE = "rollup_sketch"
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
"""The sketches kept per rollup row and their number in `rollup_sketch.metric`."""

_INTEGER_DIMENSIONS = frozenset({"status", "stream", "hung_up", "cut_mid_stream"})
_SENTINEL = "X'00'"  # what NULL is in the unique key: a blob, which no column holds


def _is_int(expr: str) -> str:
    return f"CASE WHEN typeof({expr}) = 'integer' THEN {expr} ELSE 0 END"


def _number(expr: str) -> str:
    return f"CASE WHEN typeof({expr}) IN ('integer', 'real') THEN {expr} END"


def _rated(r: str) -> str:
    return (
        f"(typeof({r}.output_tokens) = 'integer' AND typeof({r}.duration_ms) IN ('integer', 'real')"
        f" AND {r}.duration_ms > 0)"
    )


def _rate(r: str) -> str:
    return f"CASE WHEN {_rated(r)} THEN {r}.output_tokens * 1000.0 / {r}.duration_ms END"


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


def _start(ts: str, grain: int) -> str:
    return f"CAST({ts} / {grain} AS INTEGER) * {grain}"


def _row_values(r: str, sign: int, grain: int) -> str:
    """The VALUES of one request `r` (NEW or OLD) counted with `sign` (1 or -1) at `grain`."""
    s = f"{sign} * "
    return ", ".join(
        [
            str(grain),
            _start(f"{r}.ts", grain),
            *(f"{r}.{c}" for c in DIMENSIONS),
            f"{sign}",
            s + _is_int(f"{r}.input_tokens"),
            s + _is_int(f"{r}.output_tokens"),
            s + f"IFNULL({_number(f'{r}.cost_usd')}, 0)",
            s + f"({_number(f'{r}.cost_usd')} IS NOT NULL)",
            s + f"({_number(f'{r}.duration_ms')} IS NOT NULL)",
            s + f"IFNULL({_number(f'{r}.duration_ms')}, 0)",
            s + f"({_number(f'{r}.ttfe_ms')} IS NOT NULL)",
            s + f"IFNULL({_number(f'{r}.ttfe_ms')}, 0)",
            s + f"{_rated(r)}",
            s + f"CASE WHEN {_rated(r)} THEN {r}.output_tokens ELSE 0 END",
            s + f"CASE WHEN {_rated(r)} THEN {r}.duration_ms ELSE 0 END",
            _number(f"{r}.ts"),
            _number(f"{r}.ts"),
            _number(f"{r}.duration_ms"),
            _number(f"{r}.ttfe_ms"),
        ]
    )


_COLUMNS = ", ".join((*_KEY, *_MEASURES, *_MAXIMA))
_MERGE = ", ".join(
    [
        *(f"{m} = {m} + excluded.{m}" for m in _MEASURES),
        "first_ts = min(IFNULL(first_ts, excluded.first_ts), IFNULL(excluded.first_ts, first_ts))",
        *(f"{m} = max(IFNULL({m}, excluded.{m}), IFNULL(excluded.{m}, {m}))" for m in _MAXIMA[1:]),
    ]
)
_UPSERT = f"ON CONFLICT ({_KEY_EXPRS}) DO UPDATE SET {_MERGE}"


def _count(r: str, sign: int) -> str:
    """The trigger statements that count request `r` with `sign` in its rollup rows (one per
    grain) and their sketches."""
    statements = []
    for grain in GRAINS:
        key = {"grain": str(grain), "ts": _start(f"{r}.ts", grain)}
        match = " AND ".join(f"IFNULL({c}, {_SENTINEL}) = IFNULL({key.get(c, f'{r}.{c}')}, {_SENTINEL})" for c in _KEY)
        statements.append(f"INSERT INTO {TABLE} ({_COLUMNS}) VALUES ({_row_values(r, sign, grain)}) {_UPSERT};")
        for metric, expr in (
            (METRICS["duration"], f"{r}.duration_ms"),
            (METRICS["ttfe"], f"{r}.ttfe_ms"),
            (METRICS["rate"], _rate(r)),
        ):
            b = sketch.bucket_sql(expr)
            statements.append(
                f"INSERT INTO {SKETCH_TABLE} (rid, metric, bucket, n)"
                f" SELECT (SELECT rid FROM {TABLE} WHERE {match}), {metric}, {b}, {sign} WHERE {b} IS NOT NULL"
                " ON CONFLICT (rid, metric, bucket) DO UPDATE SET n = n + excluded.n;"
            )
    return "\n".join(statements)


_CHANGED = " OR ".join(
    f"OLD.{c} IS NOT NEW.{c}"
    for c in ("ts", *DIMENSIONS, "input_tokens", "output_tokens", "cost_usd", "duration_ms", "ttfe_ms")
)
_WATCHED = ", ".join(
    ("completed", "ts", *DIMENSIONS, "input_tokens", "output_tokens", "cost_usd", "duration_ms", "ttfe_ms")
)


def create(conn: sqlite3.Connection) -> None:
    """Create the rollup tables, their triggers and the in-flight index, and count every
    completed request already in the file (one grouped pass; part of the migration)."""
    conn.execute(_DDL)
    conn.execute(f"CREATE UNIQUE INDEX {TABLE}_key ON {TABLE} ({_KEY_EXPRS})")
    conn.execute(f"CREATE INDEX {TABLE}_ts ON {TABLE} (grain, ts)")
    conn.execute(
        f"CREATE TABLE {SKETCH_TABLE} (rid INTEGER NOT NULL, metric INTEGER NOT NULL, bucket INTEGER NOT NULL,"
        " n INTEGER NOT NULL, PRIMARY KEY (rid, metric, bucket)) WITHOUT ROWID"
    )
    conn.execute("CREATE INDEX requests_in_flight ON requests (ts) WHERE completed = 0")
    backfill(conn)
    conn.execute(
        f"CREATE TRIGGER {TABLE}_insert AFTER INSERT ON requests WHEN NEW.completed = 1 BEGIN\n{_count('NEW', 1)}\nEND"
    )
    conn.execute(
        f"CREATE TRIGGER {TABLE}_complete AFTER UPDATE OF {_WATCHED} ON requests"
        f" WHEN OLD.completed = 0 AND NEW.completed = 1 BEGIN\n{_count('NEW', 1)}\nEND"
    )
    conn.execute(
        f"CREATE TRIGGER {TABLE}_change AFTER UPDATE OF {_WATCHED} ON requests"
        f" WHEN OLD.completed = 1 AND ({_CHANGED}) BEGIN\n{_count('OLD', -1)}\n"
        f"{_count('NEW', 1)}\nEND"
    )


def _grouped(where: str, sign: int, grain: int) -> tuple[str, str]:
    """The two statements that count (`sign` 1) or discount (-1) the completed requests `where`
    selects at `grain`, grouped: into the rollups, then into the sketches."""
    r = "r"
    sums = [
        f"{sign} * count(*)",
        f"{sign} * total({_is_int('input_tokens')})",
        f"{sign} * total({_is_int('output_tokens')})",
        f"{sign} * total({_number('cost_usd')})",
        f"{sign} * count({_number('cost_usd')})",
        f"{sign} * count({_number('duration_ms')})",
        f"{sign} * total({_number('duration_ms')})",
        f"{sign} * count({_number('ttfe_ms')})",
        f"{sign} * total({_number('ttfe_ms')})",
        f"{sign} * total({_rated(r)})",
        f"{sign} * total(CASE WHEN {_rated(r)} THEN output_tokens END)",
        f"{sign} * total(CASE WHEN {_rated(r)} THEN duration_ms END)",
        f"min({_number('ts')})",
        f"max({_number('ts')})",
        f"max({_number('duration_ms')})",
        f"max({_number('ttfe_ms')})",
    ]
    minute = _start("ts", grain)
    dims = ", ".join(DIMENSIONS)
    rollup = (
        f"INSERT INTO {TABLE} ({_COLUMNS}) SELECT {grain}, {minute}, {dims}, {', '.join(sums)}"
        f" FROM requests AS r WHERE completed = 1 AND ({where}) GROUP BY {minute}, {dims} {_UPSERT}"
    )
    match = " AND ".join(f"IFNULL(k.{c}, {_SENTINEL}) = IFNULL(v.{c}, {_SENTINEL})" for c in _KEY)
    values = " UNION ALL ".join(
        f"SELECT {minute} AS ts, {dims}, {metric} AS metric, {sketch.bucket_sql(expr)} AS bucket FROM requests AS r"
        f" WHERE completed = 1 AND ({where})"
        for metric, expr in ((0, "r.duration_ms"), (1, "r.ttfe_ms"), (2, _rate("r")))
    )
    sketches = (
        f"INSERT INTO {SKETCH_TABLE} (rid, metric, bucket, n)"
        f" SELECT k.rid, v.metric, v.bucket, {sign} * v.n FROM"
        f" (SELECT {grain} AS grain, ts, {dims}, metric, bucket, count(*) AS n FROM ({values}) WHERE bucket IS NOT NULL"
        f" GROUP BY ts, {dims}, metric, bucket) AS v JOIN {TABLE} AS k ON {match}"
        " WHERE 1 ON CONFLICT (rid, metric, bucket) DO UPDATE SET n = n + excluded.n"
    )
    return rollup, sketches


def backfill(conn: sqlite3.Connection) -> None:
    """Count every completed request of the file (the tables must be empty)."""
    for grain in GRAINS:
        for statement in _grouped("1", 1, grain):
            conn.execute(statement)


def discount(conn: sqlite3.Connection, where: str, params: Sequence[object]) -> None:
    """Take the completed requests `where` selects out of the rollups (before deleting them;
    in the caller's transaction). The rows and sketch buckets it empties are deleted: a journal
    pruned to a size must not keep the rollups of requests it no longer holds."""
    span = conn.execute(
        f"SELECT min({_number('ts')}), max({_number('ts')}) FROM requests AS r WHERE completed = 1 AND ({where})",
        list(params),
    ).fetchone()
    for grain in GRAINS:
        rollup, sketches = _grouped(where, -1, grain)
        conn.execute(sketches, list(params) * 3)
        conn.execute(rollup, list(params))
    if span is None or span[0] is None:
        return
    for grain in GRAINS:
        # Only the rows of the time the pruned requests arrived in can have been emptied.
        rows = f"SELECT rid FROM {TABLE} WHERE grain = ? AND ts BETWEEN ? AND ?"
        bounds = (grain, int(span[0]) // grain * grain, int(span[1]))
        conn.execute(f"DELETE FROM {SKETCH_TABLE} WHERE n <= 0 AND rid IN ({rows})", bounds)
        conn.execute(f"DELETE FROM {SKETCH_TABLE} WHERE rid IN ({rows} AND requests <= 0)", bounds)
        conn.execute(f"DELETE FROM {TABLE} WHERE grain = ? AND ts BETWEEN ? AND ? AND requests <= 0", bounds)


def present(conn: sqlite3.Connection) -> bool:
    """Whether the file keeps rollups (schema v7 and later)."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (TABLE,)).fetchone()
    return row is not None
