"""`smg journal prune` on the fleet journal: whole day partitions dropped, the boundary day trimmed.

A journal of five days of synthetic traffic (`tools.build_journal`) is shipped to a real
PostgreSQL by the shipper; a copy of the file is pruned by the same age, and both must then
hold the same requests. By size, whole days go, oldest first, and never the newest.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from datetime import timedelta
from pathlib import Path

import psycopg
from typer.testing import CliRunner

from journal.pg import partitions, schema
from journal.pg.prune import used_bytes
from smg.cli.main import app
from tests.fleet.test_fleet_read import REPLICA, ship_all
from tools.build_journal import T0, Traffic, build

runner = CliRunner(env={"COLUMNS": "250"})
DAY = 86_400.0


def _journal(tmp_path: Path, url: str) -> tuple[Path, Path]:
    """The shipped file and an unshipped copy of it."""
    path = tmp_path / "j.db"
    asyncio.run(build(path, Traffic(requests=600, start=T0, span_s=5 * DAY)))
    copy = tmp_path / "copy.db"
    shutil.copy(path, copy)
    with psycopg.connect(url, autocommit=True) as conn:
        schema.migrate(conn)
    ship_all(path, url)
    return path, copy


def _ids(journal: str) -> list[str]:
    result = runner.invoke(app, ["journal", "ls", "-j", journal, "--json", "--limit", "10000", "--asc"])
    assert result.exit_code == 0, result.output
    return [row["id"] for row in json.loads(result.stdout)]


def _prune(journal: str, *args: str) -> dict[str, int]:
    result = runner.invoke(app, ["journal", "prune", "-j", journal, *args, "--json"])
    assert result.exit_code == 0, result.output
    out: dict[str, int] = json.loads(result.stdout)
    return out


def test_prune_by_age_drops_whole_days_and_trims_the_boundary_day(tmp_path: Path, pg_url: str) -> None:
    _, copy = _journal(tmp_path, pg_url)
    assert _ids(pg_url) == _ids(str(copy)) and len(_ids(pg_url)) == 600
    cutoff = T0 + 2.5 * DAY + 100  # between two requests (one every 720 s)
    with psycopg.connect(pg_url) as conn:
        before = partitions.days(conn)
    age = f"{time.time() - cutoff:.0f}s"
    fleet = _prune(pg_url, "--older-than", age)
    local = _prune(str(copy), "--older-than", age)
    assert fleet["requests_deleted"] == local["requests_deleted"] > 250
    assert fleet["events_deleted"] == local["events_deleted"]
    assert fleet["bytes_after"] < fleet["bytes_before"]
    assert _ids(pg_url) == _ids(str(copy))
    with psycopg.connect(pg_url) as conn:
        after = partitions.days(conn)
        boundary = partitions.day_of(cutoff)
        assert min(after) == boundary and set(after) == {d for d in before if d >= boundary}
        oldest = conn.execute("SELECT min(ts) FROM requests").fetchone()
        assert oldest is not None and oldest[0] >= cutoff - 1  # the boundary day kept only what is newer
    again = _prune(pg_url, "--older-than", age)
    assert again["requests_deleted"] == 0


def test_prune_by_size_drops_the_oldest_whole_days_never_the_newest(tmp_path: Path, pg_url: str) -> None:
    _journal(tmp_path, pg_url)
    with psycopg.connect(pg_url) as conn:
        days = sorted({d for d in partitions.days(conn) if d <= partitions.day_of(T0 + 5 * DAY)})
        size = used_bytes(conn)
        per_day = {
            day: conn.execute("SELECT count(*) FROM requests WHERE day = %s", (day,)).fetchone()[0]  # type: ignore[index]
            for day in days
        }
    result = _prune(pg_url, "--max-size", f"{size * 0.6:.0f}B", "--shrink")
    with psycopg.connect(pg_url) as conn:
        left = [d for d in partitions.days(conn) if d in per_day]
        assert used_bytes(conn) <= size * 0.6 or left == days[-1:]
    dropped = [d for d in days if d not in left]
    assert dropped and dropped == days[: len(dropped)]  # the oldest, whole
    assert result["requests_deleted"] == sum(per_day[d] for d in dropped)
    assert left[-1] == days[-1]
    remaining = _ids(pg_url)
    assert len(remaining) == 600 - result["requests_deleted"]
    # Nothing is pruned below the newest day, however small the limit.
    _prune(pg_url, "--max-size", "1B")
    with psycopg.connect(pg_url) as conn:
        newest = conn.execute("SELECT max(day) FROM requests").fetchone()
        assert newest is not None and newest[0] == days[-1]
        assert [d for d in partitions.days(conn) if d <= days[-1]] == [days[-1]]
    assert days[-1] - days[0] >= timedelta(days=4)


def test_the_fleet_journal_names_its_replica_after_a_prune(tmp_path: Path, pg_url: str) -> None:
    _journal(tmp_path, pg_url)
    _prune(pg_url, "--older-than", f"{time.time() - (T0 + 4 * DAY):.0f}s")
    rows = json.loads(runner.invoke(app, ["journal", "ls", "-j", pg_url, "--json"]).stdout)
    assert rows and {r["replica"] for r in rows} == {REPLICA}
