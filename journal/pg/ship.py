"""Writing a batch of a replica's requests into the fleet journal, once each however often sent.

One transaction per batch: the batch's rows are COPYed into temporary staging tables (COPY is
the fastest way into PostgreSQL, several thousand requests a second on one connection), then
one statement inserts the summary rows with `ON CONFLICT (replica, id, day) DO NOTHING` and,
for exactly the rows that were new, their events and text. A batch sent again after a crash
(PostgreSQL committed it, the local cursor did not record it) therefore inserts nothing; a
batch half new inserts its new half. The replica's row in `replicas` is bumped in the same
transaction. Values are shipped as the local file stores them; only what PostgreSQL cannot
hold is changed: a NUL character in text (SQLite keeps it, PostgreSQL text cannot) becomes
U+FFFD, and a value of the wrong type in an integer or real column (SQLite is dynamically
typed: an upstream's usage may put a string there) becomes NULL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any

import psycopg

from journal import schema as local_schema
from journal.pg import partitions
from journal.pg.outbox import Batch
from journal.pg.schema import INTEGER_COLUMNS, REAL_COLUMNS

_COLUMNS = local_schema.REQUEST_COLUMNS
_COLS = ", ".join(_COLUMNS)
_INT64 = 1 << 63
_INT32 = -(1 << 31)


def _type(column: str) -> str:
    if column in INTEGER_COLUMNS:
        return "bigint"
    if column in REAL_COLUMNS:
        return "double precision"
    return "text"


_STAGE = (
    "CREATE TEMP TABLE IF NOT EXISTS stage_requests (day date, local_rk bigint, "
    + ", ".join(f"{c} {_type(c)}" for c in _COLUMNS)
    + ") ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE IF NOT EXISTS stage_events (local_rk bigint, seq integer, kind text,"
    " t double precision, data bytea) ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE IF NOT EXISTS stage_text (local_rk bigint, body text) ON COMMIT DELETE ROWS",
)
_INSERT = f"""
WITH new AS (
    INSERT INTO requests (day, replica, local_rk, {_COLS})
    SELECT day, %(replica)s, local_rk, {_COLS} FROM stage_requests
    ON CONFLICT (replica, id, day) DO NOTHING
    RETURNING rk, local_rk, day
), new_events AS (
    INSERT INTO events (day, rk, seq, kind, t, data)
    SELECT new.day, new.rk, e.seq, e.kind, e.t, e.data FROM stage_events e JOIN new USING (local_rk)
    RETURNING 1
), new_text AS (
    INSERT INTO request_text (day, rk, body)
    SELECT new.day, new.rk, x.body FROM stage_text x JOIN new USING (local_rk)
    RETURNING 1
)
SELECT (SELECT count(*) FROM new), (SELECT count(*) FROM new_events)
"""
_EVENT_TYPES = ("int8", "int4", "text", "float8", "bytea")
# The insert joins a batch's events to its new rows: a sort of tens of thousands of rows, in memory.
_WORK_MEM = "SET LOCAL work_mem = '64MB'"
_REPLICA = """
INSERT INTO replicas (name, requests) VALUES (%(replica)s, %(shipped)s)
ON CONFLICT (name) DO UPDATE SET requests = replicas.requests + EXCLUDED.requests, last_shipped_at = now()
"""


@dataclass(frozen=True)
class Shipped:
    """What one batch did: requests and event rows inserted, and requests already there."""

    requests: int
    events: int
    duplicates: int


def prepare(conn: psycopg.Connection[Any]) -> None:
    """Create the connection's staging tables (once per connection)."""
    with conn.transaction():
        for statement in _STAGE:
            conn.execute(statement)


def _text(value: Any) -> Any:
    if value is None:
        return None
    text = value if isinstance(value, str) else str(value)
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def _integer(value: Any) -> int | None:
    if type(value) is int and -_INT64 <= value < _INT64:
        return value
    return None


def _real(value: Any) -> float | None:
    if isinstance(value, float):
        return value
    if type(value) is int:
        return float(value)
    return None


_CASTS = tuple(
    _integer if c in INTEGER_COLUMNS else _real if c in REAL_COLUMNS else _text for c in local_schema.REQUEST_COLUMNS
)
_TS = local_schema.REQUEST_COLUMNS.index("ts")


@dataclass(frozen=True)
class Rows:
    """A batch as it is COPYed (`rows`: pure, so that the next batch is made ready while one ships)."""

    keys: list[int]
    requests: list[tuple[Any, ...]]  # (day, local rk, *REQUEST_COLUMNS)
    events: list[tuple[Any, ...]]  # (local rk, seq, kind, t, data bytes)
    texts: list[tuple[int, Any]]  # (local rk, body)
    refused: list[str] = field(default_factory=list)  # ids of requests left out: see `rows`

    @property
    def days(self) -> set[date]:
        """The partition days its requests go to."""
        return {row[0] for row in self.requests}


def rows(batch: Batch) -> Rows:
    """`batch`'s rows as PostgreSQL takes them (see the module docstring for what is mended).

    A request with an event binary COPY would not carry faithfully (a number past the column's
    32 bits would wrap, not fail) is left out whole, its id in `refused`."""
    bad = {
        rk
        for rk, seq, _, t, _ in batch.events
        if type(seq) is not int or not _INT32 <= seq < -_INT32 or not isinstance(t, int | float)
    }
    requests, refused = [], []
    for row in batch.requests:
        if row[0] in bad:
            refused.append(str(row[1]))
            continue
        values = [cast(v) for cast, v in zip(_CASTS, row[1:], strict=True)]
        requests.append((partitions.day_of(values[_TS]), row[0], *values))
    events = [
        (rk, seq, kind, float(t), data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data))
        for rk, seq, kind, t, data in batch.events
        if rk not in bad
    ]
    texts = [(rk, _text(body)) for rk, body in batch.texts if rk not in bad]
    return Rows(batch.keys, requests, events, texts, refused)


def write(conn: psycopg.Connection[Any], replica: str, batch: Rows) -> Shipped:
    """Ship `batch` in one transaction, committed on return (the partitions of its days must
    exist: `partitions.ensure`; the staging tables too: `prepare`)."""
    with conn.transaction():
        with conn.cursor() as cur:
            cur.execute(_WORK_MEM)
            with cur.copy(f"COPY stage_requests (day, local_rk, {_COLS}) FROM STDIN") as copy:
                for row in batch.requests:
                    copy.write_row(row)
            # Binary: the payloads go as they are, not spelled in hex as text COPY would.
            with cur.copy("COPY stage_events (local_rk, seq, kind, t, data) FROM STDIN (FORMAT BINARY)") as copy:
                copy.set_types(_EVENT_TYPES)
                for event in batch.events:
                    copy.write_row(event)
            with cur.copy("COPY stage_text (local_rk, body) FROM STDIN") as copy:
                for text in batch.texts:
                    copy.write_row(text)
            cur.execute(_INSERT, {"replica": replica})
            found = cur.fetchone()
            assert found is not None
            requests, events = int(found[0]), int(found[1])
            if requests:
                cur.execute(_REPLICA, {"replica": replica, "shipped": requests})
    return Shipped(requests, events, len(batch.requests) - requests)
