"""The journal's read side: synchronous, read-only, safe next to a live writer.

The file is opened with `mode=ro`, so a reader can never write or migrate it; under WAL a
reader sees the last committed state and never blocks the gateway's writer. Used by
`smg journal …`, the inspector and replay. Listing and counting take a query in the
language of `journal.query`. A file written by an older smg (a lower schema version) is read
as it is: columns it does not have yet read as NULL.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import orjson

from journal import groups, packed, redact, rollup_stats, rollups, schema, search, stats
from journal.events import Event, event_from_dict, event_kinds
from journal.follow import Follower
from journal.query import RollupPlan, compile_query, rollup_plan, text_only
from journal.store import REPLICA

_BOOL_COLUMNS = ("stream", "completed", "has_tool_use", "has_thinking", *search.FLAGS)


class JournalError(Exception):
    """The journal cannot be read as asked."""


class JournalNotFound(JournalError, FileNotFoundError):
    """No journal at that path (or only an empty file the writer has not migrated yet)."""


class AmbiguousRequestId(JournalError, LookupError):
    """An id prefix, or a client's request id, matches more than one request."""

    def __init__(self, prefix: str, matches: list[str], *, client_id: bool = False) -> None:
        what = "is the client id of" if client_id else "matches"
        more = " (and more)" if len(matches) > 10 else ""
        super().__init__(
            f"{prefix!r} {what} several requests: {', '.join(matches[:10])}{more}; name one by the gateway's id"
        )
        self.prefix = prefix
        self.matches = matches
        self.client_id = client_id


class JournalReader:
    """Read-only access to one journal file (a `journal.store.JournalStore`)."""

    stats_source = ""
    """Where the last `group_stats` read its numbers: `from rollups …` or `scanned N requests`."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise JournalNotFound(f"no journal at {self.path}")
        uri = self.path.resolve().as_uri() + "?mode=ro"
        try:
            self._conn = sqlite3.connect(uri, uri=True, check_same_thread=False)
            self._conn.execute("PRAGMA busy_timeout=5000")
            version = schema.schema_version(self._conn)
        except sqlite3.DatabaseError as exc:
            raise JournalError(f"{self.path} is not a readable journal: {exc}") from exc
        if version < 1:
            tables = self._conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
            self._conn.close()
            if tables == 0:  # created a moment ago, the writer has not migrated it yet
                raise JournalNotFound(f"the journal at {self.path} is not initialised yet")
            raise JournalError(f"{self.path} is not an smg journal (schema version {version})")
        self._known = frozenset(event_kinds())
        present = {row[1] for row in self._conn.execute("PRAGMA table_info(requests)")}
        missing = [c for c in schema.QUERIED_COLUMNS if c not in present]
        keyed = "rk" in present
        if missing or not keyed:
            # An older file: temporary views (this connection's alone; the file is never
            # written) stand in for `requests` with the newer columns as NULL and the integer
            # key `rk` that v4 added (the rowid), and for `events` keyed by it, so queries that
            # name them (`id:` also looks at `client_id`; text search joins on `rk`) work on
            # every version.
            nulls = "".join(f", NULL AS {c}" for c in missing)
            key = "" if keyed else "rowid AS rk, "
            self._conn.execute(f"CREATE TEMP VIEW requests AS SELECT {key}*{nulls} FROM main.requests")
            if not keyed:
                self._conn.execute(
                    "CREATE TEMP VIEW events AS SELECT r.rowid AS rk, e.seq, e.kind, e.t, e.data"
                    " FROM main.events AS e JOIN main.requests AS r ON r.id = e.request_id"
                )
        columns = [c if c in present else f"NULL AS {c}" for c in schema.REQUEST_COLUMNS]
        self._select = f"SELECT {', '.join(columns)} FROM requests"
        self._has_client_id = "client_id" in present
        # v4 keys events by `requests.rk`; older files by the text id itself.
        if keyed:
            self._events_sql = (
                "SELECT seq, kind, t, data FROM events WHERE rk = (SELECT rk FROM requests WHERE id = ?) ORDER BY seq"
            )
            self._exists_sql = "SELECT 1 FROM requests AS r JOIN events AS e ON e.rk = r.rk WHERE r.id = ? LIMIT 1"
        else:
            self._events_sql = "SELECT seq, kind, t, data FROM main.events WHERE request_id = ? ORDER BY seq"
            self._exists_sql = "SELECT 1 FROM main.events WHERE request_id = ? LIMIT 1"
        self.indexed = search.has_index(self._conn)
        """Whether free text is looked up in the full-text index (else scanned for; an older file)."""
        self.rollups = rollups.present(self._conn)
        """Whether the file keeps rollups (`journal.rollups`; not a file of an older version)."""
        self.exact_up_to = rollup_stats.EXACT_UP_TO
        """`stats` scans a selection the rollups count at most this many requests of (exact percentiles)."""

    def compile(self, query: str, *, ordered: bool = False) -> tuple[str, list[Any]]:
        """`query` as SQL over this file's `requests` (`journal.query.compile_query`, with the
        text index when the file has one; `ordered` for a page in time order). Raises
        `journal.query.QueryError`."""
        return compile_query(query, indexed=self.indexed, ordered=ordered, fingerprints=self.key_fingerprints)

    def key_fingerprints(self, key: str) -> list[str]:
        """The fingerprints the caller's `key` may be stored under in this file (keyed with
        the secret beside it or `$SMG_TENANT_SECRET`, when this reader can read it; and bare)."""
        return redact.key_fingerprints(key, redact.read_secret(self.path))

    @property
    def location(self) -> str:
        """The file's path, as messages name it."""
        return str(self.path)

    def check(self, query: str) -> None:
        """Raise `journal.query.QueryError` when `query` does not compile."""
        self.compile(query)

    def stats(self, query: str = "") -> dict[str, Any]:
        """`journal.stats.compute` of the requests `query` selects, from the rollups when they
        can answer it and count more than `journal.rollup_stats.EXACT_UP_TO` of them; `source`
        says which (`rollups` or `scan`) and `scanned` how many summary rows were read."""
        plan = self._plan(query)
        if plan is not None:
            out, scanned = rollup_stats.stats(rollup_stats.sqlite_run(self._conn), plan)
            return {**out, "source": "rollups", "scanned": scanned}
        where, params = self.compile(query)
        out = stats.compute(self._conn, where, params)
        return {**out, "source": "scan", "scanned": out["requests"]}

    def group_stats(self, query: str = "", *, by: str | None = None, every: int | None = None) -> list[dict[str, Any]]:
        """`journal.groups.compute` of the requests `query` selects (from the rollups as
        `stats`); `stats_source` says where the last call read them."""
        plan = self._plan(query)
        if plan is not None:
            column = groups.GROUPS.get(by) if by is not None else None
            if by is None or column is not None:
                answered = rollup_stats.groups(rollup_stats.sqlite_run(self._conn), plan, column=column, every=every)
                if answered is not None:
                    rows, scanned = answered
                    self.stats_source = f"from rollups (and {scanned} requests read)" if scanned else "from rollups"
                    return rows
        where, params = self.compile(query)
        rows = groups.compute(self._conn, where, params, by=by, every=every)
        self.stats_source = f"scanned {sum(r['requests'] for r in rows)} requests"
        return rows

    def _plan(self, query: str) -> RollupPlan | None:
        """The rollup plan of `query` when the rollups should answer it (None: scan)."""
        self.compile(query)  # a query that does not compile is an error before anything is read
        if not self.rollups:
            return None
        plan = rollup_plan(query, fingerprints=self.key_fingerprints)
        if plan is None or rollup_stats.counted(rollup_stats.sqlite_run(self._conn), plan) <= self.exact_up_to:
            return None
        return plan

    def thread_ids(self, thread_key: str, limit: int) -> list[str]:
        """The ids of the requests with this conversation key (`journal.threads`), oldest first."""
        rows = self._conn.execute(
            f"SELECT id FROM requests WHERE {search.keyed('thread_key = ?')} ORDER BY ts, rowid LIMIT ?",
            (thread_key, limit),
        ).fetchall()
        return [str(r[0]) for r in rows]

    def follower(self, query: str = "") -> Follower:
        """A `journal.follow.Follower` of `query` over this file."""
        where, params = self.compile(query)
        return Follower(self._conn, where, params)

    def interrupt(self) -> None:
        """Stop the statement running on this reader's connection (it raises `sqlite3.OperationalError`)."""
        self._conn.interrupt()

    @property
    def connection(self) -> sqlite3.Connection:
        """The read-only connection, for SQL of `journal.stats` and the like."""
        return self._conn

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> JournalReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def count(self, query: str = "") -> int:
        """How many requests match `query` (see `journal.query`; empty: all of them).

        Raises `journal.query.QueryError` for a query that does not parse.
        """
        if self.indexed:
            text = text_only(query)
            if text is not None:  # counted in the text index alone (see `journal.query.text_only`)
                expression, negated = text
                matches = self._conn.execute(
                    f"SELECT count(*) FROM {search.TABLE} WHERE {search.TABLE} MATCH ?", (expression,)
                ).fetchone()[0]
                if not negated:
                    return int(matches)
                return int(self._conn.execute("SELECT count(*) FROM requests").fetchone()[0]) - int(matches)
        where, params = self.compile(query)
        return int(self._conn.execute(f"SELECT count(*) FROM requests WHERE {where}", params).fetchone()[0])

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
        """Summary rows (see `journal.schema.REQUEST_COLUMNS`) matching `query`, sorted by the
        summary column `order` (ties by arrival), `limit` of them after skipping `offset`.

        `since_ts` keeps requests that arrived at or after that time (epoch seconds).
        `newest_first` is the older spelling of `descending`. Raises `ValueError` for an
        `order` that is not a summary column and `journal.query.QueryError` for a bad query.
        """
        if order not in schema.REQUEST_COLUMNS:
            raise ValueError(f"cannot order by {order!r}; choose one of {', '.join(schema.REQUEST_COLUMNS)}")
        if newest_first is not None:
            descending = newest_first
        where, params = self.compile(query, ordered=order == "ts")
        if since_ts is not None:
            where = f"({where}) AND ts >= ?"
            params.append(since_ts)
        direction = "DESC" if descending else "ASC"
        keys = [order] if order == "ts" else [order, "ts"]
        order_by = ", ".join(f"{key} {direction}" for key in [*keys, "rowid"])
        rows = self._conn.execute(
            f"{self._select} WHERE {where} ORDER BY {order_by} LIMIT ? OFFSET ?",
            [*params, limit, offset],
        ).fetchall()
        return [_row(r) for r in rows]

    def list_after(self, limit: int, *, query: str = "", after: int = 0) -> list[tuple[int, dict[str, Any]]]:
        """Up to `limit` summary rows `query` selects whose row key (`rk`) is past `after`, in
        the order the journal recorded them, each with its key: a scan of any size a page at a
        time, each page a seek (no OFFSET to skip again), and rows added meanwhile come after."""
        where, params = self.compile(query)
        select = self._select.replace("SELECT ", "SELECT rk, ", 1)
        rows = self._conn.execute(
            f"{select} WHERE ({where}) AND rk > ? ORDER BY rk LIMIT ?", [*params, after, limit]
        ).fetchall()
        return [(int(r[0]), _row(r[1:])) for r in rows]

    def page(
        self, limit: int = 50, *, query: str = "", offset: int = 0, **options: Any
    ) -> tuple[list[dict[str, Any]], int]:
        """`list_requests` and how many requests match in all. The count is a second query
        only when the page is full (else it is `offset` plus the rows), and one over indexes
        then: the filter's, or the text index's."""
        rows = self.list_requests(limit, query=query, offset=offset, **options)
        if len(rows) < limit and (rows or offset == 0):
            return rows, offset + len(rows)
        return rows, self.count(query)

    def get_request(self, id_or_prefix: str) -> dict[str, Any] | None:
        """The summary row of a request by the gateway's id for it, a unique prefix of that
        id, or the id the client sent (`client_id`, exact) when one request has it.

        The gateway's id wins: it is tried first, then the client's id, then the prefix.
        Returns None when nothing matches; raises `AmbiguousRequestId` (listing the gateway's
        ids of the candidates) when a prefix matches several requests or a client reused an
        id for several.
        """
        row = self._conn.execute(f"{self._select} WHERE id = ?", (id_or_prefix,)).fetchone()
        if row is not None:
            return _row(row)
        if not id_or_prefix:
            return None
        if self._has_client_id:
            rows = self._conn.execute(
                f"{self._select} WHERE {search.keyed('client_id = ?')} ORDER BY ts, rowid LIMIT 11", (id_or_prefix,)
            ).fetchall()
            if len(rows) > 1:
                raise AmbiguousRequestId(id_or_prefix, [r[0] for r in rows], client_id=True)
            if rows:
                return _row(rows[0])
        # A range scan on the primary key: every id that starts with the prefix sorts in
        # [prefix, prefix + U+10FFFF).
        rows = self._conn.execute(
            f"{self._select} WHERE id >= ? AND id < ? ORDER BY id LIMIT 11",
            (id_or_prefix, id_or_prefix + "\U0010ffff"),
        ).fetchall()
        if len(rows) > 1:
            raise AmbiguousRequestId(id_or_prefix, [r[0] for r in rows])
        return _row(rows[0]) if rows else None

    def resolve(self, request_id: str) -> str:
        """The gateway's id of the request that `request_id` names: itself when events are
        stored under it, else the one request whose client id it is (raises
        `AmbiguousRequestId` when several are). Unknown ids are returned as they are."""
        if self._conn.execute(self._exists_sql, (request_id,)).fetchone():
            return request_id
        if not self._has_client_id or not request_id:
            return request_id
        ids = [
            r[0]
            for r in self._conn.execute(
                f"SELECT id FROM requests WHERE {search.keyed('client_id = ?')} ORDER BY ts, rowid LIMIT 11",
                (request_id,),
            )
        ]
        if len(ids) > 1:
            raise AmbiguousRequestId(request_id, ids, client_id=True)
        return ids[0] if ids else request_id

    def raw_events(self, request_id: str) -> list[tuple[int, str, float, dict[str, Any]]]:
        """`(seq, kind, t, payload)` of a request's events as stored, ordered by seq.

        `request_id` is the gateway's id, or a client id that one request has (`resolve`).
        Packed runs (`journal.packed`) are unpacked: one tuple per event, whatever the storage.
        A payload that strict JSON cannot hold (a lone surrogate escape, written by an older
        smg) is decoded leniently, the surrogate kept as an escape.
        """
        rows = self._conn.execute(self._events_sql, (self.resolve(request_id),)).fetchall()
        out: list[tuple[int, str, float, dict[str, Any]]] = []
        for seq, kind, t, data in rows:
            if kind == packed.RUN_KIND and isinstance(data, bytes):
                out.extend(packed.unpack(seq, t, data))
            else:
                out.append((seq, kind, t, _loads(data)))
        return out

    def events(self, request_id: str) -> list[tuple[int, Event]]:
        """`(seq, event)` of a request (by either id, as `raw_events`), ordered by seq.

        Kinds this version does not know (written by a newer smg) are skipped; use
        `raw_events` to see everything.
        """
        return [
            (seq, event_from_dict(kind, data, t))
            for seq, kind, t, data in self.raw_events(request_id)
            if kind in self._known
        ]


def _loads(data: str | bytes) -> Any:
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError:
        return _printable(json.loads(data))


def _printable(value: Any) -> Any:
    """`value` with lone surrogates in its strings spelled as `\\udXXX` escapes."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def _row(row: tuple[Any, ...]) -> dict[str, Any]:
    out = dict(zip(schema.REQUEST_COLUMNS, row, strict=True))
    for col in _BOOL_COLUMNS:
        if out[col] is not None:
            out[col] = bool(out[col])
    out[REPLICA] = None  # one gateway's own file names no replica (`journal.store`)
    return out
