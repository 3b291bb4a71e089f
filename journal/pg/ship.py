"""Writing a batch of a replica's requests into the fleet journal, once each however often sent.

One transaction per batch: the batch's rows are COPYed into temporary staging tables (COPY is
the fastest way into PostgreSQL, several thousand requests a second on one connection), then
the summary rows are updated where a row differs from the one sent (same replica, id and day)
and inserted where none is there yet, and then the events and text of exactly the rows inserted
or updated go in (an updated request's old events and text are replaced). A batch sent again
after a crash (PostgreSQL committed it, the local cursor did not record it) therefore changes
nothing; a batch half new inserts its new half; a request whose summary changed locally after
it shipped (`journal.pg.outbox` queues it again) is replaced whole. The replica's row in
`replicas` is bumped in the same transaction. Values are shipped as the local file stores them,
but for secrets an older writer left in clear (`journal.pg.redaction`) and what PostgreSQL
cannot hold: a NUL character in text (SQLite keeps it, PostgreSQL text cannot) becomes U+FFFD,
and a value of the wrong type in an integer or real column (SQLite is dynamically typed: an
upstream's usage may put a string there) becomes NULL.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date
from typing import Any

import psycopg

from journal import schema as local_schema
from journal.pg import partitions, redaction
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
    "CREATE TEMP TABLE IF NOT EXISTS stage_new (rk bigint, local_rk bigint, day date, inserted boolean)"
    " ON COMMIT DELETE ROWS",
)
_UPDATED = ", ".join(f"{c} = s.{c}" for c in ("local_rk", *_COLUMNS))
_DIFFERS = (
    f"ROW(r.local_rk, {', '.join(f'r.{c}' for c in _COLUMNS)})"
    f" IS DISTINCT FROM ROW(s.local_rk, {', '.join(f's.{c}' for c in _COLUMNS)})"
)
# A request already there with the very same row is a resend (nothing happens); one whose row
# differs was queued again because its summary changed: its row is updated, and its events and
# text replaced (`_REPLACED`). `stage_new` holds the rows inserted or updated.
_UPDATE = f"""
WITH changed AS (
    UPDATE requests r SET {_UPDATED} FROM stage_requests s
    WHERE r.replica = %(replica)s AND r.id = s.id AND r.day = s.day AND {_DIFFERS}
    RETURNING r.rk, s.local_rk, r.day
)
INSERT INTO stage_new (rk, local_rk, day, inserted) SELECT rk, local_rk, day, false FROM changed
"""
_UPSERT = f"""
WITH new AS (
    INSERT INTO requests (day, replica, local_rk, {_COLS})
    SELECT day, %(replica)s, local_rk, {_COLS} FROM stage_requests
    ON CONFLICT (replica, id, day) DO NOTHING
    RETURNING rk, local_rk, day
)
INSERT INTO stage_new (rk, local_rk, day, inserted) SELECT rk, local_rk, day, true FROM new
"""
_REPLACED = (
    "DELETE FROM events e USING stage_new n WHERE NOT n.inserted AND e.rk = n.rk AND e.day = n.day",
    "DELETE FROM request_text x USING stage_new n WHERE NOT n.inserted AND x.rk = n.rk AND x.day = n.day",
)
_INSERT = """
WITH new_events AS (
    INSERT INTO events (day, rk, seq, kind, t, data)
    SELECT n.day, n.rk, e.seq, e.kind, e.t, e.data FROM stage_events e JOIN stage_new n USING (local_rk)
    RETURNING 1
), new_text AS (
    INSERT INTO request_text (day, rk, body)
    SELECT n.day, n.rk, x.body FROM stage_text x JOIN stage_new n USING (local_rk)
    RETURNING 1
)
SELECT (SELECT count(*) FROM stage_new WHERE inserted), (SELECT count(*) FROM stage_new WHERE NOT inserted),
    (SELECT count(*) FROM new_events)
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
    """What one batch did: requests and event rows inserted, requests already there as sent,
    and requests whose summary had changed since they shipped (replaced)."""

    requests: int
    events: int
    duplicates: int
    updated: int = 0


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
    queued: list[tuple[int, float]] = field(default_factory=list)  # the versions read: `outbox.done`

    @property
    def days(self) -> set[date]:
        """The partition days its requests go to."""
        return {row[0] for row in self.requests}


def rows(batch: Batch, key: bytes | None = None) -> Rows:
    """`batch`'s rows as PostgreSQL takes them (see the module docstring for what is mended).

    Events that may hold a secret are redacted again (`journal.pg.redaction`: history written
    before redaction went by rule), fingerprints keyed with `key` (the journal's). A request
    with an event binary COPY would not carry faithfully (a number past the column's 32 bits
    would wrap, not fail), or one of those events unreadable, is left out whole, its id in
    `refused`."""
    bad = {
        rk
        for rk, seq, _, t, _ in batch.events
        if type(seq) is not int or not _INT32 <= seq < -_INT32 or not isinstance(t, int | float)
    }
    scrubbed = []
    kinds = redaction.KINDS
    for event in batch.events:
        rk, seq, kind, t, data = event
        if rk in bad:
            continue
        if kind in kinds:
            try:
                event = (rk, seq, kind, t, redaction.row_data(kind, float(t), data, key))
            except Exception:
                bad.add(rk)  # a row that may hold a secret and cannot be read never ships as it is
                continue
        scrubbed.append(event)
    requests, refused = [], []
    for row in batch.requests:
        if row[0] in bad:
            refused.append(str(row[1]))
            continue
        values = [cast(v) for cast, v in zip(_CASTS, row[1:], strict=True)]
        requests.append((partitions.day_of(values[_TS]), row[0], *values))
    events = [
        (rk, seq, kind, float(t), data.encode("utf-8", "surrogatepass") if isinstance(data, str) else bytes(data))
        for rk, seq, kind, t, data in scrubbed
        if rk not in bad
    ]
    texts = [(rk, _text(body)) for rk, body in batch.texts if rk not in bad]
    return Rows(batch.keys, requests, events, texts, refused, batch.queued)


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
            cur.execute(_UPDATE, {"replica": replica})
            if cur.rowcount != 0:
                for statement in _REPLACED:
                    cur.execute(statement)
            cur.execute(_UPSERT, {"replica": replica})
            cur.execute(_INSERT)
            found = cur.fetchone()
            assert found is not None
            requests, updated, events = int(found[0]), int(found[1]), int(found[2])
            if requests:
                cur.execute(_REPLICA, {"replica": replica, "shipped": requests})
    return Shipped(requests, events, len(batch.requests) - requests - updated, updated)
