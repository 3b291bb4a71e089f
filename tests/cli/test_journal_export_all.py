"""`smg journal export QUERY` exports every request the query selects, a page at a time, unless
`--limit` says otherwise; then stderr says the limit cut it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from journal.events import Completed, Received
from journal.writer import JournalWriter
from tools.build_journal import T0, Traffic, build
from tools.spawn import REPO_ROOT

REQUESTS = 10_050  # past the 10,000 the export used to stop at, silently


@pytest.fixture(scope="module")
def big_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("export-all") / "journal.db"
    asyncio.run(build(path, Traffic(REQUESTS)))
    return path


def _export(journal: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "smg", "journal", "export", "--journal", str(journal), *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_query_exports_everything_it_selects(big_journal: Path) -> None:
    done = _export(big_journal, "", "--as", "otlp")
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == REQUESTS
    assert "limit" not in done.stderr


def test_a_limit_that_cuts_the_export_says_so(big_journal: Path) -> None:
    done = _export(big_journal, "model:*", "--as", "jsonl", "--limit", "3")
    assert done.returncode == 0, done.stderr
    ids = [json.loads(line)["request"]["id"] for line in done.stdout.splitlines()]
    assert len(ids) == 3 and ids == sorted(ids)  # oldest first: the builder's ids grow with time
    assert "stopped at --limit 3" in done.stderr
    har = _export(big_journal, "model:*", "--as", "har", "--limit", "2")
    assert har.returncode == 0 and len(json.loads(har.stdout)["log"]["entries"]) == 2
    exact = _export(big_journal, "", "--as", "otlp", "--limit", str(REQUESTS))
    assert len(exact.stdout.splitlines()) == REQUESTS and "stopped" not in exact.stderr


def test_rows_added_during_an_export_are_neither_skipped_nor_repeated(tmp_path: Path) -> None:
    journal = tmp_path / "growing.db"
    asyncio.run(build(journal, Traffic(1_600)))  # four pages of 500
    export = subprocess.Popen(
        [sys.executable, "-m", "smg", "journal", "export", "", "--as", "jsonl", "--journal", str(journal)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert export.stdout is not None
        # Into the second page: the export then waits on the pipe, a few dozen lines ahead.
        ids = [json.loads(export.stdout.readline())["request"]["id"] for _ in range(600)]
        # A gateway adds requests meanwhile, older by their arrival time than all exported so far.
        asyncio.run(_add_requests(journal, [f"late-{i}" for i in range(100)], ts=T0 - 3600))
        ids += [json.loads(line)["request"]["id"] for line in export.stdout]
        assert export.wait(timeout=300) == 0
    finally:
        if export.poll() is None:
            export.kill()
            export.wait()
    # Before, pages by OFFSET in time order shifted by the new rows: 100 repeated, the new ones missed.
    assert len(ids) == len(set(ids)) == 1_700
    assert ids[-100:] == [f"late-{i}" for i in range(100)]  # recorded last: exported last


async def _add_requests(journal: Path, request_ids: list[str], ts: float) -> None:
    writer = JournalWriter(journal)
    await writer.start()
    try:
        for request_id in request_ids:
            await writer.append(request_id, 1, Received(method="POST", path="/v1/messages", ts=ts))
            await writer.append(request_id, 2, Completed(status=200, duration_ms=1.0))
        await writer.flush()
    finally:
        await writer.close()
