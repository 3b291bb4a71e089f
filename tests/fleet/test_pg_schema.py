"""The fleet journal's PostgreSQL schema: migrations from every older version, day partitions,
retention by dropping them, idempotent identity, full-text search. Against a real server."""

from __future__ import annotations

import time
from datetime import date, timedelta
from typing import Any

import orjson
import psycopg
import pytest

from journal import packed, sketch
from journal.events import Block, Completed, Received
from journal.pg import partitions, schema
from journal.writer import encode

DAY = date(2026, 11, 30)
TS = 1764504000.25  # 2026-11-30T12:00:00.25Z


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def _ship_by_hand(conn: psycopg.Connection[Any], replica: str, request_id: str, text: str) -> int:
    """One request as a v1 database holds it: its summary row and its events (one JSON, one packed run)."""
    received = Received(
        method="POST",
        path="/v1/messages",
        request_id=request_id,
        ts=TS,
        body=orjson.dumps({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": text}]}).decode(),
    )
    deltas = [
        Block(event={"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}, t=0.01 * i)
        for i, w in enumerate(["Café ", "au ", "lait"], start=1)
    ]
    completed = Completed(status=200, duration_ms=12.5, bytes_sent=100, t=0.05)
    row = conn.execute(
        "INSERT INTO requests (day, replica, id, ts, status, completed) VALUES (%s, %s, %s, %s, 200, 1)"
        " ON CONFLICT (replica, id, day) DO NOTHING RETURNING rk",
        (DAY, replica, request_id, TS),
    ).fetchone()
    assert row is not None
    rk = int(row[0])
    rows = [
        (DAY, rk, 0, "received", 0.0, encode(received)),
        (DAY, rk, 1, packed.RUN_KIND, deltas[0].t, packed.pack(deltas, deltas[0].t, encode)),
        (DAY, rk, 4, "completed", completed.t, encode(completed)),
    ]
    with conn.cursor() as cur:
        cur.executemany("INSERT INTO events (day, rk, seq, kind, t, data) VALUES (%s, %s, %s, %s, %s, %s)", rows)
    return rk


def test_a_fresh_database_migrates_to_the_current_version(pg_url: str) -> None:
    with _connect(pg_url) as conn:
        with pytest.raises(schema.SchemaMissing):
            schema.check(conn)
        assert schema.migrate(conn) == schema.SCHEMA_VERSION
        assert schema.check(conn) == schema.SCHEMA_VERSION
        assert schema.migrate(conn) == schema.SCHEMA_VERSION  # idempotent
        versions = conn.execute("SELECT version FROM schema_migrations ORDER BY version").fetchall()
        assert [v for (v,) in versions] == list(range(1, schema.SCHEMA_VERSION + 1))
        kinds = dict(
            conn.execute(
                "SELECT relname, relkind FROM pg_class WHERE relname IN ('requests', 'events', 'request_text')"
            ).fetchall()
        )
        assert kinds == {"requests": "p", "events": "p", "request_text": "p"}  # all partitioned


def test_migrates_from_every_older_version_keeping_what_was_shipped(pg_url: str) -> None:
    for start in range(1, schema.SCHEMA_VERSION):
        with _connect(pg_url) as conn:
            conn.execute("DROP SCHEMA public CASCADE")
            conn.execute("CREATE SCHEMA public")
            conn.execute("DROP EXTENSION IF EXISTS unaccent")
            assert schema.migrate(conn, schema.MIGRATIONS[:start]) == start
            partitions.ensure(conn, [DAY])
            rk = _ship_by_hand(conn, "web-1", "msg_old", "Où est la gare?")
            assert schema.migrate(conn) == schema.SCHEMA_VERSION
            if (
                start < 2
            ):  # v2 folded the old request's events into its text (the prompt's last message and the answer).
                body = conn.execute("SELECT body FROM request_text WHERE rk = %s", (rk,)).fetchone()
                assert body is not None and "gare" in body[0] and "Café" in body[0] and "lait" in body[0]
                hits = conn.execute(
                    "SELECT rk FROM request_text WHERE tsv @@ smg_text_query(%s, false)", ("cafe AU lait",)
                ).fetchall()
                assert hits == [(rk,)]
            events = conn.execute("SELECT kind FROM events WHERE rk = %s ORDER BY seq", (rk,)).fetchall()
            assert [k for (k,) in events] == ["received", packed.RUN_KIND, "completed"]
            # v3 counted the request already shipped in the rollups, once.
            assert conn.execute("SELECT sum(requests)::int, count(*)::int FROM rollups").fetchone() == (
                3,
                3,
            )  # 3 grains
            assert conn.execute("SELECT count(*)::int FROM rollup_sketches").fetchone() == (0,)  # no times known


def test_v3_sketch_rows_become_one_value_per_rollup_row(pg_url: str) -> None:
    """A database of schema v3 as it was shipped: its sketches a `rollup_sketch` row per bucket."""
    with _connect(pg_url) as conn:
        conn.execute("DROP SCHEMA public CASCADE")
        conn.execute("CREATE SCHEMA public")
        conn.execute("DROP EXTENSION IF EXISTS unaccent")
        assert schema.migrate(conn, schema.MIGRATIONS[:3]) == 3
        partitions.ensure(conn, [DAY])
        _ship_by_hand(conn, "web-1", "msg_old", "hello")
        conn.execute("UPDATE requests SET ts = %s, duration_ms = 120.0", (TS,))  # counted, moved by the trigger
        rids = [rid for (rid,) in conn.execute("SELECT rid FROM rollups WHERE requests > 0 ORDER BY grain")]
        conn.execute("DROP TABLE rollup_sketches")
        conn.execute(
            "CREATE TABLE rollup_sketch (rid bigint NOT NULL REFERENCES rollups ON DELETE CASCADE,"
            " metric smallint NOT NULL, bucket bigint NOT NULL, n bigint NOT NULL, PRIMARY KEY (rid, metric, bucket))"
        )
        b = sketch.bucket(120.0)
        for rid in rids:
            conn.execute("INSERT INTO rollup_sketch VALUES (%s, 0, %s, 1), (%s, 0, %s, 0)", (rid, b, rid, b + 1))
        assert schema.migrate(conn) == schema.SCHEMA_VERSION
        assert conn.execute("SELECT to_regclass('rollup_sketch')").fetchone() == (None,)
        stored = conn.execute("SELECT rid, duration_sketch, ttfe_sketch FROM rollup_sketches ORDER BY rid").fetchall()
        assert stored == [(rid, {str(b): 1}, None) for rid in sorted(rids)]
        # The trigger functions write the new shape: a second request lands in the same rows.
        _ship_by_hand(conn, "web-1", "msg_new", "hello again")
        conn.execute("UPDATE requests SET ts = %s, duration_ms = 120.0 WHERE id = 'msg_new'", (TS,))
        stored = conn.execute("SELECT duration_sketch FROM rollup_sketches").fetchall()
        assert stored == [({str(b): 2},)] * len(rids)


def test_a_newer_schema_is_refused(pg_url: str) -> None:
    with _connect(pg_url) as conn:
        schema.migrate(conn)
        conn.execute(
            "INSERT INTO schema_migrations (version, description) VALUES (%s, 'from the future')",
            (schema.SCHEMA_VERSION + 1,),
        )
        with pytest.raises(schema.SchemaTooNew):
            schema.check(conn)
        with pytest.raises(schema.SchemaTooNew):
            schema.migrate(conn)


def test_a_request_is_one_row_per_replica_however_often_shipped(pg_url: str) -> None:
    with _connect(pg_url) as conn:
        schema.migrate(conn)
        partitions.ensure(conn, [DAY])
        _ship_by_hand(conn, "web-1", "msg_1", "hello")
        with pytest.raises(AssertionError):  # the second insert conflicts: RETURNING gives no row
            _ship_by_hand(conn, "web-1", "msg_1", "hello")
        _ship_by_hand(conn, "web-2", "msg_1", "hello")  # another replica's request of the same id
        assert conn.execute("SELECT replica FROM requests ORDER BY replica").fetchall() == [("web-1",), ("web-2",)]


def test_partitions_are_created_ahead_and_dropped_whole(pg_url: str) -> None:
    with _connect(pg_url) as conn:
        schema.migrate(conn)
        today = partitions.day_of(time.time())
        assert partitions.ensure(conn, partitions.ahead()) == [today + timedelta(days=i) for i in range(3)]
        assert partitions.ensure(conn, partitions.ahead()) == []
        partitions.ensure(conn, [DAY, DAY - timedelta(days=1)])
        _ship_by_hand(conn, "web-1", "msg_1", "kept until its day is dropped")
        names = {r[0] for r in conn.execute("SELECT relname FROM pg_class WHERE relname LIKE 'events_p%'")}
        assert f"events_p{DAY:%Y%m%d}" in names
        with pytest.raises(psycopg.errors.CheckViolation):
            # a day with no partition has nowhere to go: ensure() is what makes one
            conn.execute("INSERT INTO requests (day, replica, id) VALUES ('2020-01-01', 'x', 'y')")
        assert partitions.drop_before(conn, DAY + timedelta(days=1)) == [DAY - timedelta(days=1), DAY]
        assert conn.execute("SELECT count(*) FROM requests").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM events").fetchone() == (0,)
        assert partitions.days(conn) == [today + timedelta(days=i) for i in range(3)]


@pytest.mark.parametrize(
    ("needle", "prefix", "found"),
    [
        ("overload", True, True),  # a bare word is a prefix
        ("overload", False, False),
        ("rate limit", False, True),  # a phrase: its words in order
        ("limit rate", False, False),
        ("RÉSUMÉ", False, True),  # case- and accent-insensitive
        ("tool_name", False, True),  # split where unicode61 splits: tool, name
        ("!!!", True, None),  # no word: no query
    ],
)
def test_text_search_matches_words_as_the_local_index_does(
    pg_url: str, needle: str, prefix: bool, found: bool | None
) -> None:
    with _connect(pg_url) as conn:
        schema.migrate(conn)
        partitions.ensure(conn, [DAY])
        conn.execute(
            "INSERT INTO request_text (day, rk, body) VALUES (%s, 1, %s)",
            (DAY, "overloaded_error: rate limit reached for the résumé, tool-name call"),
        )
        query = conn.execute("SELECT smg_text_query(%s, %s)", (needle, prefix)).fetchone()
        assert query is not None
        if found is None:
            assert query[0] is None
            return
        hits = conn.execute("SELECT count(*) FROM request_text WHERE tsv @@ smg_text_query(%s, %s)", (needle, prefix))
        assert hits.fetchone() == (int(found),)
