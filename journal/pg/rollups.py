"""The fleet journal's rollups: `journal.rollups` in PostgreSQL, part of the store's schema.

Same rows as the local file's (one per minute, hour and day of arrival and combination of
`journal.rollups.DIMENSIONS`, with the same sums, and the same log-scale latency sketches as one
value per row and metric in `rollup_sketches`: here a `jsonb` object of bucket to count, merged
by SQL function `smg_sketch_add` and summed by bucket in the database when read), plus the
partition `day` of their requests. Statement triggers on `requests`
(one per insert, update and delete, over the statement's transition tables, so a shipped batch
is counted by a few grouped upserts) count a row that is completed when it is inserted, move
one when it is updated (the shipper's upsert of a request whose summary changed after it
shipped: its old row is taken out and its new one counted, never both kept) and takes out one
that is deleted (retention's trim of the boundary day). A resent batch changes no row, so it
fires nothing. Dropping a day's partitions (retention, `journal.pg.partitions.drop_before`)
deletes that day's rollup rows in the same transaction: a trigger does not see a dropped table.
"""

from __future__ import annotations

from typing import Any

import psycopg

from journal import rollups as local
from journal import sketch

TABLE = local.TABLE
SKETCHES_TABLE = local.SKETCHES_TABLE
V3_SKETCH_TABLE = local.V7_SKETCH_TABLE  # schema v3's, a row per bucket (`upgrade` replaces it)
_KEY = ("day", "grain", "ts", *local.DIMENSIONS)
_GRAINS = f"(VALUES {', '.join(f'({g})' for g in local.GRAINS)}) AS g (grain)"
_INTEGER = {"status", "stream", "hung_up", "cut_mid_stream"}
_REAL = {"cost_usd", "duration_sum", "ttfe_sum", "rated_ms"}
_MEASURES = local._MEASURES  # noqa: SLF001 (the same sums, by name)


def _bucket(value: str) -> str:
    return (
        f"CASE WHEN {value} IS NULL THEN NULL WHEN {value} > 0"
        f" THEN floor(ln({value}) / ln(2.0) * {sketch.PER_OCTAVE})::bigint ELSE {sketch.ZERO} END"
    )


# An arrival no calendar holds (a local file keeps what it was sent) has no time bucket, rather
# than failing the shipment of its batch on an integer out of range.
_MINUTE = "CASE WHEN abs(r.ts) < 1e15 THEN (floor(r.ts / g.grain) * g.grain)::bigint END"
_RATED = "(r.output_tokens IS NOT NULL AND r.duration_ms IS NOT NULL AND r.duration_ms > 0)"
_RATE = f"CASE WHEN {_RATED} THEN r.output_tokens * 1000.0 / r.duration_ms END"
_VALUES = ", ".join(
    [
        "r.day",
        "g.grain",
        _MINUTE,
        *(f"r.{c}" for c in local.DIMENSIONS),
        "sign",
        "sign * COALESCE(r.input_tokens, 0)",
        "sign * COALESCE(r.output_tokens, 0)",
        "sign * COALESCE(r.cost_usd, 0)",
        "sign * (r.cost_usd IS NOT NULL)::int",
        "sign * (r.duration_ms IS NOT NULL)::int",
        "sign * COALESCE(r.duration_ms, 0)",
        "sign * (r.ttfe_ms IS NOT NULL)::int",
        "sign * COALESCE(r.ttfe_ms, 0)",
        f"sign * ({_RATED})::int",
        f"sign * CASE WHEN {_RATED} THEN r.output_tokens ELSE 0 END",
        f"sign * CASE WHEN {_RATED} THEN r.duration_ms ELSE 0 END",
        "r.ts",
        "r.ts",
        "r.duration_ms",
        "r.ttfe_ms",
    ]
)
_COLUMNS = ", ".join((*_KEY, *_MEASURES, "first_ts", "last_ts", "duration_max", "ttfe_max"))
_MERGE = ", ".join(
    [
        *(f"{m} = {TABLE}.{m} + excluded.{m}" for m in _MEASURES),
        f"first_ts = LEAST({TABLE}.first_ts, excluded.first_ts)",
        *(f"{m} = GREATEST({TABLE}.{m}, excluded.{m})" for m in ("last_ts", "duration_max", "ttfe_max")),
    ]
)

_TABLES = (
    "ALTER TABLE requests ADD COLUMN cost_usd double precision",
    f"""CREATE TABLE {TABLE} (
        rid bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        day date NOT NULL,
        grain integer NOT NULL,
        ts bigint,
        {", ".join(f"{c} {'bigint' if c in _INTEGER else 'text'}" for c in local.DIMENSIONS)},
        {", ".join(f"{m} {'double precision' if m in _REAL else 'bigint'} NOT NULL DEFAULT 0" for m in _MEASURES)},
        first_ts double precision, last_ts double precision,
        duration_max double precision, ttfe_max double precision
    )""",
    f"CREATE UNIQUE INDEX {TABLE}_key ON {TABLE} ({', '.join(_KEY)}) NULLS NOT DISTINCT",
    f"CREATE INDEX {TABLE}_ts ON {TABLE} (grain, ts)",
)
_SKETCHES = (
    f"CREATE TABLE {SKETCHES_TABLE} (rid bigint PRIMARY KEY REFERENCES {TABLE} ON DELETE CASCADE,"
    f" {', '.join(f'{c} jsonb' for c in local.SKETCHES)})",
    # The union of two sketches: counts added by bucket, the buckets that reach zero dropped.
    """CREATE OR REPLACE FUNCTION smg_sketch_add(a jsonb, b jsonb) RETURNS jsonb LANGUAGE sql IMMUTABLE AS $$
    SELECT jsonb_object_agg(k, n) FROM (
        SELECT k, sum(v::bigint) AS n FROM (
            SELECT * FROM jsonb_each_text(COALESCE(a, '{}')) UNION ALL SELECT * FROM jsonb_each_text(COALESCE(b, '{}'))
        ) AS e (k, v) GROUP BY k HAVING sum(v::bigint) <> 0
    ) AS s $$""",
)

_R_DIMS, _K_DIMS, _V_DIMS = (", ".join(f"{t}.{c}" for c in local.DIMENSIONS) for t in ("r", "k", "v"))


def _counted(source: str) -> tuple[str, str]:
    """The two statements that add the rows `source` yields (request rows with a `sign`: 1 to
    count one, -1 to take it out), grouped: into the rollups, then into their sketches."""
    rollup = f"""INSERT INTO {TABLE} ({_COLUMNS})
    SELECT r.day, g.grain, {_MINUTE}, {_R_DIMS}, sum(r.sign),
        COALESCE(sum(r.sign * r.input_tokens), 0), COALESCE(sum(r.sign * r.output_tokens), 0),
        COALESCE(sum(r.sign * r.cost_usd), 0), sum(r.sign * (r.cost_usd IS NOT NULL)::int),
        sum(r.sign * (r.duration_ms IS NOT NULL)::int), COALESCE(sum(r.sign * r.duration_ms), 0),
        sum(r.sign * (r.ttfe_ms IS NOT NULL)::int), COALESCE(sum(r.sign * r.ttfe_ms), 0),
        sum(r.sign * ({_RATED})::int),
        COALESCE(sum(r.sign * r.output_tokens) FILTER (WHERE {_RATED}), 0),
        COALESCE(sum(r.sign * r.duration_ms) FILTER (WHERE {_RATED}), 0),
        min(r.ts), max(r.ts), max(r.duration_ms), max(r.ttfe_ms)
    FROM ({source}) r CROSS JOIN {_GRAINS} GROUP BY r.day, g.grain, {_MINUTE}, {_R_DIMS}
    ON CONFLICT ({", ".join(_KEY)}) DO UPDATE SET {_MERGE}"""
    per_metric = ", ".join(
        f"jsonb_object_agg(v.bucket, v.n) FILTER (WHERE v.metric = {m})" for m in range(len(local.SKETCHES))
    )
    merged = ", ".join(f"{c} = smg_sketch_add({SKETCHES_TABLE}.{c}, excluded.{c})" for c in local.SKETCHES)
    sketches = f"""INSERT INTO {SKETCHES_TABLE} (rid, {", ".join(local.SKETCHES)})
    SELECT k.rid, {per_metric} FROM (
        SELECT r.day, g.grain, {_MINUTE} AS ts, {_R_DIMS}, m.metric, m.bucket, sum(r.sign) AS n
        FROM ({source}) r CROSS JOIN {_GRAINS} CROSS JOIN LATERAL
            (VALUES (0, {_bucket("r.duration_ms")}), (1, {_bucket("r.ttfe_ms")}), (2, {_bucket(_RATE)}))
            AS m (metric, bucket)
        WHERE m.bucket IS NOT NULL
        GROUP BY r.day, g.grain, {_MINUTE}, {_R_DIMS}, m.metric, m.bucket HAVING sum(r.sign) <> 0
    ) v JOIN {TABLE} k ON k.day = v.day AND k.grain = v.grain AND COALESCE(k.ts, -1) = COALESCE(v.ts, -1)
        AND ({_K_DIMS}) IS NOT DISTINCT FROM ({_V_DIMS})
    GROUP BY k.rid
    ON CONFLICT (rid) DO UPDATE SET {merged}"""
    return rollup, sketches


_ADDED = "SELECT 1 AS sign, n.* FROM new_rows n WHERE n.completed = 1"
_TAKEN = "SELECT -1 AS sign, o.* FROM old_rows o WHERE o.completed = 1"
# One trigger per statement kind (a trigger with transition tables takes one event), each
# counting the statement's rows grouped: a shipped batch of 2,000 requests is a few grouped
# upserts, not 2,000 row triggers of a dozen upserts each.
_STATEMENTS = {
    "INSERT": ("REFERENCING NEW TABLE AS new_rows", _ADDED),
    "UPDATE": ("REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows", f"{_ADDED} UNION ALL {_TAKEN}"),
    "DELETE": ("REFERENCING OLD TABLE AS old_rows", _TAKEN),
}


def _function(event: str) -> str:
    rollup, sketches = _counted(_STATEMENTS[event][1])
    return (
        f"CREATE OR REPLACE FUNCTION smg_rollup_{event.lower()}() RETURNS trigger LANGUAGE plpgsql AS $$\n"
        f"BEGIN\n{rollup};\n{sketches};\nRETURN NULL;\nEND $$"
    )


_FUNCTIONS = tuple(_function(event) for event in _STATEMENTS)
_DDL = (*_TABLES, *_SKETCHES, *_FUNCTIONS)
_TRIGGERS = tuple(
    f"CREATE TRIGGER requests_rollup_{event.lower()} AFTER {event} ON requests {referencing}"
    f" FOR EACH STATEMENT EXECUTE FUNCTION smg_rollup_{event.lower()}()"
    for event, (referencing, _) in _STATEMENTS.items()
)


def migrate(conn: psycopg.Connection[Any]) -> None:
    """Schema v3: `cost_usd`, the rollup tables, their trigger, and the completed requests
    already shipped counted once (in v4's shape: a database that reaches v3 through this
    version needs nothing of `upgrade`)."""
    for statement in _DDL:
        conn.execute(statement)  # built from constants
    for statement in _counted("SELECT 1 AS sign, r.* FROM requests r WHERE r.completed = 1"):
        conn.execute(statement)
    for trigger in _TRIGGERS:
        conn.execute(trigger)


def upgrade(conn: psycopg.Connection[Any]) -> None:
    """Schema v4: v3's sketches, a `rollup_sketch` row per bucket, become one value per rollup
    row and metric, and the trigger functions write them so."""
    found = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (V3_SKETCH_TABLE,)).fetchone()
    if not found or not found[0]:
        return
    for statement in _SKETCHES:
        conn.execute(statement)
    per_metric = ", ".join(f"jsonb_object_agg(bucket, n) FILTER (WHERE metric = {m})" for m in range(3))
    conn.execute(
        f"INSERT INTO {SKETCHES_TABLE} (rid, {', '.join(local.SKETCHES)})"
        f" SELECT rid, {per_metric} FROM {V3_SKETCH_TABLE} WHERE n <> 0 GROUP BY rid"
    )
    conn.execute(f"DROP TABLE {V3_SKETCH_TABLE}")
    for function in _FUNCTIONS:
        conn.execute(function)
