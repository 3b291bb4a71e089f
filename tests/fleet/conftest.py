"""Fixtures of the fleet tests: one real PostgreSQL server for the session, a fresh database per test.

`postgres` is shared by every test of the session (starting one costs about a second); a test
that must stop or kill its server (an outage) asks for `own_postgres` instead.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tools.servers.postgres import PostgresServer


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
