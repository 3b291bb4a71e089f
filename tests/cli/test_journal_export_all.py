"""`smg journal export QUERY` exports every request the query selects, a page at a time, unless
`--limit` says otherwise; then stderr says the limit cut it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tools.build_journal import Traffic, build
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
