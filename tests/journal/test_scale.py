"""The journal at scale: 10k and 100k requests written through the real writer.

No timing is asserted. What is: every operator query selects exactly what the generated
traffic says it should, its plan reads an index (never a scan of `requests` or `events`), and
the work SQLite does for a page of results (counted in virtual-machine steps, which are
deterministic) does not grow with the journal: a page at 100k costs about what it costs at 10k.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from journal import groups
from journal.events import Completed, Received
from journal.reader import JournalReader
from journal.retention import prune
from tools.build_journal import Traffic, build, requests

pytestmark = pytest.mark.slow
SIZES = (10_000, 100_000)


def _expected(traffic: Traffic) -> dict[str, Counter[str]]:
    """What the generated traffic holds, counted in Python."""
    out: dict[str, Counter[str]] = {"session": Counter(), "user": Counter(), "hung_up": Counter(), "model": Counter()}
    for _, events in requests(traffic):
        received, completed = events[0], events[-1]
        assert isinstance(received, Received) and isinstance(completed, Completed)
        session = received.headers.get("x-claude-code-session-id")
        if session:
            out["session"][session] += 1
        out["user"][orjson.loads(received.body or "{}")["metadata"]["user_id"]] += 1
        out["hung_up"][str(completed.disconnected)] += 1
        out["model"][getattr(events[1], "model", "")] += 1
    return out


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[int, Path]]:
    root = tmp_path_factory.mktemp("scale")
    paths = {}
    for size in SIZES:
        path = root / f"j{size}.db"
        asyncio.run(build(path, Traffic(size)))
        paths[size] = path
    yield paths


def _steps(reader: JournalReader, query: str) -> tuple[int, list[dict[str, Any]]]:
    """The VM steps (in hundreds) a first page of `query` takes, and the page."""
    count = 0

    def tick() -> int:
        nonlocal count
        count += 1
        return 0

    reader.connection.set_progress_handler(tick, 100)
    try:
        rows = reader.list_requests(50, query=query)
    finally:
        reader.connection.set_progress_handler(None, 0)
    return count, rows


def test_field_queries_select_what_the_traffic_holds(journals: dict[int, Path]) -> None:
    expected = _expected(Traffic(SIZES[-1]))
    with JournalReader(journals[SIZES[-1]]) as reader:
        assert reader.indexed
        assert reader.count() == SIZES[-1]
        for session in ("session-0", "session-17", "session-3000"):
            assert reader.count(f"session:{session}") == expected["session"][session]
        for user in ("user-0", "user-499"):
            assert reader.count(f"user:{user}") == expected["user"][user]
        assert reader.count("hung_up:yes") == expected["hung_up"]["True"] > 0
        assert reader.count("model:qwen3-8b") == expected["model"]["qwen3-8b"]
        assert reader.count("cut:yes") == reader.count("hung_up:yes")  # the generator's cut streams hang up
        assert reader.count('"capacity exhausted"') == reader.count("status:529") > 0
        by_model = groups.compute(reader.connection, *reader.compile(""), by="model")
        assert {r["group"]: r["requests"] for r in by_model} == dict(expected["model"])


QUERIES = (
    "overloaded",
    '"worker overloaded"',
    "session:session-17",
    "user:user-7",
    "hung_up:yes",
    "cut:yes",
    "trace:{trace}",
    "model:qwen3-8b",
    "key:*",
)
CONSTANT = ("session:session-17", "user:user-7", "hung_up:yes", "cut:yes", "model:qwen3-8b", "key:*")


def test_queries_read_indexes_and_a_page_costs_the_same_at_10x(journals: dict[int, Path]) -> None:
    small, large = (JournalReader(journals[size]) for size in SIZES)
    try:
        first = small.get_request("req_00000005")
        assert first is not None and first["trace_id"]  # the same seed: the same first requests in both
        for query in (q.format(trace=first["trace_id"]) for q in QUERIES):
            where, params = large.compile(query)
            plan = [
                str(r[3])
                for r in large.connection.execute(
                    f"EXPLAIN QUERY PLAN SELECT id FROM requests WHERE {where} ORDER BY ts DESC LIMIT 50", params
                )
            ]
            for line in plan:  # a scan is only ever along an index, the text index's own, or the buckets' list
                scans_a_table = line.startswith("SCAN") and "INDEX" not in line
                assert not scans_a_table or line in ("SCAN CONSTANT ROW", "SCAN bucket"), (query, plan)
            steps_small, rows_small = _steps(small, query)
            steps_large, rows_large = _steps(large, query)
            assert rows_small and rows_large, query
            if query in CONSTANT:
                # An index read in time order stops after the page: no growth with the journal.
                assert steps_large <= 3 * steps_small + 10, (query, steps_small, steps_large)
    finally:
        small.close()
        large.close()


def test_ls_counts_without_a_second_query_on_a_short_page(journals: dict[int, Path]) -> None:
    with JournalReader(journals[SIZES[0]]) as reader:
        rows, total = reader.page(50, query="session:session-17")
        assert total == len(rows) == reader.count("session:session-17")
        rows, total = reader.page(50, query="model:qwen3-8b")
        assert len(rows) == 50 and total == reader.count("model:qwen3-8b")


def test_prune_by_size_keeps_the_text_index_in_step(journals: dict[int, Path]) -> None:
    path = journals[SIZES[0]]
    with JournalReader(path) as reader:
        before = reader.count()
        text_rows = reader.connection.execute("SELECT count(*) FROM request_text").fetchone()[0]
        size = reader.connection.execute("PRAGMA page_count").fetchone()[0] * 4096
    result = prune(path, max_bytes=size // 2, now=2_000_000_000.0)
    assert 0 < result.requests_deleted < before
    with JournalReader(path) as reader:
        left = reader.count()
        assert left == before - result.requests_deleted
        assert reader.connection.execute("SELECT count(*) FROM request_text").fetchone()[0] == text_rows - (
            before - left
        )
        orphans = reader.connection.execute(
            "SELECT count(*) FROM request_text WHERE rowid NOT IN (SELECT rowid FROM requests)"
        ).fetchone()[0]
        assert orphans == 0
