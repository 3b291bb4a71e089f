"""Schema version and migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from journal import schema
from journal.writer import JournalWriter


def test_version_one_creates_everything(tmp_path: Path) -> None:
    conn = schema.connect(tmp_path / "j.db")
    try:
        assert schema.SCHEMA_VERSION == 1
        assert schema.schema_version(conn) == 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"events", "requests"} <= tables
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {"requests_ts", "requests_model", "requests_status", "requests_error_code"} <= (indexes)
        columns = tuple(r[1] for r in conn.execute("PRAGMA table_info(requests)"))
        assert columns == schema.REQUEST_COLUMNS
        event_columns = [r[1] for r in conn.execute("PRAGMA table_info(events)")]
        assert event_columns == ["request_id", "seq", "kind", "t", "data"]
    finally:
        conn.close()


async def test_opening_twice_is_idempotent(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    for _ in range(2):
        writer = JournalWriter(path)
        await writer.start()
        await writer.close()
    conn = schema.connect(path)
    try:
        assert schema.migrate(conn) == 1
        assert schema.schema_version(conn) == 1
    finally:
        conn.close()


def test_migrations_apply_in_order_and_once(tmp_path: Path) -> None:
    calls: list[int] = []

    def v2(conn: sqlite3.Connection) -> None:
        calls.append(2)
        conn.execute("CREATE TABLE extra (x INTEGER)")

    conn = schema.connect(tmp_path / "j.db")
    try:
        steps = [*schema.MIGRATIONS, v2]
        assert schema.migrate(conn, steps) == 2
        assert schema.migrate(conn, steps) == 2
        assert calls == [2]
    finally:
        conn.close()


def test_a_failing_migration_leaves_the_version_alone(tmp_path: Path) -> None:
    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half (x)")
        raise RuntimeError("boom")

    conn = schema.connect(tmp_path / "j.db")
    try:
        with pytest.raises(RuntimeError):
            schema.migrate(conn, [*schema.MIGRATIONS, broken])
        assert schema.schema_version(conn) == 1
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
        assert "half" not in names
    finally:
        conn.close()


def test_a_newer_journal_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(schema.SchemaTooNew):
        schema.connect(path)
