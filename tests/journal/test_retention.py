"""Retention: `parse_retention`, `prune` by age and size (whole requests only), and the writer's
periodic pruning."""

from __future__ import annotations

import asyncio
import os
import sqlite3
from pathlib import Path

import pytest

from journal.events import Completed, Received, Tokens, Upstream
from journal.reader import JournalReader
from journal.retention import INFLIGHT_GRACE_S, PruneResult, parse_retention, prune
from journal.writer import JournalWriter

NOW = 1_750_000_000.0
DAY = 86400.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", (7 * DAY, None)),
        ("12h", (12 * 3600.0, None)),
        ("90m", (5400.0, None)),
        ("2w", (14 * DAY, None)),
        ("500MB", (None, 500_000_000)),
        ("1.5GB", (None, 1_500_000_000)),
        ("2GiB", (None, 2 * 1024**3)),
        ("10kb", (None, 10_000)),
        ("7d,2GB", (7 * DAY, 2_000_000_000)),
        (" 2GB , 7d ", (7 * DAY, 2_000_000_000)),
    ],
)
def test_parse_retention(text: str, expected: tuple[float | None, int | None]) -> None:
    assert parse_retention(text) == expected


@pytest.mark.parametrize("text", ["", "7", "7 days", "7d,8d", "1GB,2GB", "0d", "-1d", "7d,", "fast"])
def test_parse_retention_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        parse_retention(text)


async def write_requests(
    path: Path, ages: list[float], *, events: int = 3, size: int = 100, completed: bool = True
) -> None:
    writer = JournalWriter(path)
    await writer.start()
    for i, age in enumerate(ages):
        request_id = f"req_{i:05d}_{int(age)}"
        await writer.append(request_id, 1, Received(method="POST", path="/v1/messages", body="x" * size, ts=NOW - age))
        for seq in range(2, events):
            await writer.append(request_id, seq, Upstream(part="chunk", data="y" * size))
        if completed:
            await writer.append(request_id, events, Completed(status=200, duration_ms=1.0))
    await writer.close()


def ids(path: Path) -> list[str]:
    with JournalReader(path) as reader:
        return [r["id"] for r in reader.list_requests(limit=100_000, descending=False)]


def orphan_events(path: Path) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT count(*) FROM events WHERE rk NOT IN (SELECT rk FROM requests)").fetchone()[0])
    finally:
        conn.close()


async def test_prune_by_age_deletes_whole_old_requests(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await write_requests(path, [10 * DAY, 8 * DAY, 6 * DAY, 1.0])
    result = prune(path, max_age_s=7 * DAY, now=NOW)
    assert isinstance(result, PruneResult)
    assert (result.requests_deleted, result.events_deleted) == (2, 6)
    assert ids(path) == ["req_00002_518400", "req_00003_1"]
    assert orphan_events(path) == 0
    assert prune(path, max_age_s=7 * DAY, now=NOW).requests_deleted == 0  # idempotent


async def test_prune_by_size_deletes_oldest_first_until_it_fits(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await write_requests(path, [float(2000 - i) for i in range(2000)], events=5, size=400)
    full = prune(path, now=NOW)  # no limits: nothing to do, but it measures
    assert full.requests_deleted == 0 and full.bytes_before == full.bytes_after > 3_000_000
    size_before = os.path.getsize(path)

    result = prune(path, max_bytes=full.bytes_before // 2, now=NOW, shrink=True)
    assert result.bytes_after <= full.bytes_before // 2 < result.bytes_before
    assert 800 <= result.requests_deleted <= 1300
    assert result.events_deleted == 5 * result.requests_deleted
    left = ids(path)
    assert len(left) == 2000 - result.requests_deleted
    assert left == [f"req_{i:05d}_{2000 - i}" for i in range(result.requests_deleted, 2000)]  # the newest stay
    assert orphan_events(path) == 0
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    finally:
        conn.close()
    assert os.path.getsize(path) < size_before * 0.7  # freed pages went back to the OS


async def test_requests_in_flight_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await write_requests(path, [10 * DAY, 60.0], completed=False)
    result = prune(path, max_age_s=1.0, max_bytes=1, now=NOW)
    assert result.requests_deleted == 1  # the old one, although it never completed
    assert ids(path) == ["req_00001_60"]
    assert INFLIGHT_GRACE_S >= 3600


def test_prune_never_creates_a_journal(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        prune(tmp_path / "missing.db", max_age_s=1.0)
    assert not (tmp_path / "missing.db").exists()


async def test_the_writer_prunes_periodically_off_the_hot_path(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await write_requests(path, [10 * DAY, 9 * DAY])  # old requests from an earlier run
    writer = JournalWriter(path, retention=(7 * DAY, None), retention_interval_s=0.05)
    await writer.start()
    await writer.append("new", 1, Received(method="POST", path="/v1/messages", ts=NOW + 1e9))
    for seq in range(2, 200):
        await writer.append("new", seq, Tokens(ids=[seq]))
        await asyncio.sleep(0)
    await writer.flush()
    for _ in range(100):
        if writer.stats["requests_pruned"] >= 2:
            break
        await asyncio.sleep(0.02)
    await writer.close()
    assert writer.stats["requests_pruned"] == 2
    assert ids(path) == ["new"]
    with JournalReader(path) as reader:
        assert len(reader.events("new")) == 199


async def test_no_retention_means_no_pruning(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    await write_requests(path, [100 * DAY])
    writer = JournalWriter(path, retention=(None, None))
    await writer.start()
    await writer.close()
    assert len(ids(path)) == 1 and writer.stats["requests_pruned"] == 0
