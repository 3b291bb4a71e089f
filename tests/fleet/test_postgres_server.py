"""The PostgreSQL harness itself: a real server that runs, refuses a wrong password, stops by PID."""

from __future__ import annotations

import os

import psycopg
import pytest

from tools.servers.postgres import PostgresServer


def test_a_fresh_database_answers(pg_url: str) -> None:
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT current_setting('server_version_num')::int").fetchone()[0] >= 140000
        assert conn.execute("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").fetchone() == (0,)


def test_a_wrong_password_is_refused(postgres: PostgresServer) -> None:
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(postgres.url(password="wrong"), connect_timeout=5)


def test_stop_start_and_kill_by_pid(own_postgres: PostgresServer) -> None:
    with psycopg.connect(own_postgres.url(), autocommit=True) as conn:
        conn.execute("CREATE TABLE kept (x int)")
        conn.execute("INSERT INTO kept VALUES (1)")
    pid = own_postgres.pid
    assert pid is not None
    own_postgres.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(own_postgres.url(), connect_timeout=2)
    own_postgres.start()
    with psycopg.connect(own_postgres.url()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(1,)]
    own_postgres.kill()
    assert own_postgres.pid is None
    own_postgres.start()  # recovers from the crash
    with psycopg.connect(own_postgres.url()) as conn:
        assert conn.execute("SELECT x FROM kept").fetchall() == [(1,)]
