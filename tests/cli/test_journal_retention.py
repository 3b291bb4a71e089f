"""`smg launch --journal-retention/--journal-bodies` and `smg journal prune`."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from journal.events import Completed, Received
from journal.reader import JournalReader
from journal.writer import JournalWriter
from smg.cli.launch import build_config
from smg.cli.main import app

runner = CliRunner()
DAY = 86400.0


def config(**flags: Any) -> Any:
    """The checked settings of `smg launch --worker-urls http://127.0.0.1:1` and `flags` (by option name)."""
    return build_config({"worker_urls": ["http://127.0.0.1:1"], **flags})


def test_launch_journal_settings_reach_the_config() -> None:
    default = config()
    assert (default.journal_bodies, default.journal_retention) == ("full", None)
    chosen = config(journal_bodies="redacted", journal_retention="7d,2GB")
    assert chosen.journal_bodies == "redacted"
    assert chosen.journal_retention == (7 * DAY, 2_000_000_000)


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--journal-bodies", "some"], "--journal-bodies must be one of full, redacted, none"),
        (["--journal-retention", "forever"], "--journal-retention"),
        (["--journal-retention", "7d,8d"], "two ages"),
    ],
)
def test_launch_refuses_bad_journal_settings(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["launch", "--worker-urls", "http://127.0.0.1:1", *args])
    assert result.exit_code == 2
    assert needle in result.output


def write(path: Path, ages: list[float]) -> None:
    async def go() -> None:
        writer = JournalWriter(path)
        await writer.start()
        now = time.time()
        for i, age in enumerate(ages):
            await writer.append(f"req_{i}", 1, Received(method="POST", path="/v1/messages", ts=now - age))
            await writer.append(f"req_{i}", 2, Completed(status=200, duration_ms=1.0))
        await writer.close()

    asyncio.run(go())


def test_prune_by_age(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    write(path, [10 * DAY, 8 * DAY, 60.0])
    result = runner.invoke(app, ["journal", "prune", "--journal", str(path), "--older-than", "7d"])
    assert result.exit_code == 0, result.output
    assert "pruned 2 requests (4 events)" in result.output
    with JournalReader(path) as reader:
        assert [r["id"] for r in reader.list_requests()] == ["req_2"]


def test_prune_by_size_as_json(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    write(path, [float(1000 - i) for i in range(1000)])
    # 400 KB: about half of the file (the schema alone, with the rollups' triggers, is ~120 KB).
    result = runner.invoke(app, ["journal", "prune", "-j", str(path), "--max-size", "400KB", "--json"])
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert set(out) == {"requests_deleted", "events_deleted", "bytes_before", "bytes_after", "unshipped_kept"}
    assert 0 < out["requests_deleted"] < 1000 and out["bytes_after"] <= 400_000 < out["bytes_before"]


def test_prune_shrinks_the_file_only_when_asked(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    write(path, [float(1000 - i) for i in range(1000)])
    checkpointed = sqlite3.connect(path)
    checkpointed.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    checkpointed.close()
    full = os.path.getsize(path)
    result = runner.invoke(app, ["journal", "prune", "-j", str(path), "--max-size", "300KB"])
    assert result.exit_code == 0, result.output
    assert os.path.getsize(path) == full  # the freed pages stay, for the next writes
    result = runner.invoke(app, ["journal", "prune", "-j", str(path), "--max-size", "200KB", "--shrink"])
    assert result.exit_code == 0, result.output
    assert os.path.getsize(path) < full * 0.8


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        ([], 2, "--older-than AGE and/or --max-size SIZE"),
        (["--older-than", "soon"], 2, "is not an age"),
        (["--max-size", "big"], 2, "is not a size"),
    ],
)
def test_prune_refuses(tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    path = tmp_path / "j.db"
    write(path, [1.0])
    result = runner.invoke(app, ["journal", "prune", "--journal", str(path), *args])
    assert result.exit_code == code
    assert needle in result.output


def test_prune_without_a_journal(tmp_path: Path) -> None:
    result = runner.invoke(app, ["journal", "prune", "--journal", str(tmp_path / "none.db"), "--older-than", "1d"])
    assert result.exit_code == 1 and "no journal at" in result.output
    assert not (tmp_path / "none.db").exists()
