"""Smoke test for the journal bench (`tools/bench/journal.py --quick`): both measurements run and
report; counts and errors are checked, never timings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson

from tools.bench.journal import streamed_request
from tools.spawn import REPO_ROOT


def test_the_bench_request_is_a_realistic_stream() -> None:
    kinds = [e.kind for e in streamed_request()]
    assert kinds[:3] == ["received", "validated", "routed"] and kinds[-1] == "completed"
    assert len(kinds) == 42 and kinds.count("upstream") == 38  # the head and one chunk per SSE event


def test_journal_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "journal-bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.journal",
            "--quick",
            "--requests",
            "100",
            "--duration",
            "0.2",
            "--json",
            str(out),
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    result = orjson.loads(out.read_bytes())
    writer = result["summary"]["writer"]
    assert set(writer) == {"full", "redacted", "none"}
    assert all(w["events_per_s"] > 0 for w in writer.values())
    assert all(r["events"] == 100 * 42 for r in result["writer_runs"])
    runs = result["gateway_runs"]
    assert sorted((r["stream"], r["target"], r["concurrency"]) for r in runs) == [
        (False, "aiohttp+J", 64),
        (False, "aiohttp-J", 64),
        (True, "aiohttp+J", 64),
        (True, "aiohttp-J", 64),
    ]
    assert all(r["errors"] == 0 and r["ok"] > 0 for r in runs)
    for scenario in ("json c=64", "stream c=64"):
        assert result["summary"]["gateway"][scenario]["on_off"] is not None
    for text in (b"journal writer", b"events/s", b"on/off", b"stream c=64"):
        assert text in done.stdout
