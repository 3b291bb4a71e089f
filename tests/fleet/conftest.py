"""Fixtures of the fleet tests: one real PostgreSQL server for the session, a fresh database per test.

`postgres` is shared by every test of the session (starting one costs about a second); a test
that must stop or kill its server (an outage) asks for `own_postgres` instead. `sink` is such a
database with the fleet schema, `started` stops the shippers a test started, `until` polls.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from journal.pg import schema
from journal.pg.shipper import Shipper
from tools.servers.postgres import PostgresServer


def until(condition: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll `condition` until it returns something truthy (bounded); returns that value."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_url(postgres: PostgresServer) -> Iterator[str]:
    """The URL of an empty database of its own (dropped after the test)."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    url = postgres.create_database(name)
    try:
        yield url
    finally:
        postgres.drop_database(name)


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A server of the test's own, which it may stop, kill and start again."""
    server = PostgresServer().start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def sink(pg_url: str) -> str:
    """`pg_url` with the fleet journal's schema migrated in."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        schema.migrate(conn)
    return pg_url


@pytest.fixture
def started() -> Iterator[list[Shipper]]:
    """The shippers the test starts (appended here), stopped after it."""
    shippers: list[Shipper] = []
    yield shippers
    for shipper in shippers:
        shipper.stop()
