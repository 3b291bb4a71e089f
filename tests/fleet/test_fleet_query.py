"""The query language on the fleet journal: the property tests of `tests/journal/test_query.py`,
against a real PostgreSQL.

Random rows (with the replica each came from) are written into the fleet journal through the
shipper's own batch write (`journal.pg.ship.write`), random queries are rendered from syntax
trees, and the SQL `journal.pg.query` compiles must select exactly what the plain Python reading
of the documented semantics selects, free text through the text index included. On a file the
same tests hold with no replica at all (`tests/journal/test_query.py`).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tests.journal.test_query as on_a_file
from journal import schema as local_schema
from journal.pg import partitions, ship
from journal.pg import schema as pg_schema
from journal.pg.outbox import Batch
from journal.pg.query import compile_query
from journal.pg.read import PostgresReader
from journal.query import QueryError
from journal.redact import SECRET_ENV, redact_value
from tests.journal.test_query import (
    EXAMPLES,
    NOW,
    WORDS,
    Row,
    evaluate,
    indexed_text,
    render,
    row,
    rows,
    text_trees,
    trees,
)
from tools.servers.postgres import PostgresServer

REPLICAS = [w for w in WORDS if w]


@pytest.fixture(scope="module")
def fleet_db(postgres: PostgresServer) -> Iterator[psycopg.Connection[Any]]:
    url = postgres.create_database("fleet_query")
    with psycopg.connect(url, autocommit=True) as conn:
        pg_schema.migrate(conn)
        ship.prepare(conn)
        yield conn


def load(conn: psycopg.Connection[Any], table: list[Row], replicas: list[str]) -> None:
    """The rows, replica by replica, as the shipper writes a batch."""
    conn.execute("TRUNCATE requests, events, request_text")
    by_replica: dict[str, list[int]] = {}
    for n, replica in enumerate(replicas):
        by_replica.setdefault(replica, []).append(n)
    for replica, indexes in by_replica.items():
        batch = Batch([], [], [], [], [])
        for n in indexes:
            shipped = table[n]
            rk = n + 1
            values = [
                shipped.values.get(c, 0 if c in local_schema.FLAG_COLUMNS else None)
                for c in local_schema.REQUEST_COLUMNS
            ]
            batch.keys.append(rk)
            batch.requests.append((rk, *values))
            batch.events.extend((rk, seq, kind, 0.0, data) for seq, (kind, data) in enumerate(shipped.events, 1))
            batch.texts.append((rk, indexed_text(shipped)))
        shipped_rows = ship.rows(batch)
        partitions.ensure(conn, shipped_rows.days)
        ship.write(conn, replica, shipped_rows)


def select_ids(conn: psycopg.Connection[Any], query: str) -> set[str]:
    where, params = compile_query(query, now=NOW)
    return {r[0] for r in conn.execute(f"SELECT id FROM requests WHERE {where}", params)}


@st.composite
def fleet_rows(draw: st.DrawFn) -> tuple[list[Row], list[str]]:
    table = draw(rows())
    replicas = [draw(st.sampled_from(REPLICAS)) for _ in table]
    for one, replica in zip(table, replicas, strict=True):
        one.values["replica"] = replica  # what the Python filter reads; shipped as the batch's replica
    return table, replicas


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(fleet_rows(), st.lists(trees, min_size=1, max_size=8))
def test_compiled_queries_select_what_the_python_filter_selects(
    fleet_db: psycopg.Connection[Any], data: tuple[list[Row], list[str]], queries: list[Any]
) -> None:
    table, replicas = data
    load(fleet_db, table, replicas)
    for tree in queries:
        text = render(tree)
        expected = {r.values["id"] for r in table if evaluate(tree, r, indexed=True)}
        assert select_ids(fleet_db, text) == expected, text


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(fleet_rows(), st.lists(text_trees, min_size=1, max_size=8))
def test_free_text_through_the_reader(
    fleet_db: psycopg.Connection[Any], postgres: PostgresServer, data: tuple[list[Row], list[str]], queries: list[Any]
) -> None:
    table, replicas = data
    load(fleet_db, table, replicas)
    with PostgresReader(postgres.url("fleet_query")) as reader:
        for tree in queries:
            text = render(tree)
            expected = {r.values["id"] for r in table if evaluate(tree, r, indexed=True)}
            assert reader.count(text) == len(expected), text
            assert {r["id"] for r in reader.list_requests(len(table) + 1, query=text)} == expected, text


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.lists(
        st.sampled_from([*'ab:"()|!*%_\\ <>=-', "model:", "status:", "has:", "replica:", "4xx", "1s"]), max_size=20
    ).map("".join)
)
def test_any_text_compiles_to_sql_that_runs_or_is_refused_clearly(fleet_db: psycopg.Connection[Any], text: str) -> None:
    try:
        where, params = compile_query(text)
    except QueryError as exc:
        assert "column" in str(exc)
        return
    fleet_db.execute(f"SELECT id FROM requests WHERE {where}", params).fetchall()


# The examples of the file's tests, every one on the fleet journal (their rows from two replicas).
FILE_EXAMPLES: list[tuple[str, set[str]]] = on_a_file.test_examples.pytestmark[0].args[1]
EXAMPLE_REPLICAS = ["web-1", "web-2", "web-1"]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        *FILE_EXAMPLES,
        ("replica:web-1", {"req_ok", "req_inflight"}),
        ("replica:WEB-*", {"req_ok", "req_err", "req_inflight"}),  # patterns ignore ASCII case
        ("replica:Web-1", set()),  # exact values do not
        ("replica:!=web-1", {"req_err"}),
        ("!replica:web-2 status:200", {"req_ok"}),
        ("replica:web-2|web-3", {"req_err"}),
        ("replica:web-1 has:error | replica:web-2 has:error", {"req_err"}),
    ],
)
def test_examples(fleet_db: psycopg.Connection[Any], postgres: PostgresServer, query: str, expected: set[str]) -> None:
    assert [r.values["id"] for r in EXAMPLES] == ["req_ok", "req_err", "req_inflight"]
    load(fleet_db, EXAMPLES, EXAMPLE_REPLICAS)
    assert select_ids(fleet_db, query) == expected
    if not query.startswith(("since", "until")):
        with PostgresReader(postgres.url("fleet_query")) as reader:
            assert reader.count(query) == len(expected)


def test_like_metacharacters_are_literal(fleet_db: psycopg.Connection[Any]) -> None:
    table = [row("a", model="a%c"), row("b", model="abc"), row("c", model="a_c"), row("D", model="ABC")]
    load(fleet_db, table, ["r", "r", "r", "R-é"])
    assert select_ids(fleet_db, "model:a%*") == {"a"}
    assert select_ids(fleet_db, "model:a_*") == {"c"}
    assert select_ids(fleet_db, "model:a*c") == select_ids(fleet_db, "model:A*C") == {"a", "b", "c", "D"}
    assert select_ids(fleet_db, "id:a") == {"a"} and select_ids(fleet_db, "id:d*") == {"D"}
    assert select_ids(fleet_db, "replica:r*") == {"a", "b", "c", "D"}
    # ASCII letters only, as SQLite's LIKE: É is not é.
    assert select_ids(fleet_db, "replica:r-É*") == set() and select_ids(fleet_db, "replica:r-é*") == {"D"}


def test_a_callers_key_is_matched_by_its_fleet_fingerprints(
    fleet_db: psycopg.Connection[Any], postgres: PostgresServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "s" * 32  # the fleet's $SMG_TENANT_SECRET, which its replicas key fingerprints with
    monkeypatch.setenv(SECRET_ENV, secret)

    def fp(value: str, key: bytes | None = None) -> str:  # a summary row's key_fp: the redacted key's digest
        return redact_value(value, key).removeprefix("[redacted sha256:").removesuffix("]")

    table = [row("new", key_fp=fp("sk-ant-mine", secret.encode())), row("old", key_fp=fp("sk-ant-mine"))]
    table.append(row("other", key_fp=fp("sk-ant-other", secret.encode())))
    # What the module's other loads counted: their TRUNCATE fires no trigger.
    fleet_db.execute("TRUNCATE rollups, rollup_sketches")
    load(fleet_db, table, ["web-1", "web-1", "web-2"])
    with PostgresReader(postgres.url("fleet_query")) as reader:
        assert reader.count("key:sk-ant-mine") == 2
        assert {r["id"] for r in reader.list_requests(10, query="key:sk-ant-mine")} == {"new", "old"}
        assert reader.count("!key:sk-ant-mine") == 1
        reader.exact_up_to = 0  # from the rollups, as a large fleet journal's stats are
        assert reader.stats("!key:sk-ant-mine")["requests"] == 1
