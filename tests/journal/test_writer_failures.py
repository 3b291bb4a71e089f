"""The writer when the file fails: a full disk, a lock held by another process, events that
cannot be encoded. Serving must not wait, what is lost is bounded and counted, and the
failure is visible (`problem`, `stats`, one log line per incident)."""

from __future__ import annotations

import logging
import sqlite3
from pathlib import Path

import pytest

from journal.events import Completed, Received, Tokens
from journal.reader import JournalReader
from journal.recovery import RegistrationError
from journal.writer import JournalWriter
from tests.journal.test_writer import db_count, wait_until


async def _fill_disk(writer: JournalWriter, pages: int) -> None:
    # What a full disk looks like to SQLite: SQLITE_FULL on the next page it needs.
    assert writer._conn is not None
    await writer._in_thread(writer._conn.execute, f"PRAGMA max_page_count={pages}")


def _page_count(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("PRAGMA page_count").fetchone()[0])
    finally:
        conn.close()


async def test_a_full_disk_is_one_incident_and_serving_never_waits(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, queue_size=200, max_held=400, retry_interval_s=0.05)
    await writer.start()
    await writer.append("before", 1, Received(method="POST", path="/v1/messages"))
    await writer.flush()
    await _fill_disk(writer, _page_count(path))
    caplog.set_level(logging.WARNING, logger="journal.writer")
    big = "x" * 20_000
    appended = 0
    for i in range(2_000):  # ten times what the queue holds: append must never block
        await writer.append(f"r{i}", 1, Received(method="POST", path="/v1/messages", body=big))
        appended += 1
    await wait_until(lambda: writer.problem is not None)
    assert "full" in (writer.problem or "")
    stats = writer.stats
    assert stats["failing"] == 1 and stats["incidents"] == 1 and stats["events_dropped"] > 0
    held = stats["pending_events"] + stats["queue_depth"]
    assert held <= 400  # bounded: the queue plus the pending batches, max_held in all
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert sum("cannot commit" in e for e in errors) == 1  # not one per batch
    assert sum("since the last line" in e for e in errors) == 1  # the first drop; then rate-limited

    await _fill_disk(writer, 1_000_000)  # space again
    await wait_until(lambda: writer.problem is None)
    await writer.append("after", 1, Completed(status=200, duration_ms=1.0))
    await writer.close()
    stats = writer.stats
    assert stats["incidents"] == 1 and stats["failing"] == 0
    assert stats["events_written"] + stats["events_dropped"] == appended + 2
    assert db_count(path) == stats["events_written"]
    assert any("resumed" in r.getMessage() for r in caplog.records)
    with JournalReader(path) as reader:
        assert reader.get_request("after") is not None and reader.get_request("before") is not None


async def test_an_event_that_cannot_be_encoded_costs_only_itself(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    bad_id = "abc\udcff"  # a non-UTF-8 header byte, as Sanic decodes it
    await writer.append("ok-1", 1, Received(method="POST", path="/v1/messages"))
    await writer.append("bad", 1, Received(method="POST", path="/v1/messages\udcfe", headers={"x-request-id": bad_id}))
    await writer.append("bad", 2, Completed(status=401, duration_ms=1.0, usage={"output_tokens": 1 << 70}))
    await writer.append("ok-2", 1, Tokens(ids=[1, 2]))
    await writer.close()
    assert writer.stats["events_dropped"] == 0
    with JournalReader(path) as reader:
        assert {r["id"] for r in reader.list_requests()} == {"ok-1", "bad", "ok-2"}
        received = reader.events("bad")[0][1]
        assert isinstance(received, Received)
        assert received.headers["x-request-id"] == "abc\\udcff" and received.path == "/v1/messages\\udcfe"
        row = reader.get_request("bad")
        assert row is not None and row["path"] == "/v1/messages\\udcfe" and row["output_tokens"] is None


async def test_a_commit_waiting_on_a_lock_fills_the_held_buffer_and_logs_what_the_metric_counts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, queue_size=50, max_held=200, busy_timeout_ms=3000, retry_interval_s=0.05)
    await writer.start()
    await writer.append("before", 1, Received(method="POST", path="/v1/messages"))
    await writer.flush()
    caplog.set_level(logging.WARNING, logger="journal.writer")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        await writer.append("first", 1, Tokens(ids=[1]))
        await wait_until(writer._stalled)  # the commit has waited on the lock for over a second
        for i in range(150):  # three times the queue, less than the held buffer: none dropped
            await writer.append(f"r{i}", 1, Tokens(ids=[i]))
        assert writer.stats["events_dropped"] == 0 and writer.stats["queue_depth"] == 150
        for i in range(100):  # past max_held while the first commit still waits: dropped
            await writer.append(f"late{i}", 1, Tokens(ids=[i]))
        assert writer.stats["events_dropped"] > 0
        await wait_until(lambda: writer.stats["failing"] == 1)  # then that commit fails
        for i in range(100):
            await writer.append(f"later{i}", 1, Tokens(ids=[i]))
    finally:
        other.execute("ROLLBACK")
        other.close()
    await wait_until(lambda: writer.problem is None)
    await writer.close()
    stats = writer.stats
    assert stats["events_written"] + stats["events_dropped"] == 1 + 1 + 150 + 100 + 100
    assert db_count(path) == stats["events_written"]
    with JournalReader(path) as reader:
        assert all(reader.get_request(f"r{i}") is not None for i in range(150))
    logged = [r.getMessage() for r in caplog.records if "dropped during the incident" in r.getMessage()]
    assert len(logged) == 1 and f" {stats['events_dropped']} events were dropped" in logged[0], logged
    assert sum("cannot commit" in r.getMessage() for r in caplog.records) == 1


async def test_every_drop_is_logged_and_counted_and_a_request_whose_completion_was_dropped_is_closed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path, queue_size=50, max_held=200, drop_log_interval_s=3600)
    await writer.start()
    await writer.append("victim", 1, Received(method="POST", path="/v1/messages"))
    await writer.flush()
    assert writer.problem is None
    caplog.set_level(logging.WARNING, logger="journal.writer")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    try:
        await writer.append("first", 1, Tokens(ids=[1]))
        await wait_until(writer._stalled)
        assert "has waited" in (writer.problem or "")  # stalled: not ready before anything is lost
        for i in range(200):  # fills the held buffer
            await writer.append(f"r{i}", 1, Tokens(ids=[i]))
        await writer.append("victim", 2, Completed(status=200, duration_ms=1.0))  # dropped
        await writer.append("ghost", 1, Received(method="POST", path="/v1/messages"))  # dropped too
        await writer.append("ghost", 2, Completed(status=200, duration_ms=1.0))
        dropped = writer.stats["events_dropped"]
        assert dropped >= 3
        lines = [r.getMessage() for r in caplog.records if "since the last line" in r.getMessage()]
        assert len(lines) == 1 and lines[0].startswith("journal: dropped 1 events since the last line (1 in")
        assert writer.stats["failing"] == 0  # no commit has failed: the stall alone makes it failing
    finally:
        other.execute("ROLLBACK")
        other.close()
    await wait_until(lambda: writer.problem is None)
    await wait_until(lambda: db_count(path) == writer.stats["events_written"] and not writer._unclosed)
    await writer.flush()
    await writer.close()
    lines = [r.getMessage() for r in caplog.records if "since the last line" in r.getMessage()]
    assert len(lines) == 2 and lines[1].startswith(f"journal: dropped {dropped - 1} events since the last line")
    assert any(f" {dropped} events were dropped during the incident" in r.getMessage() for r in caplog.records)
    with JournalReader(path) as reader:
        row = reader.get_request("victim")
        assert row is not None and row["completed"] == 1 and row["error_code"] == "journal_events_dropped"
        assert reader.get_request("ghost") is None  # nothing of it was stored: nothing to close


async def test_a_writer_that_cannot_register_as_live_does_not_start(tmp_path: Path) -> None:
    # Unregistered, its requests in flight would be closed as interrupted by another process's
    # recovery while it serves them.
    path = tmp_path / "j.db"
    (tmp_path / ".j.db.writers").write_text("")  # where the writers' lock files go: not a directory
    writer = JournalWriter(path)
    with pytest.raises(RegistrationError, match="live writer"):
        await writer.start()
    await writer.close()
