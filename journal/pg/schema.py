"""The fleet journal's PostgreSQL schema and its versioned migrations (tables: `journal.pg`).

`MIGRATIONS[i]` takes a database from version `i` to `i + 1`. `migrate` runs each step in a
transaction of its own, under an advisory lock, with the row recording it in
`schema_migrations`: a step and its record commit together or not at all, and several
replicas starting at once migrate once. Add a step by appending it; never edit one that has
shipped. Version 1 creates the partitioned `requests` and `events`, their indexes,
`replicas` and `schema_migrations`; version 2 adds the full-text search (`request_text`, the
`unaccent` extension, `smg_text_vector`/`smg_text_query`), filled in for the requests already
shipped by folding their events through `journal.search`, as the local journal's v5 did;
version 3 adds `cost_usd` and the rollups (`journal.pg.rollups`), as the local journal's v7.

Who migrates: `smg launch --journal-sink` upgrades an older smg schema at start (like the local
file), and refuses a database that has none (`SchemaMissing`): creating the schema is an
operator's act (`smg journal-sink init URL`), so a mistyped database name is an error at
start rather than a fresh empty journal nobody reads.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
import psycopg

from journal import packed, search
from journal.events import event_from_dict
from journal.pg import partitions, rollups

Migration = Callable[[psycopg.Connection[Any]], None]
_LOCK = 0x534D474D  # advisory lock key ("SMGM") held while migrating

INTEGER_COLUMNS = frozenset(
    {"stream", "status", "input_tokens", "output_tokens", "bytes_sent", "completed", "has_tool_use", "has_thinking"}
    | {"turns", *search.FLAGS}
)
"""Summary columns that hold integers (the flags 0/1); every other is text, or `REAL_COLUMNS`."""
REAL_COLUMNS = frozenset({"ts", "ttfe_ms", "duration_ms", "cost_usd"})
"""Summary columns that hold `double precision`."""


class SchemaMissing(RuntimeError):
    """The database has no smg journal schema."""


class SchemaTooNew(RuntimeError):
    """The database was migrated by a newer smg than this one."""


def _v1(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE SEQUENCE requests_rk_seq AS bigint")
    conn.execute(
        """
        CREATE TABLE requests (
            day            date NOT NULL,
            replica        text NOT NULL,
            rk             bigint NOT NULL DEFAULT nextval('requests_rk_seq'),
            local_rk       bigint,
            id             text NOT NULL,
            ts             double precision,
            method         text,
            path           text,
            tenant         text,
            model          text,
            backend        text,
            worker         text,
            stream         smallint,
            status         bigint,
            error_code     text,
            error_type     text,
            stop_reason    text,
            input_tokens   bigint,
            output_tokens  bigint,
            ttfe_ms        double precision,
            duration_ms    double precision,
            bytes_sent     bigint,
            replay_of      text,
            completed      smallint NOT NULL DEFAULT 0,
            has_tool_use   smallint NOT NULL DEFAULT 0,
            has_thinking   smallint NOT NULL DEFAULT 0,
            bodies         text,
            client_id      text,
            trace_id       text,
            user_id        text,
            session_id     text,
            key_fp         text,
            thread_key     text,
            turns          bigint,
            hung_up        smallint NOT NULL DEFAULT 0,
            cut_mid_stream smallint NOT NULL DEFAULT 0,
            shipped_at     timestamptz NOT NULL DEFAULT now(),
            PRIMARY KEY (rk, day),
            UNIQUE (replica, id, day)
        ) PARTITION BY RANGE (day)
        """
    )
    conn.execute("ALTER SEQUENCE requests_rk_seq OWNED BY requests.rk")
    conn.execute(
        """
        CREATE TABLE events (
            day   date NOT NULL,
            rk    bigint NOT NULL,
            seq   integer NOT NULL,
            kind  text NOT NULL,
            t     double precision NOT NULL,
            data  bytea NOT NULL,
            PRIMARY KEY (rk, seq, day)
        ) PARTITION BY RANGE (day)
        """
    )
    # Listing is filter + ORDER BY ts LIMIT n: (column, ts) reads an equality filter's matches
    # in time order within each day and stops early; partial where most rows are NULL.
    conn.execute("CREATE INDEX requests_ts ON requests (ts)")
    for column in ("replica", "model", "status", "backend", "worker", "stop_reason"):
        conn.execute(f"CREATE INDEX requests_{column}_ts ON requests ({column}, ts)")
    for column in ("error_code", "tenant", "user_id", "key_fp", "thread_key"):
        conn.execute(f"CREATE INDEX requests_{column}_ts ON requests ({column}, ts) WHERE {column} IS NOT NULL")
    for column in ("trace_id", "session_id", "replay_of"):
        conn.execute(f"CREATE INDEX requests_{column} ON requests ({column}) WHERE {column} IS NOT NULL")
    conn.execute("CREATE INDEX requests_id ON requests (id text_pattern_ops)")
    conn.execute("CREATE INDEX requests_client_id ON requests (client_id text_pattern_ops) WHERE client_id IS NOT NULL")
    for flag in ("has_tool_use", "has_thinking", *search.FLAGS):
        conn.execute(f"CREATE INDEX requests_{flag}_ts ON requests (ts) WHERE {flag} = 1")
    conn.execute(
        """
        CREATE TABLE replicas (
            name             text PRIMARY KEY,
            first_shipped_at timestamptz NOT NULL DEFAULT now(),
            last_shipped_at  timestamptz NOT NULL DEFAULT now(),
            requests         bigint NOT NULL DEFAULT 0
        )
        """
    )


# Words as SQLite's unicode61 tokenizer cuts them (runs of letters and digits), lower-cased and
# unaccented (its remove_diacritics), then handed to the `simple` configuration, which keeps
# every word as it is: no stemming, no stop words, as FTS5 does.
_WORDS = "regexp_replace(lower({unaccent}('{schema}.unaccent'::regdictionary, {arg})), '[^[:alnum:]]+', ' ', 'g')"


def _v2(conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE EXTENSION IF NOT EXISTS unaccent")
    row = conn.execute("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'unaccent'")
    found = row.fetchone()
    assert found is not None
    schema = found[0]
    unaccent = f"{schema}.unaccent"
    words = _WORDS.format(unaccent=unaccent, schema=schema, arg="body")
    conn.execute(
        f"""
        CREATE FUNCTION smg_text_vector(body text) RETURNS tsvector
        LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
        RETURN to_tsvector('pg_catalog.simple'::regconfig, {words})
        """
    )
    words = _WORDS.format(unaccent=unaccent, schema=schema, arg="phrase")
    conn.execute(
        f"""
        CREATE FUNCTION smg_text_query(phrase text, prefix boolean) RETURNS tsquery
        LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
        RETURN (
            SELECT CASE WHEN w = '' THEN NULL
                   ELSE to_tsquery('pg_catalog.simple'::regconfig,
                                   replace(w, ' ', ' <-> ') || CASE WHEN prefix THEN ':*' ELSE '' END)
                   END
            FROM btrim({words}) AS w
        )
        """
    )
    conn.execute(
        """
        CREATE TABLE request_text (
            day  date NOT NULL,
            rk   bigint NOT NULL,
            body text NOT NULL,
            tsv  tsvector GENERATED ALWAYS AS (smg_text_vector(body)) STORED,
            PRIMARY KEY (rk, day)
        ) PARTITION BY RANGE (day)
        """
    )
    conn.execute("CREATE INDEX request_text_tsv ON request_text USING gin (tsv)")
    partitions.ensure(conn, partitions.days(conn))
    _backfill_text(conn)


def _backfill_text(conn: psycopg.Connection[Any]) -> None:
    """The text of the requests shipped before v2, folded from their events (`journal.search`)."""
    kinds = ["received", "block", "upstream", "error", "rejected", "completed", packed.RUN_KIND]
    last = -1
    while True:
        batch = conn.execute(
            "SELECT rk, day, stream FROM requests WHERE rk > %s AND completed = 1 ORDER BY rk LIMIT 1000", (last,)
        ).fetchall()
        if not batch:
            return
        last = batch[-1][0]
        texts: list[tuple[Any, ...]] = []
        for rk, day, stream in batch:
            row: dict[str, Any] = {"stream": stream}
            events = conn.execute(
                "SELECT seq, kind, t, data FROM events WHERE rk = %s AND day = %s AND kind = ANY(%s) ORDER BY seq",
                (rk, day, kinds),
            )
            for seq, kind, t, data in events:
                try:
                    if kind == packed.RUN_KIND:
                        for _, inner, inner_t, payload in packed.unpack(seq, t, bytes(data)):
                            search.fold(row, event_from_dict(inner, payload, inner_t))
                    else:
                        search.fold(row, event_from_dict(kind, orjson.loads(bytes(data)), t))
                except Exception:  # an event an older smg wrote that this one cannot read
                    continue
            text = search.text_of(row)
            if text:
                texts.append((day, rk, text.replace("\x00", "")))
        with conn.cursor() as cur:
            cur.executemany("INSERT INTO request_text (day, rk, body) VALUES (%s, %s, %s)", texts)


MIGRATIONS: list[Migration] = [_v1, _v2, rollups.migrate, rollups.upgrade]
SCHEMA_VERSION = len(MIGRATIONS)
_DESCRIPTIONS = (
    "requests, events and replicas, partitioned by day",
    "full-text search (request_text)",
    "cost_usd and the rollups (journal.pg.rollups)",
    "one sketch value per rollup row and metric (journal.pg.rollups.upgrade)",
)


def version(conn: psycopg.Connection[Any]) -> int:
    """The database's schema version; 0 when it has no smg schema."""
    found = conn.execute("SELECT to_regclass('schema_migrations') IS NOT NULL").fetchone()
    if not found or not found[0]:
        return 0
    row = conn.execute("SELECT coalesce(max(version), 0) FROM schema_migrations").fetchone()
    return int(row[0]) if row else 0


def migrate(conn: psycopg.Connection[Any], migrations: list[Migration] | None = None) -> int:
    """Bring the database up to date (each step committed on its own); the resulting version.

    `conn` must not be inside a transaction. Safe from several processes at once."""
    steps = MIGRATIONS if migrations is None else migrations
    while True:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY,"
                " description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            current = version(conn)
            if current > len(MIGRATIONS):
                raise SchemaTooNew(f"the fleet journal's schema version {current} is newer than {len(MIGRATIONS)}")
            if current >= len(steps):
                return current
            steps[current](conn)
            description = _DESCRIPTIONS[current] if current < len(_DESCRIPTIONS) else f"version {current + 1}"
            conn.execute(
                "INSERT INTO schema_migrations (version, description) VALUES (%s, %s)", (current + 1, description)
            )


def check(conn: psycopg.Connection[Any]) -> int:
    """The version, when the database has the smg schema and this smg can write it (an older
    version included: `migrate` upgrades it). Raises SchemaMissing or SchemaTooNew."""
    current = version(conn)
    if current == 0:
        raise SchemaMissing("the database has no smg journal schema")
    if current > SCHEMA_VERSION:
        raise SchemaTooNew(f"the fleet journal's schema version {current} is newer than {SCHEMA_VERSION}")
    return current
