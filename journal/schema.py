"""The journal's SQLite schema and its migrations.

The schema version lives in `PRAGMA user_version`. `MIGRATIONS[i]` takes a database from
version `i` to `i + 1`; each is a plain function of a `sqlite3.Connection` that runs inside
the transaction `migrate` opens, so a migration and its version bump commit together or not
at all. Version 1 creates the tables; version 2 adds the indexes that filtered, time-ordered
listing needs (`journal.query`) and the `bodies` column (`journal.bodies`); version 3 adds
`client_id`; version 4 makes the journal compact (below); version 5 adds the search columns
and the full-text index (`journal.search`); version 6 makes the summary's indexes cheaper to
keep (below); version 7 adds `cost_usd` (`journal.prices`) and the rollups (`journal.rollups`:
the tables, their triggers, the completed requests already in the file counted once, and the
partial index of the requests in flight); version 8 keeps each rollup row's sketches as one value
and folds the rollups once per transaction (`journal.rollups.upgrade`; a file that reaches v7 from
an older one is given that shape by v7 already, so its requests are counted once); version 9
adds the table where completed requests' texts wait for the text index (`journal.search.stage_text`:
the writer indexes them, and folds the rollups, about once a second). Add a migration
by appending a function; never edit one that has shipped.

Request identity (v3): `requests.id` and `events.request_id` hold an id the gateway mints for
every request (`msg_…`/`req_…`), so two requests are never one record. The id the client sent
(`x-request-id` or another configured header), which the gateway echoes, is `client_id`: not
unique (a client may reuse one) and NULL when the client sent none. Rows written before v3 were
keyed by the echoed id itself; the migration copies it into `client_id`, so a lookup by the id
a client was given works for old and new rows alike.

Two tables: `events` (the ground truth) and `requests` (one summary row per request, folded
from its events by `journal.summary`, kept for listing and filtering without reading the
events).

Compact storage (v4): `requests.rk` is an integer key (the rowid, assigned by SQLite when the
writer first upserts the request's row, so several processes writing one file never collide),
and `events` is keyed by `(rk, seq)` (a unique index): no event row repeats the text id, and
no index repeats it again. An event row is one event with its JSON payload, or (kind
`run`, `journal.packed`) the consecutive streaming events of one request from one flush window,
`seq` and `t` of the first. The migration keeps v3's rows as they were (one JSON row each).

Cheaper indexes (v6): every index on `requests` is paid for by each write of a summary row and
by each request `prune` deletes, and the ones whose keys are random (a trace id, a duration)
cost a page of the write-ahead log per deleted request each. v6 drops the indexes on
`duration_ms` and `ttfe_ms` (a `dur:`/`ttft:` filter reads the time index, and counts scan the
summary table, both well under a second at a million requests), and makes the indexes of
columns that are often NULL (an error code, a tenant, the search columns of a request that
sent no trace, user or session) partial, holding only the rows that have a value: a term on
such a column always says `column IS NOT NULL`, which lets SQLite use them. The indexes of the
columns whose values few requests share (trace, session, conversation, client's id) are
by bucket of arrival first (`journal.search.keyed`), so that deleting the oldest requests
touches the front of each instead of a page per request all over it.
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable

from journal import rollups, search

DEFAULT_PATH = "smg-journal.db"
"""Where `smg launch` writes and `smg journal …` reads when nothing else is said."""
ENV_VAR = "SMG_JOURNAL"
"""Environment variable that overrides `DEFAULT_PATH`."""

Progress = Callable[[int, int], None]
"""Told (requests counted, requests to count) as a migration that counts requests goes on."""
Migration = Callable[[sqlite3.Connection, Progress | None], None]
"""One step, told of its progress when it counts every request (the rollups')."""


def _v1(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    conn.execute(
        """
        CREATE TABLE events (
            request_id TEXT NOT NULL,
            seq        INTEGER NOT NULL,
            kind       TEXT NOT NULL,
            t          REAL NOT NULL,
            data       TEXT NOT NULL,  -- JSON payload, without t
            PRIMARY KEY (request_id, seq)
        )
        """
    )
    conn.execute(
        """
        CREATE TABLE requests (
            id            TEXT PRIMARY KEY,
            ts            REAL,     -- wall clock at arrival (epoch seconds)
            method        TEXT,
            path          TEXT,
            tenant        TEXT,
            model         TEXT,
            backend       TEXT,
            worker        TEXT,
            stream        INTEGER,
            status        INTEGER,
            error_code    TEXT,
            error_type    TEXT,
            stop_reason   TEXT,
            input_tokens  INTEGER,
            output_tokens INTEGER,
            ttfe_ms       REAL,     -- time to the first upstream/block event
            duration_ms   REAL,
            bytes_sent    INTEGER,
            replay_of     TEXT,
            completed     INTEGER NOT NULL DEFAULT 0,
            has_tool_use  INTEGER NOT NULL DEFAULT 0,
            has_thinking  INTEGER NOT NULL DEFAULT 0
        )
        """
    )
    for column in ("ts", "model", "status", "error_code"):
        conn.execute(f"CREATE INDEX requests_{column} ON requests ({column})")


def _v2(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    # Listing is filter + ORDER BY ts LIMIT n. With (column, ts) indexes an equality filter
    # reads the matching rows already in time order and stops after n; a single-column index
    # would make SQLite fetch and sort every match (all of them, for `backend:http`).
    for column in ("model", "status", "error_code"):
        conn.execute(f"DROP INDEX IF EXISTS requests_{column}")
    for column in ("model", "status", "error_code", "backend", "tenant", "stop_reason"):
        conn.execute(f"CREATE INDEX requests_{column}_ts ON requests ({column}, ts)")
    for column in ("replay_of", "duration_ms", "ttfe_ms"):
        conn.execute(f"CREATE INDEX requests_{column} ON requests ({column})")
    # Which body capture mode (journal.bodies) wrote the request; rows from before v2 were full.
    conn.execute("ALTER TABLE requests ADD COLUMN bodies TEXT DEFAULT 'full'")


def _v3(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    conn.execute("ALTER TABLE requests ADD COLUMN client_id TEXT")
    conn.execute("UPDATE requests SET client_id = id")
    conn.execute("CREATE INDEX requests_client_id ON requests (client_id)")


_V4_REQUESTS = """
    CREATE TABLE requests (
        rk            INTEGER PRIMARY KEY,  -- the integer key events are stored under
        id            TEXT NOT NULL UNIQUE,
        ts            REAL,
        method        TEXT,
        path          TEXT,
        tenant        TEXT,
        model         TEXT,
        backend       TEXT,
        worker        TEXT,
        stream        INTEGER,
        status        INTEGER,
        error_code    TEXT,
        error_type    TEXT,
        stop_reason   TEXT,
        input_tokens  INTEGER,
        output_tokens INTEGER,
        ttfe_ms       REAL,
        duration_ms   REAL,
        bytes_sent    INTEGER,
        replay_of     TEXT,
        completed     INTEGER NOT NULL DEFAULT 0,
        has_tool_use  INTEGER NOT NULL DEFAULT 0,
        has_thinking  INTEGER NOT NULL DEFAULT 0,
        bodies        TEXT DEFAULT 'full',
        client_id     TEXT
    )
"""
_V3_COLUMNS = (
    "id, ts, method, path, tenant, model, backend, worker, stream, status, error_code, error_type, stop_reason,"
    " input_tokens, output_tokens, ttfe_ms, duration_ms, bytes_sent, replay_of, completed, has_tool_use,"
    " has_thinking, bodies, client_id"
)


def _v4(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    # SQLite cannot add a primary key (or the integer key the events point to) in place: both
    # tables are rebuilt, requests first so that every event finds its key.
    conn.execute("ALTER TABLE requests RENAME TO requests_v3")
    conn.execute("ALTER TABLE events RENAME TO events_v3")
    conn.execute(_V4_REQUESTS)
    conn.execute(f"INSERT INTO requests ({_V3_COLUMNS}) SELECT {_V3_COLUMNS} FROM requests_v3 ORDER BY ts, rowid")
    # Events whose summary row never made it (they were written in the same transaction, so
    # this is a safety net) get a bare row, so nothing of the old file is lost.
    conn.execute(
        "INSERT INTO requests (id) SELECT DISTINCT request_id FROM events_v3"
        " WHERE request_id NOT IN (SELECT id FROM requests)"
    )
    conn.execute(
        """
        CREATE TABLE events (
            rk    INTEGER NOT NULL,  -- requests.rk
            seq   INTEGER NOT NULL,  -- the event's (a run's first event's) number in its request
            kind  TEXT NOT NULL,     -- the event's kind, or `run` (journal.packed)
            t     REAL NOT NULL,     -- seconds since the request arrived
            data  BLOB NOT NULL      -- JSON payload without t (TEXT), or a packed run (BLOB)
        )
        """
    )
    # A rowid table, appended to in rowid order, fills its pages (SQLite splits an index
    # b-tree, which a WITHOUT ROWID table is, half-full when appending); the unique index on
    # (rk, seq) costs a few bytes per row, and a row is a whole flush window of a stream.
    conn.execute("CREATE UNIQUE INDEX events_rk_seq ON events (rk, seq)")
    conn.execute(
        "INSERT INTO events (rk, seq, kind, t, data)"
        " SELECT r.rk, e.seq, e.kind, e.t, e.data FROM events_v3 AS e JOIN requests AS r ON r.id = e.request_id"
    )
    conn.execute("DROP TABLE events_v3")
    conn.execute("DROP TABLE requests_v3")  # its indexes go with it
    conn.execute("CREATE INDEX requests_ts ON requests (ts)")
    for column in ("model", "status", "error_code", "backend", "tenant", "stop_reason"):
        conn.execute(f"CREATE INDEX requests_{column}_ts ON requests ({column}, ts)")
    for column in ("replay_of", "duration_ms", "ttfe_ms", "client_id"):
        conn.execute(f"CREATE INDEX requests_{column} ON requests ({column})")


PARTIAL_INDEXES: dict[str, str] = {
    "requests_error_code_ts": "error_code, ts",
    "requests_tenant_ts": "tenant, ts",
    "requests_replay_of": "replay_of",
    "requests_user_id_ts": "user_id, ts",
    "requests_key_fp_ts": "key_fp, ts",
}
"""v6's partial indexes of `requests` and their columns (only the rows whose first column is not NULL)."""
BUCKETED_INDEXES: dict[str, str] = {f"requests_{column}_bucket": column for column in search.KEYED}
"""v6's indexes by bucket of arrival, `(rk >> search.BUCKET_BITS, column)`, partial like those above."""


def _v6(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    conn.execute("DROP INDEX IF EXISTS requests_duration_ms")
    conn.execute("DROP INDEX IF EXISTS requests_ttfe_ms")
    for name, columns in PARTIAL_INDEXES.items():
        first = columns.split(",")[0]
        conn.execute(f"DROP INDEX IF EXISTS {name}")
        conn.execute(f"CREATE INDEX {name} ON requests ({columns}) WHERE {first} IS NOT NULL")
    for name, column in BUCKETED_INDEXES.items():
        conn.execute(f"DROP INDEX IF EXISTS requests_{column}_ts")  # v5's
        conn.execute(f"DROP INDEX IF EXISTS requests_{column}")  # v3's (client_id)
        conn.execute(
            f"CREATE INDEX {name} ON requests (rk >> {search.BUCKET_BITS}, {column}) WHERE {column} IS NOT NULL"
        )


def _v7(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    conn.execute("ALTER TABLE requests ADD COLUMN cost_usd REAL")
    rollups.create(conn, progress)


def _v8(conn: sqlite3.Connection, progress: Progress | None = None) -> None:
    rollups.upgrade(conn, progress)


# v5: the search columns and the text index (`journal.search.migrate`);
# v9: the staged texts (`journal.search.create_staging`).
MIGRATIONS: list[Migration] = [_v1, _v2, _v3, _v4, search.migrate, _v6, _v7, _v8, search.create_staging]
SCHEMA_VERSION = len(MIGRATIONS)

KEYED_VERSION = 4
"""From this version on events are keyed by `requests.rk` (and may be packed runs)."""

REQUEST_COLUMNS: tuple[str, ...] = (
    "id",
    "ts",
    "method",
    "path",
    "tenant",
    "model",
    "backend",
    "worker",
    "stream",
    "status",
    "error_code",
    "error_type",
    "stop_reason",
    "input_tokens",
    "output_tokens",
    "ttfe_ms",
    "duration_ms",
    "bytes_sent",
    "replay_of",
    "completed",
    "has_tool_use",
    "has_thinking",
    "bodies",
    "client_id",
    *search.COLUMNS,
    "cost_usd",
)
"""The summary columns of `requests`, in table order (v4 puts the integer key `rk` first)."""

FLAG_COLUMNS: tuple[str, ...] = ("completed", "has_tool_use", "has_thinking", *search.FLAGS)
"""0/1 columns that only ever go from 0 to 1."""

QUERIED_COLUMNS: tuple[str, ...] = ("client_id", *search.COLUMNS, "cost_usd")
"""Columns added after v1 that `journal.query` may name: a reader of an older file supplies them as NULL."""


class SchemaTooNew(RuntimeError):
    """The file was written by a newer smg than this one."""


def schema_version(conn: sqlite3.Connection) -> int:
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def apply_pragmas(conn: sqlite3.Connection) -> None:
    """WAL (readers never block the writer) and `synchronous=NORMAL` (a commit is not
    fsynced, but a committed transaction survives a process crash; see journal.writer).

    A new file also gets incremental auto-vacuum, so that pruning (journal.retention) can give
    freed pages back to the OS; SQLite accepts that setting only before the file has tables
    and before WAL is on, and ignores it on an existing file.
    """
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")


def migrate(
    conn: sqlite3.Connection, migrations: list[Migration] | None = None, progress: Progress | None = None
) -> int:
    """Bring the database up to date; returns the resulting version. `progress` is told how
    far the steps that count every request (the rollups') have got.

    Safe to call on every open and from several processes at once: the version is re-read
    under a write lock before each step. `conn` must be in autocommit mode
    (`isolation_level=None`), as `connect` makes it.
    """
    steps = MIGRATIONS if migrations is None else migrations
    while True:
        if schema_version(conn) >= len(steps):
            break
        conn.execute("BEGIN IMMEDIATE")
        try:
            version = schema_version(conn)
            if version < len(steps):
                steps[version](conn, progress)
                conn.execute(f"PRAGMA user_version = {version + 1}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
    version = schema_version(conn)
    if version > len(steps):
        raise SchemaTooNew(f"journal schema version {version} is newer than {len(steps)}")
    return version


def connect(path: str | os.PathLike[str], progress: Progress | None = None) -> sqlite3.Connection:
    """Open (creating if needed) a journal for writing: pragmas set, schema migrated (telling
    `progress`, if given, how a long migration goes on).

    The connection is in autocommit mode; group transactions with explicit BEGIN/COMMIT.
    """
    conn = sqlite3.connect(os.fspath(path), isolation_level=None, check_same_thread=False)
    rollups.register(conn)
    try:
        apply_pragmas(conn)
        migrate(conn, progress=progress)
    except BaseException:
        conn.close()
        raise
    return conn
