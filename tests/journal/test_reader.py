"""JournalReader: lookups, ordering, and reading next to a live writer."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import orjson
import pytest

from journal.events import Completed, Received, Tokens, Validated
from journal.query import QueryError
from journal.reader import (
    AmbiguousRequestId,
    JournalError,
    JournalNotFound,
    JournalReader,
)
from journal.writer import JournalWriter


@pytest.fixture
async def sample_journal(tmp_path: Path) -> Path:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    for i, request_id in enumerate(["req_aaa111", "req_aaa222", "req_bbb333", "req_b"]):
        await writer.append(request_id, 0, Received(method="POST", path="/v1/messages", ts=100.0 + i))
        await writer.append(request_id, 1, Completed(status=200, duration_ms=1.0, t=0.001))
    await writer.close()
    return path


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(JournalNotFound) as info:
        JournalReader(tmp_path / "nope.db")
    assert isinstance(info.value, FileNotFoundError)
    assert not (tmp_path / "nope.db").exists()  # read-only: nothing created


def test_not_a_journal(tmp_path: Path) -> None:
    fresh = tmp_path / "fresh.db"
    fresh.write_bytes(b"")  # what a writer creates a moment before it migrates
    with pytest.raises(JournalNotFound, match="not initialised"):
        JournalReader(fresh)
    other = tmp_path / "other.db"
    conn = sqlite3.connect(other)
    conn.execute("CREATE TABLE something_else (x)")
    conn.close()
    with pytest.raises(JournalError, match="not an smg journal"):
        JournalReader(other)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(JournalError):
        JournalReader(garbage)


def test_prefix_lookup(sample_journal: Path) -> None:
    with JournalReader(sample_journal) as reader:
        assert reader.get_request("req_aaa1") is not None
        assert reader.get_request("req_aaa1")["id"] == "req_aaa111"  # type: ignore[index]
        assert reader.get_request("req_bbb")["id"] == "req_bbb333"  # type: ignore[index]
        # An exact id wins even when it is also a prefix of another id.
        assert reader.get_request("req_b")["id"] == "req_b"  # type: ignore[index]
        assert reader.get_request("req_zzz") is None
        assert reader.get_request("") is None
        with pytest.raises(AmbiguousRequestId) as info:
            reader.get_request("req_aaa")
        assert info.value.matches == ["req_aaa111", "req_aaa222"]


def test_list_and_count(sample_journal: Path) -> None:
    with JournalReader(sample_journal) as reader:
        assert reader.count() == 4
        ids = [r["id"] for r in reader.list_requests()]
        assert ids == ["req_b", "req_bbb333", "req_aaa222", "req_aaa111"]
        oldest = reader.list_requests(limit=2, offset=1, descending=False)
        assert [r["id"] for r in oldest] == ["req_aaa222", "req_bbb333"]
        assert reader.list_requests(limit=2, offset=1, newest_first=False) == oldest  # the older spelling
        assert reader.list_requests()[0]["completed"] is True


async def test_list_filters_orders_and_counts(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    for i, (model, status, duration) in enumerate([("m-a", 200, 30.0), ("m-b", 500, 10.0), ("m-a", 404, 20.0)]):
        request_id = f"req_{i}"
        await writer.append(request_id, 0, Received(method="POST", path="/v1/messages", ts=100.0 + i))
        await writer.append(request_id, 1, Validated(model=model, t=0.001))
        await writer.append(request_id, 2, Completed(status=status, duration_ms=duration, t=0.002))
    await writer.close()
    with JournalReader(path) as reader:
        assert [r["id"] for r in reader.list_requests(query="model:m-a")] == ["req_2", "req_0"]
        assert reader.count("model:m-a") == 2 and reader.count("status:>=400") == 2 and reader.count() == 3
        by_duration = reader.list_requests(order="duration_ms", descending=False)
        assert [r["id"] for r in by_duration] == ["req_1", "req_2", "req_0"]
        assert [r["id"] for r in reader.list_requests(since_ts=101.0, descending=False)] == ["req_1", "req_2"]
        assert [r["id"] for r in reader.list_requests(query="model:m-a", since_ts=101.0)] == ["req_2"]
        with pytest.raises(ValueError, match="cannot order by"):
            reader.list_requests(order="ts; DROP TABLE requests")
        with pytest.raises(QueryError):
            reader.count("status:")


def test_unknown_kinds_are_skipped_but_kept_raw(sample_journal: Path) -> None:
    conn = sqlite3.connect(sample_journal)
    conn.execute(
        "INSERT INTO events VALUES ((SELECT rk FROM requests WHERE id = 'req_b'), 2, 'from_the_future', 0.5, ?)",
        (orjson.dumps({"x": 1}).decode(),),
    )
    conn.commit()
    conn.close()
    with JournalReader(sample_journal) as reader:
        assert [seq for seq, _ in reader.events("req_b")] == [0, 1]
        assert reader.raw_events("req_b")[-1] == (2, "from_the_future", 0.5, {"x": 1})


def test_reader_cannot_write(sample_journal: Path) -> None:
    with JournalReader(sample_journal) as reader:
        with pytest.raises(sqlite3.OperationalError):
            reader._conn.execute("DELETE FROM events")


async def test_reading_next_to_a_live_writer(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    writer = JournalWriter(path)
    await writer.start()
    await writer.append("req_1", 0, Received(method="POST", path="/v1/messages", ts=1.0))
    await writer.flush()
    reader = JournalReader(path)
    try:
        assert len(reader.events("req_1")) == 1
        for seq in range(1, 100):
            await writer.append("req_1", seq, Tokens(ids=[seq]))
        await writer.flush()
        assert len(reader.events("req_1")) == 100  # the reader never blocked the writer
    finally:
        reader.close()
        await writer.close()
