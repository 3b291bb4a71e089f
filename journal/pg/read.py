"""The read side of the fleet journal: every replica's requests, as `smg journal …` reads a file.

`PostgresReader` is the `journal.store.JournalStore` of a `postgresql://` URL: the same
methods and the same rows as `journal.reader.JournalReader`, plus each row's `replica`.
Queries compile with `journal.pg.query`; statistics read the rows `journal.stats.summarize`
and `journal.groups.aggregate` compute from, so both stores give the same numbers.

Listing orders as a file does, ties broken the same way: by the sort column (NULL lowest, text
by code point, as SQLite's BINARY collation), then arrival, then replica and the request's key
in its replica's file (a file's own order). The session is read-only
(`default_transaction_read_only`): a reader never writes the fleet journal. Every error of the
server (unreachable, refused, no schema, a query cancelled) is a `journal.reader.JournalError`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from typing import Any

import orjson
import psycopg

from journal import groups, packed, redact, rollup_stats, schema, search, stats
from journal.events import Event, event_from_dict, event_kinds
from journal.pg import schema as pg_schema
from journal.pg.query import _FAILED, _PgCompiler, compile_query, text_only
from journal.query import RollupPlan, rollup_plan
from journal.reader import AmbiguousRequestId, JournalError, JournalNotFound
from journal.store import REPLICA, shown

COLUMNS: tuple[str, ...] = (*schema.REQUEST_COLUMNS, REPLICA)
"""The columns a row is read from, in the order of the row dict (a file's, then `replica`)."""
_BOOL_COLUMNS = ("stream", "completed", "has_tool_use", "has_thinking", *search.FLAGS)
_TEXT_COLUMNS = frozenset(COLUMNS) - pg_schema.INTEGER_COLUMNS - pg_schema.REAL_COLUMNS
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM requests"
_RATED = "output_tokens IS NOT NULL AND +duration_ms > 0"
_CONNECT_TIMEOUT_S = 10


class PgFollower:
    """The requests that reach the fleet journal after it was created, matching `where`
    (`smg journal tail`).

    A file's follower (`journal.follow`) goes by arrival and watches requests in flight; here
    a request appears only once its replica has shipped it, completed, however long after its
    arrival: the cursor is its arrival in PostgreSQL (`shipped_at`, the shipping transaction's
    start), re-read `lag` seconds back for transactions that commit out of order, and the read
    is bounded by the fleet-wide key (`rk`, from a sequence, so in insert order) less a margin
    of `slack` rows, through the primary key, never a scan of the table.
    """

    def __init__(
        self, reader: PostgresReader, where: str, params: Sequence[Any], *, lag: float = 5.0, slack: int = 100_000
    ) -> None:
        self._reader = reader
        self._where = where
        self._params = list(params)
        self._lag = lag
        self._slack = slack
        found = reader._rows("SELECT COALESCE(max(rk), 0), extract(epoch FROM now())::float8 FROM requests")[0]
        self._floor = int(found[0]) - slack
        self._cursor = float(found[1])
        # What is already there is history.
        self._seen = {rk: at for rk, _, at in self._read()}

    def _read(self) -> list[tuple[int, str, float]]:
        rows = self._reader._rows(
            "SELECT rk, id, extract(epoch FROM shipped_at)::float8 FROM requests"
            f" WHERE rk > %s AND shipped_at > to_timestamp(%s) AND ({self._where}) ORDER BY ts, replica, local_rk",
            [self._floor, self._cursor - self._lag, *self._params],
        )
        return [(int(rk), str(request_id), float(at)) for rk, request_id, at in rows]

    def poll(self, now: float | None = None) -> list[str]:
        """Ids of the matching requests shipped since the last poll, by arrival."""
        fresh = [(rk, request_id, at) for rk, request_id, at in self._read() if rk not in self._seen]
        for rk, _, at in fresh:
            self._seen[rk] = at
        if self._seen:
            newest = max(self._seen.values())
            self._cursor = max(self._cursor, newest)
            self._floor = max(self._floor, max(self._seen) - self._slack)
            floor = self._cursor - self._lag
            self._seen = {rk: at for rk, at in self._seen.items() if at > floor}
        return [request_id for _, request_id, _ in fresh]


class PostgresReader:
    """Read-only access to the fleet journal at a `postgresql://` URL (see the module docstring)."""

    stats_source = ""

    def __init__(self, url: str) -> None:
        self.url = url
        self._shown = shown(url)
        self._lock = threading.Lock()
        try:
            self._conn = psycopg.connect(url, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)
        except psycopg.Error as exc:
            raise JournalError(f"cannot connect to the fleet journal at {self._shown}: {_reason(exc)}") from exc
        try:
            self._conn.execute("SET default_transaction_read_only = on")
            version = pg_schema.version(self._conn)
        except psycopg.Error as exc:
            self._conn.close()
            raise JournalError(f"{self._shown} is not a readable fleet journal: {_reason(exc)}") from exc
        if version == 0:
            self._conn.close()
            raise JournalNotFound(f"{self._shown} has no smg journal schema (create it with `smg journal-sink init`)")
        self.version = version
        self._known = frozenset(event_kinds())
        # A database an older smg migrated (before v3) has no cost column and no rollups yet.
        self._cost = "cost_usd" if version >= 3 else "NULL::float8"
        self._select = _SELECT if version >= 3 else _SELECT.replace("cost_usd", "NULL::float8 AS cost_usd", 1)
        self.rollups = version >= 3
        """Whether the fleet journal keeps rollups (`journal.pg.rollups`)."""
        self.exact_up_to = rollup_stats.EXACT_UP_TO
        """`stats` scans a selection the rollups count at most this many requests of (exact percentiles)."""

    # -- the store --------------------------------------------------------------------------

    @property
    def location(self) -> str:
        """The URL without its password."""
        return self._shown

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The read-only connection (autocommit), for SQL of the caller's own."""
        return self._conn

    def compile(self, query: str) -> tuple[str, list[Any]]:
        """`query` as PostgreSQL over `requests` (`journal.pg.query`); raises `QueryError`."""
        return compile_query(query, fingerprints=self.key_fingerprints)

    def key_fingerprints(self, key: str) -> list[str]:
        """The fingerprints the caller's `key` may be stored under in the fleet journal: keyed
        with `$SMG_TENANT_SECRET` (the fleet's, when this reader has it) and bare."""
        return redact.key_fingerprints(key, redact.fleet_secret())

    def check(self, query: str) -> None:
        self.compile(query)

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> PostgresReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def interrupt(self) -> None:
        """Cancel the statement running on the connection (it raises `JournalError`)."""
        try:
            self._conn.cancel_safe()
        except psycopg.Error:
            pass

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            with self._lock:
                return self._conn.execute(sql, list(params)).fetchall()
        except psycopg.Error as exc:
            raise JournalError(f"reading the fleet journal at {self._shown} failed: {_reason(exc)}") from exc

    def count(self, query: str = "") -> int:
        text = text_only(query)
        if text is not None:  # counted in the text index alone (`journal.pg.query.text_only`)
            condition, params, negated = text
            matches = int(self._rows(f"SELECT count(*) FROM request_text WHERE {condition}", params)[0][0])
            if not negated:
                return matches
            return int(self._rows("SELECT count(*) FROM requests")[0][0]) - matches
        where, params = self.compile(query)
        return int(self._rows(f"SELECT count(*) FROM requests WHERE {where}", params)[0][0])

    def list_requests(
        self,
        limit: int = 50,
        *,
        query: str = "",
        offset: int = 0,
        order: str = "ts",
        descending: bool = True,
        since_ts: float | None = None,
        newest_first: bool | None = None,
    ) -> list[dict[str, Any]]:
        """As `JournalReader.list_requests`; `order` may also be `replica`."""
        if order not in COLUMNS:
            raise ValueError(f"cannot order by {order!r}; choose one of {', '.join(COLUMNS)}")
        if newest_first is not None:
            descending = newest_first
        where, params = self.compile(query)
        if since_ts is not None:
            where = f"({where}) AND ts >= %s"
            params.append(since_ts)
        # SQLite sorts NULL lowest and text by code point: the same here.
        direction = "DESC NULLS LAST" if descending else "ASC NULLS FIRST"
        keys = [order] if order == "ts" else [order, "ts"]
        order_by = ", ".join(f"{_sortable(key)} {direction}" for key in [*keys, "replica", "local_rk"])
        rows = self._rows(
            f"{self._select} WHERE {where} ORDER BY {order_by} LIMIT %s OFFSET %s", [*params, limit, offset]
        )
        return [_row(r) for r in rows]

    def list_after(self, limit: int, *, query: str = "", after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        """As `JournalReader.list_after`, by the fleet journal's own row key."""
        where, params = self.compile(query)
        select = _SELECT.replace("SELECT ", "SELECT rk, ", 1)
        rows = self._rows(f"{select} WHERE ({where}) AND rk > %s ORDER BY rk LIMIT %s", [*params, after, limit])
        return [(int(r[0]), _row(r[1:])) for r in rows]

    def page(
        self, limit: int = 50, *, query: str = "", offset: int = 0, **options: Any
    ) -> tuple[list[dict[str, Any]], int]:
        rows = self.list_requests(limit, query=query, offset=offset, **options)
        if len(rows) < limit and (rows or offset == 0):
            return rows, offset + len(rows)
        return rows, self.count(query)

    def get_request(self, id_or_prefix: str) -> dict[str, Any] | None:
        """As `JournalReader.get_request`: the gateway's id, else a client's id one request
        has, else a unique prefix of the gateway's id; across every replica."""
        order = 'ORDER BY ts NULLS FIRST, replica COLLATE "C", local_rk'
        rows = self._rows(f"{self._select} WHERE id = %s {order} LIMIT 1", (id_or_prefix,))
        if rows:
            return _row(rows[0])
        if not id_or_prefix:
            return None
        rows = self._rows(f"{self._select} WHERE client_id = %s {order} LIMIT 11", (id_or_prefix,))
        if len(rows) > 1:
            raise AmbiguousRequestId(id_or_prefix, [r[0] for r in rows], client_id=True)
        if rows:
            return _row(rows[0])
        prefix = id_or_prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self._rows(
            f'{self._select} WHERE id LIKE %s ESCAPE \'\\\' ORDER BY id COLLATE "C", replica COLLATE "C" LIMIT 11',
            (prefix,),
        )
        if len(rows) > 1:
            raise AmbiguousRequestId(id_or_prefix, [r[0] for r in rows])
        return _row(rows[0]) if rows else None

    def _key(self, request_id: str) -> tuple[int, Any] | None:
        """`(rk, day)` of the request `request_id` names (the gateway's id, else one request's client id)."""
        order = 'ORDER BY ts NULLS FIRST, replica COLLATE "C", local_rk'
        rows = self._rows(f"SELECT rk, day FROM requests WHERE id = %s {order} LIMIT 1", (request_id,))
        if rows:
            return int(rows[0][0]), rows[0][1]
        if not request_id:
            return None
        rows = self._rows(f"SELECT rk, day, id FROM requests WHERE client_id = %s {order} LIMIT 11", (request_id,))
        if len(rows) > 1:
            raise AmbiguousRequestId(request_id, [r[2] for r in rows], client_id=True)
        return (int(rows[0][0]), rows[0][1]) if rows else None

    def resolve(self, request_id: str) -> str:
        if self._rows("SELECT 1 FROM requests WHERE id = %s LIMIT 1", (request_id,)):
            return request_id
        if not request_id:
            return request_id
        rows = self._rows(
            'SELECT id FROM requests WHERE client_id = %s ORDER BY ts NULLS FIRST, replica COLLATE "C", local_rk'
            " LIMIT 11",
            (request_id,),
        )
        if len(rows) > 1:
            raise AmbiguousRequestId(request_id, [r[0] for r in rows], client_id=True)
        return str(rows[0][0]) if rows else request_id

    def raw_events(self, request_id: str) -> list[tuple[int, str, float, dict[str, Any]]]:
        """As `JournalReader.raw_events`: the events as shipped (packed runs unpacked)."""
        key = self._key(request_id)
        if key is None:
            return []
        rows = self._rows("SELECT seq, kind, t, data FROM events WHERE rk = %s AND day = %s ORDER BY seq", key)
        out: list[tuple[int, str, float, dict[str, Any]]] = []
        for seq, kind, t, data in rows:
            data = bytes(data)
            if kind == packed.RUN_KIND:
                out.extend(packed.unpack(seq, t, data))
            else:
                out.append((seq, kind, t, _loads(data)))
        return out

    def events(self, request_id: str) -> list[tuple[int, Event]]:
        return [
            (seq, event_from_dict(kind, data, t))
            for seq, kind, t, data in self.raw_events(request_id)
            if kind in self._known
        ]

    # -- statistics -------------------------------------------------------------------------

    def stats(self, query: str = "") -> dict[str, Any]:
        """`journal.stats.compute` of the requests `query` selects, read in PostgreSQL: from the
        rollups as on a file (`journal.reader.JournalReader.stats`)."""
        plan = self._plan(query)
        if plan is not None:
            out, scanned = rollup_stats.stats(self._rows, plan, rollup_stats.POSTGRES)
            return {**out, "source": "rollups", "scanned": scanned}
        where, params = self.compile(query)
        totals = self._rows(
            f"SELECT count(*), COALESCE(sum(completed), 0), count(*) FILTER (WHERE {_FAILED}), min(ts), max(ts),"
            " COALESCE(sum(input_tokens), 0), COALESCE(sum(output_tokens), 0),"
            f" count(*) FILTER (WHERE {_RATED}), COALESCE(sum(output_tokens) FILTER (WHERE {_RATED}), 0),"
            f" COALESCE(sum({self._cost}), 0), count({self._cost}) FROM requests WHERE {where}",
            params,
        )[0]
        totals = tuple(float(v) if v is not None and not isinstance(v, int | float) else v for v in totals)
        rows = self._rows(
            "SELECT json_build_array(CASE WHEN status IS NULL THEN 'none' ELSE (status / 100)::text || 'xx' END,"
            f" status, model, backend, CASE WHEN {_FAILED} THEN COALESCE(error_code, error_type, 'status ' || status)"
            f" END, stop_reason)::text, duration_ms, ttfe_ms,"
            f" CASE WHEN {_RATED} THEN output_tokens::float8 * 1000.0::float8 / duration_ms END"
            f" FROM requests WHERE {where}",
            params,
        )
        out = stats.summarize(totals, rows)
        return {**out, "source": "scan", "scanned": out["requests"]}

    def group_stats(self, query: str = "", *, by: str | None = None, every: int | None = None) -> list[dict[str, Any]]:
        """`journal.groups.compute` of the requests `query` selects, read in PostgreSQL."""
        if by is not None and by not in groups.GROUPS:
            raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(groups.GROUPS)}")
        plan = self._plan(query)
        if plan is not None:
            column = groups.GROUPS.get(by) if by is not None else None
            answered = rollup_stats.groups(self._rows, plan, rollup_stats.POSTGRES, column=column, every=every)
            if answered is not None:
                rows, scanned = answered
                self.stats_source = f"from rollups (and {scanned} requests read)" if scanned else "from rollups"
                return rows
        where, params = self.compile(query)
        group = groups.GROUPS[by] if by is not None else "NULL"
        bucket = f"(floor(ts / {int(every)}) * {int(every)})::bigint" if every else "NULL"
        out = groups.aggregate(
            self._rows(
                f"SELECT {group}, {bucket}, {_FAILED}, hung_up, duration_ms, ttfe_ms, input_tokens, output_tokens,"
                f" {self._cost} FROM requests WHERE {where}",
                params,
            )
        )
        self.stats_source = f"scanned {sum(r['requests'] for r in out)} requests"
        return out

    def _plan(self, query: str) -> RollupPlan | None:
        """The rollup plan of `query` when the rollups should answer it (None: scan)."""
        self.compile(query)
        if not self.rollups:
            return None
        plan = rollup_plan(query, compiler_type=_PgCompiler, fingerprints=self.key_fingerprints)
        if plan is None or rollup_stats.counted(self._rows, plan, rollup_stats.POSTGRES) <= self.exact_up_to:
            return None
        return plan

    def thread_ids(self, thread_key: str, limit: int) -> list[str]:
        rows = self._rows(
            'SELECT id FROM requests WHERE thread_key = %s ORDER BY ts NULLS FIRST, replica COLLATE "C", local_rk'
            " LIMIT %s",
            (thread_key, limit),
        )
        return [str(r[0]) for r in rows]

    def follower(self, query: str = "") -> PgFollower:
        where, params = self.compile(query)
        return PgFollower(self, where, params)


def _sortable(column: str) -> str:
    """`column` as SQLite sorts it: text by code point (`COLLATE "C"`)."""
    return f'{column} COLLATE "C"' if column in _TEXT_COLUMNS else column


def _reason(exc: psycopg.Error) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def _loads(data: bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        # A payload strict JSON cannot hold (a lone surrogate escape), shipped as the file stores it.
        from journal.reader import _printable

        return _printable(json.loads(data))


def _row(row: tuple[Any, ...]) -> dict[str, Any]:
    out = dict(zip(COLUMNS, row, strict=True))
    for col in _BOOL_COLUMNS:
        if out[col] is not None:
            out[col] = bool(out[col])
    return out
