"""Schema version and migrations."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from journal import schema
from journal.reader import JournalReader
from journal.writer import JournalWriter


def test_a_new_journal_has_every_table_and_index(tmp_path: Path) -> None:
    conn = schema.connect(tmp_path / "j.db")
    try:
        assert schema.SCHEMA_VERSION == 9
        assert schema.schema_version(conn) == len(schema.MIGRATIONS)
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2  # incremental: prune shrinks the file
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        assert {"events", "requests", "request_text", "request_text_staged", "rollups", "rollup_pending"} <= tables
        assert "rollup_sketch" not in tables  # v7's, one row per bucket: v8 keeps one value per row
        indexes = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert {
            "requests_ts",
            "requests_model_ts",
            "requests_status_ts",
            "requests_error_code_ts",
            "requests_backend_ts",
            "requests_tenant_ts",
            "requests_stop_reason_ts",
            "requests_replay_of",
            "requests_client_id_bucket",
            "requests_trace_id_bucket",
            "requests_user_id_ts",
            "requests_session_id_bucket",
            "requests_key_fp_ts",
            "requests_thread_key_bucket",
            "requests_hung_up_ts",
            "requests_cut_mid_stream_ts",
            "requests_in_flight",
            "rollups_key",
            "rollups_ts",
        } <= indexes
        assert not {"requests_model", "requests_status", "requests_error_code"} & indexes  # replaced in v2
        assert not {"requests_duration_ms", "requests_ttfe_ms", "requests_trace_id_ts"} & indexes  # gone in v6
        columns = tuple(r[1] for r in conn.execute("PRAGMA table_info(requests)"))
        assert columns == ("rk", *schema.REQUEST_COLUMNS)
        event_columns = [r[1] for r in conn.execute("PRAGMA table_info(events)")]
        assert event_columns == ["rk", "seq", "kind", "t", "data"]
        assert "events_rk_seq" in indexes
    finally:
        conn.close()


def test_a_version_one_journal_is_migrated_with_its_rows(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, schema.MIGRATIONS[:1])
    conn.execute("INSERT INTO requests (id, ts, model, status) VALUES ('old', 1.0, 'm', 200)")
    conn.execute("INSERT INTO events VALUES ('old', 1, 'received', 0.0, '{}')")
    conn.close()

    with JournalReader(path) as reader:  # read-only: an old file reads as it is, bodies unknown
        old = reader.get_request("old")
    assert old is not None and old["bodies"] is None and old["model"] == "m"

    conn = schema.connect(path)
    try:
        assert schema.schema_version(conn) == schema.SCHEMA_VERSION
        assert conn.execute("SELECT id, model, status, bodies, client_id FROM requests").fetchall() == [
            ("old", "m", 200, "full", "old")
        ]
        assert conn.execute("SELECT count(*) FROM events").fetchone()[0] == 1
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
        assert schema.migrate(conn) == schema.SCHEMA_VERSION
        assert schema.schema_version(conn) == schema.SCHEMA_VERSION
    finally:
        conn.close()


def test_migrations_apply_in_order_and_once(tmp_path: Path) -> None:
    calls: list[int] = []

    def extra(conn: sqlite3.Connection, progress: schema.Progress | None = None) -> None:
        calls.append(1)
        conn.execute("CREATE TABLE extra (x INTEGER)")

    conn = schema.connect(tmp_path / "j.db")
    try:
        steps = [*schema.MIGRATIONS, extra]
        assert schema.migrate(conn, steps) == len(steps)
        assert schema.migrate(conn, steps) == len(steps)
        assert calls == [1]
    finally:
        conn.close()


def test_a_failing_migration_leaves_the_version_alone(tmp_path: Path) -> None:
    def broken(conn: sqlite3.Connection, progress: schema.Progress | None = None) -> None:
        conn.execute("CREATE TABLE half (x)")
        raise RuntimeError("boom")

    conn = schema.connect(tmp_path / "j.db")
    try:
        with pytest.raises(RuntimeError):
            schema.migrate(conn, [*schema.MIGRATIONS, broken])
        assert schema.schema_version(conn) == schema.SCHEMA_VERSION
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


async def test_a_version_two_journal_keyed_by_client_ids_reads_and_migrates(tmp_path: Path) -> None:
    from journal.events import Completed, Received

    path = tmp_path / "j.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.apply_pragmas(conn)
    schema.migrate(conn, schema.MIGRATIONS[:2])  # as smg wrote it before request ids were minted
    received = '{"method":"POST","path":"/v1/messages","request_id":"client-7","headers":{},"ts":5.0}'
    conn.execute("INSERT INTO events VALUES ('client-7', 1, 'received', 0.0, ?)", (received,))
    conn.execute("INSERT INTO events VALUES ('client-7', 2, 'completed', 0.1, '{\"status\":200,\"duration_ms\":1}')")
    conn.execute("INSERT INTO requests (id, ts, status, completed) VALUES ('client-7', 5.0, 200, 1)")
    conn.close()

    with JournalReader(path) as reader:  # read-only, as it is: no client_id column yet
        row = reader.get_request("client-7")
        assert row is not None and row["client_id"] is None and row["status"] == 200
        assert [e.kind for _, e in reader.events("client-7")] == ["received", "completed"]
        assert reader.count("id:client") == 1

    writer = JournalWriter(path)  # a new gateway migrates it and writes minted ids beside
    await writer.start()
    await writer.append("msg_new", 1, Received(method="POST", path="/v1/messages", request_id="msg_new",
                                               client_request_id="client-7", ts=6.0))  # fmt: skip
    await writer.append("msg_new", 2, Completed(status=400, duration_ms=1.0))
    await writer.close()

    with JournalReader(path) as reader:
        old = reader.get_request("client-7")  # the old row: its id is the client's
        assert old is not None and old["id"] == "client-7" and old["client_id"] == "client-7"
        assert reader.get_request("msg_new") is not None
        assert {r["id"] for r in reader.list_requests(query="client_id:client-7")} == {"client-7", "msg_new"}
        events = reader.events("client-7")  # events stored under the id itself are found first
        assert [e.kind for _, e in events] == ["received", "completed"]
        received_event = events[0][1]
        assert isinstance(received_event, Received) and received_event.echoed_id == "client-7"


def test_a_version_three_journal_gets_its_search_columns_and_text_from_its_events(tmp_path: Path) -> None:
    import orjson

    path = tmp_path / "j.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, schema.MIGRATIONS[:3])
    body = {"model": "m", "metadata": {"user_id": "u-7"}, "messages": [{"role": "user", "content": "zebra crossing"}]}
    received = {
        "method": "POST",
        "path": "/v1/messages",
        "headers": {"x-claude-code-session-id": "s-1", "x-api-key": "[redacted sha256:0123456789ab]"},
        "body": orjson.dumps(body).decode(),
        "ts": 5.0,
    }
    conn.execute("INSERT INTO requests (id, ts, stream, completed) VALUES ('old', 5.0, 1, 1)")
    conn.executemany(
        "INSERT INTO events VALUES ('old', ?, ?, 0.0, ?)",
        [
            (1, "received", orjson.dumps(received).decode()),
            (2, "block", '{"event": {"type": "content_block_delta", "delta": {"text": "striped answer"}}}'),
            (3, "completed", '{"status": 200, "duration_ms": 1.0, "disconnected": true}'),
        ],
    )
    conn.close()
    schema.connect(path).close()
    with JournalReader(path) as reader:
        row = reader.get_request("old")
        assert row is not None
        assert (row["user_id"], row["session_id"], row["key_fp"], row["thread_key"]) == (
            "u-7",
            "s-1",
            "0123456789ab",
            "s:s-1",
        )
        assert row["hung_up"] is True and row["cut_mid_stream"] is True
        assert reader.count("zebra") == reader.count('"striped answer"') == reader.count("hung_up:yes") == 1
        assert reader.count("crossings") == 0


async def test_a_version_three_journal_reads_migrates_and_rebuilds_the_same_bytes(tmp_path: Path) -> None:
    """A file the v3 writer made (one JSON row per event, keyed by the text id): read as it is,
    then migrated to v4 (integer keys, packed runs) with every event, search and response intact."""
    from journal.events import Tokens
    from journal.writer import encode
    from smg.projection import reconstruct
    from tests.journal.test_writer import streaming_request

    path = tmp_path / "j.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.apply_pragmas(conn)
    schema.migrate(conn, schema.MIGRATIONS[:3])
    old_events = streaming_request()
    old_events[3:3] = [Tokens(ids=[7, 151644], prompt_tokens=12, completion_tokens=5, t=0.0201)]
    for rid in ("msg_old_a", "msg_old_b"):
        conn.executemany(  # as the v3 writer stored them
            "INSERT INTO events (request_id, seq, kind, t, data) VALUES (?, ?, ?, ?, ?)",
            [(rid, seq, e.kind, e.t, encode(e).decode()) for seq, e in enumerate(old_events, 1)],
        )
        conn.execute(
            "INSERT INTO requests (id, ts, model, status, completed, client_id) VALUES (?, 5.0, 'claude-x', 200, 1, ?)",
            (rid, f"client-{rid}"),
        )
    conn.close()

    def snapshot() -> tuple[object, ...]:
        with JournalReader(path) as reader:
            return (
                reader.raw_events("msg_old_a"),
                reader.raw_events("client-msg_old_b"),
                reconstruct(e for _, e in reader.events("msg_old_a")),
                reader.count('"ünïcödé"'),
                reader.count("id:client-msg_old_a"),
                [r["id"] for r in reader.list_requests()],
            )

    before = snapshot()  # read-only: the v3 file as it is
    assert before[3] == 2 and before[4] == 1

    writer = JournalWriter(path)  # a v4 gateway migrates it and writes packed rows beside
    await writer.start()
    new_events = streaming_request(ts=6.0)
    for seq, event in enumerate(new_events, 1):
        await writer.append("msg_new", seq, event)
    await writer.close()

    conn = sqlite3.connect(path)
    try:
        assert schema.schema_version(conn) == len(schema.MIGRATIONS)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        keys = dict(conn.execute("SELECT id, rk FROM requests"))
        assert sorted(keys.values()) == [1, 2, 3] and keys["msg_new"] == 3
        old_rows = conn.execute("SELECT count(*) FROM events WHERE rk IN (1, 2)").fetchone()[0]
        assert old_rows == 2 * len(old_events)  # v3 rows are kept one per event
        kinds = [k for (k,) in conn.execute("SELECT kind FROM events WHERE rk = 3 ORDER BY seq")]
        assert "run" in kinds and len(kinds) < len(new_events)
    finally:
        conn.close()

    after = snapshot()
    assert after[:3] == before[:3] and after[4] == before[4]
    assert after[3] == 3  # the new request's packed text is searched like the old rows
    assert after[5] == ["msg_new", *before[5]]
    with JournalReader(path) as reader:
        rebuilt_new = reconstruct(e for _, e in reader.events("msg_new"))
        assert [e.to_dict() for _, e in reader.events("msg_new")] == [e.to_dict() for e in new_events]
    assert rebuilt_new.body == reconstruct(new_events).body


def test_a_version_five_journal_keeps_its_rows_and_gets_partial_indexes(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.apply_pragmas(conn)
    schema.migrate(conn, schema.MIGRATIONS[:5])
    conn.executemany(
        "INSERT INTO requests (id, ts, session_id, duration_ms, completed) VALUES (?, ?, ?, ?, 1)",
        [("req_0", 100.0, "s-1", 10.0), ("req_1", 101.0, None, 2500.0), ("req_2", 102.0, "s-1", 40.0)],
    )
    conn.executemany("INSERT INTO events VALUES (?, 1, 'completed', 0.0, '{}')", [(1,), (2,), (3,)])
    assert {r[0] for r in conn.execute("SELECT name FROM sqlite_master")} >= {"requests_duration_ms"}
    conn.close()
    schema.connect(path).close()
    conn = sqlite3.connect(path)
    try:
        assert schema.schema_version(conn) == schema.SCHEMA_VERSION
        sql = {r[0]: r[1] for r in conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'index'")}
        assert "requests_duration_ms" not in sql and "requests_ttfe_ms" not in sql
        for name, columns in schema.PARTIAL_INDEXES.items():
            assert f"WHERE {columns.split(',')[0]} IS NOT NULL" in sql[name]
        for name, column in schema.BUCKETED_INDEXES.items():
            assert f"(rk >> 13, {column}) WHERE {column} IS NOT NULL" in sql[name]
        assert "requests_session_id_ts" not in sql and "requests_client_id" not in sql
        # Only the rows with a session are in its index, and the query reaches them through it.
        held = conn.execute(
            "SELECT count(*) FROM requests INDEXED BY requests_session_id_bucket WHERE session_id IS NOT NULL"
        )
        assert held.fetchone()[0] == 2
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    with JournalReader(path) as reader:
        assert reader.count() == 3
        assert [r["id"] for r in reader.list_requests(query="session:s-1")] == ["req_2", "req_0"]
        assert [r["id"] for r in reader.list_requests(query="dur:>1s")] == ["req_1"]
        where, params = reader.compile("session:s-1")
        plan = " ".join(
            str(r[3])
            for r in reader.connection.execute(f"EXPLAIN QUERY PLAN SELECT id FROM requests WHERE {where}", params)
        )
        assert "requests_session_id_bucket" in plan
