"""Rollups (`journal.rollups`) against a scan of the same journal.

The journals are written by the real writer (`tools.build_journal`: several models, workers,
keys, errors, cut streams, arrivals spread over hours), priced by a real price table. Every
count and sum read from the rollups equals the scan's; every percentile is within the sketch's
stated error of the scan's nearest-rank value.
"""

from __future__ import annotations

import asyncio
import gzip
import math
import random
import shutil
import sqlite3
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from journal import groups, rollups, schema, sketch, stats
from journal.events import Completed, Received
from journal.prices import parse
from journal.reader import JournalReader
from journal.retention import prune
from journal.writer import JournalWriter
from tools.build_journal import T0, Traffic, build

PRICES = parse(
    {
        "models": {
            "claude-sonnet-4": {"input": 3.0, "output": 15.0},
            "claude-*": {"input": 0.8, "output": 4.0, "cache_read": 0.08},
        }
    }
)
TRAFFIC = Traffic(requests=4000, span_s=4 * 3600.0, keys=5)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    path = tmp_path_factory.mktemp("rollups") / "j.db"
    asyncio.run(build(path, TRAFFIC, prices=PRICES))
    yield path


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts).isoformat()


QUERIES = [
    "",
    "model:claude-sonnet-4",
    "model:claude-* !status:200",
    "has:error | cut:yes",
    "key:* worker:http://10.0.0.2:8000",
    "tenant:nobody",
    # whole minutes and partial ones at both ends
    f"since:{_iso(T0 + 1800.5)} until:{_iso(T0 + 7200.25)}",
    f"since:{_iso(T0 + 3600)} model:qwen3-8b",
    f"until:{_iso(T0 + 30)}",  # inside one minute: no rollup row at all
    # a caller's key itself, matched by its fingerprints
    "!key:sk-ant-key-1",
    "key:sk-ant-key-1 | model:qwen3-8b",
]


def _close(estimate: float | None, exact: float | None) -> bool:
    if estimate is None or exact is None:
        return estimate is exact
    return abs(estimate - exact) <= sketch.RELATIVE_ERROR * abs(exact) + 1e-9


def _scan(reader: JournalReader, query: str) -> dict[str, Any]:
    where, params = reader.compile(query)
    return stats.compute(reader.connection, where, params)


@pytest.mark.parametrize("query", QUERIES)
def test_stats_from_rollups_agree_with_a_scan(journal: Path, query: str) -> None:
    with JournalReader(journal) as reader:
        reader.exact_up_to = 0
        ours = reader.stats(query)
        scan = _scan(reader, query)
    assert ours["source"] == ("rollups" if scan["requests"] else "scan")
    if ours["source"] == "rollups":
        assert ours["scanned"] < scan["requests"] or scan["requests"] < 200
    for key in ("requests", "completed", "in_flight", "errors", "first_ts", "last_ts", "by_status_class"):
        assert ours[key] == scan[key], key
    for key in ("by_status", "by_model", "by_backend", "error_codes", "stop_reasons"):
        assert ours[key] == scan[key], key
    for name in ("duration", "ttfe"):
        got, exact = ours["latency_ms"][name], scan["latency_ms"][name]
        assert got["count"] == exact["count"]
        assert got["max"] == exact["max"]
        assert got["mean"] == pytest.approx(exact["mean"]) if exact["mean"] is not None else got["mean"] is None
        for p in ("p50", "p90", "p99"):
            assert _close(got[p], exact[p]), (name, p, got[p], exact[p])
    tokens, exact_tokens = ours["tokens"], scan["tokens"]
    for key in ("input", "output", "rated_requests"):
        assert tokens[key] == exact_tokens[key]
    if exact_tokens["output_per_s"] is not None:
        assert tokens["output_per_s"] == pytest.approx(exact_tokens["output_per_s"])
        assert _close(tokens["output_per_s_median"], exact_tokens["output_per_s_median"])
    assert ours["cost_usd"]["priced_requests"] == scan["cost_usd"]["priced_requests"]
    if scan["cost_usd"]["total"] is not None:
        assert ours["cost_usd"]["total"] == pytest.approx(scan["cost_usd"]["total"])


@pytest.mark.parametrize(
    ("by", "every"), [(None, 300), ("model", None), ("key", 3600), ("worker", 60), ("status", None)]
)
def test_groups_from_rollups_agree_with_a_scan(journal: Path, by: str | None, every: int | None) -> None:
    query = f"since:{_iso(T0 + 600.5)} !code:overloaded_error"
    with JournalReader(journal) as reader:
        reader.exact_up_to = 0
        ours = reader.group_stats(query, by=by, every=every)
        assert reader.stats_source.startswith("from rollups")
        where, params = reader.compile(query)
        scan = groups.compute(reader.connection, where, params, by=by, every=every)
    assert [(r["group"], r["bucket"]) for r in ours] == [(r["group"], r["bucket"]) for r in scan]
    for got, exact in zip(ours, scan, strict=True):
        for key in ("requests", "errors", "hung_up", "tokens_in", "tokens_out"):
            assert got[key] == exact[key], key
        assert got["cost_usd"] == pytest.approx(exact["cost_usd"])
        for name in ("latency_ms", "ttft_ms"):
            assert got[name]["count"] == exact[name]["count"]
            for p in ("p50", "p90", "p99"):
                assert _close(got[name][p], exact[name][p])


def test_what_the_rollups_cannot_answer_is_scanned_and_said(journal: Path) -> None:
    with JournalReader(journal) as reader:
        reader.exact_up_to = 0
        for query in ("dur:>1s", "alpha", "user:user-1", f"model:qwen3-8b | since:{_iso(T0 + 60)}"):
            numbers = reader.stats(query)
            assert numbers["source"] == "scan" and numbers["scanned"] == numbers["requests"], query
        reader.group_stats("", by="session")
        assert reader.stats_source.startswith("scanned ")
        reader.group_stats("", every=90)  # not whole minutes
        assert reader.stats_source == f"scanned {TRAFFIC.requests} requests"
    # A small selection is scanned by default: exact, and as fast.
    with JournalReader(journal) as reader:
        assert reader.stats("")["source"] == "scan"


def test_the_writers_batch_folds_give_what_one_regrouping_gives(journal: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(journal, copy)
    conn = schema.connect(copy)
    try:
        dims = f"grain, ts, {', '.join(rollups.DIMENSIONS)}"
        query = f"SELECT {dims}, requests, input_tokens, output_tokens, round(cost_usd, 9), duration_n,"
        query += f" round(duration_sum, 6), {', '.join(rollups.SKETCHES)} FROM {rollups.TABLE}"
        query += f" JOIN {rollups.SKETCHES_TABLE} USING (rid) WHERE requests != 0"
        written = conn.execute(query).fetchall()
        # Each request once per grain (a minute, an hour and a day row).
        assert sum(row[len(rollups.DIMENSIONS) + 2] for row in written) == TRAFFIC.requests * len(rollups.GRAINS)
        # Every row's sketches hold its requests' durations; nothing is left to fold.
        durations: dict[int, int] = {}
        for row in written:
            if row[0] == 60:
                sketch.merge(durations, row[-3])
        assert sum(durations.values()) == TRAFFIC.requests
        assert conn.execute(f"SELECT count(*) FROM {rollups.PENDING_TABLE}").fetchone()[0] == 0
        conn.execute(f"DELETE FROM {rollups.TABLE}")
        conn.execute(f"DELETE FROM {rollups.SKETCHES_TABLE}")
        rollups.backfill(conn)
        assert sorted(map(repr, conn.execute(query).fetchall())) == sorted(map(repr, written))
    finally:
        conn.close()


def test_pruning_takes_its_requests_out_of_the_rollups(journal: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(journal, copy)
    prune(copy, max_age_s=1.0, now=T0 + 5401)
    with JournalReader(copy) as reader:
        reader.exact_up_to = 0
        ours, scan = reader.stats(""), _scan(reader, "")
    assert scan["requests"] < TRAFFIC.requests
    assert ours["source"] == "rollups" and ours["requests"] == scan["requests"]
    assert ours["by_model"] == scan["by_model"] and ours["error_codes"] == scan["error_codes"]
    assert ours["latency_ms"]["duration"]["count"] == scan["latency_ms"]["duration"]["count"]
    assert ours["cost_usd"]["total"] == pytest.approx(scan["cost_usd"]["total"])


def test_pruning_everything_leaves_no_rollup_rows_behind(journal: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.db"
    shutil.copy(journal, copy)
    prune(copy, max_age_s=1.0, now=T0 + 10 * 86400)
    conn = sqlite3.connect(copy)
    try:
        assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
        # Emptied rows and buckets go with their requests: a size-bounded journal keeps no rollups of nothing.
        assert conn.execute(f"SELECT count(*) FROM {rollups.TABLE}").fetchone()[0] == 0
        assert conn.execute(f"SELECT count(*) FROM {rollups.SKETCHES_TABLE}").fetchone()[0] == 0
        assert conn.execute(f"SELECT count(*) FROM {rollups.PENDING_TABLE}").fetchone()[0] == 0
    finally:
        conn.close()


def _minutes(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute(
        f"SELECT status, requests, duration_n, duration_sum, output_tokens FROM {rollups.TABLE}"
        " WHERE grain = 60 ORDER BY status"
    ).fetchall()


def _durations(conn: sqlite3.Connection, grain: int) -> dict[int, int]:
    counts: dict[int, int] = {}
    rows = f"SELECT duration_sketch FROM {rollups.TABLE} JOIN {rollups.SKETCHES_TABLE} USING (rid) WHERE grain = ?"
    for (stored,) in conn.execute(rows, (grain,)):
        sketch.merge(counts, stored)
    return counts


def test_a_request_moved_after_completing_is_moved_in_the_rollups(tmp_path: Path) -> None:
    conn = schema.connect(tmp_path / "j.db")
    try:
        conn.execute("INSERT INTO requests (id, ts, model, completed) VALUES ('a', 120.5, 'm', 0)")
        assert rollups.fold(conn) == 0 and _minutes(conn) == []  # in flight: not counted
        conn.execute("UPDATE requests SET completed = 1, status = 499, duration_ms = 10.0 WHERE id = 'a'")
        assert rollups.fold(conn) == 1 and _minutes(conn) == [(499, 1, 1, 10.0, 0)]
        # Changed in a later transaction: the old values leave, the new ones come, the emptied row goes.
        conn.execute("UPDATE requests SET status = 200, duration_ms = 900.0, output_tokens = 3 WHERE id = 'a'")
        assert rollups.fold(conn) == 2
        assert _minutes(conn) == [(200, 1, 1, 900.0, 3)]
        assert _durations(conn, 3600) == {sketch.bucket(900.0): 1}
        # Completed and changed before one fold (one transaction): counted once, as it ends.
        conn.execute(
            "INSERT INTO requests (id, ts, model, status, duration_ms, completed) VALUES ('b', 130, 'm', 200, 5, 1)"
        )
        conn.execute("UPDATE requests SET duration_ms = 50.0, input_tokens = 4 WHERE id = 'b'")
        conn.execute("UPDATE requests SET has_tool_use = 1 WHERE id = 'b'")  # not a rollup column: nothing noted
        assert rollups.fold(conn) == 3
        assert _minutes(conn) == [(200, 2, 2, 950.0, 3)]
        assert _durations(conn, 86400) == {sketch.bucket(900.0): 1, sketch.bucket(50.0): 1}
        assert conn.execute(f"SELECT sum(input_tokens) FROM {rollups.TABLE} WHERE grain = 60").fetchone() == (4,)
    finally:
        conn.close()


def test_a_request_changed_by_a_late_event_after_its_batch_is_moved(tmp_path: Path) -> None:
    """Through the writer: a request completes in one batch, and an event that arrives after
    it (in a later batch) changes what its summary says; the rollups follow the summary."""
    path = tmp_path / "j.db"

    async def write() -> None:
        writer = JournalWriter(path)
        await writer.start()
        try:
            for seq, event in enumerate(
                [
                    Received(t=0.0, method="POST", path="/v1/messages", ts=T0 + 1.5),
                    Completed(t=0.2, status=200, duration_ms=200.0, stop_reason="end_turn"),
                ],
                1,
            ):
                await writer.append("msg_a", seq, event)
            await writer.flush()
            await writer.append("msg_a", 3, Completed(t=0.9, status=499, duration_ms=900.0))
            await writer.flush()
        finally:
            await writer.close()

    asyncio.run(write())
    with JournalReader(path) as reader:
        reader.exact_up_to = 0
        ours, scan = reader.stats(""), _scan(reader, "")
    assert scan["by_status"] == {"499": 1} and scan["latency_ms"]["duration"]["max"] == 900.0
    assert ours["source"] == "rollups" and ours["by_status"] == scan["by_status"]
    assert ours["latency_ms"]["duration"]["count"] == 1 and _close(ours["latency_ms"]["duration"]["p50"], 900.0)
    conn = sqlite3.connect(path)
    try:
        assert conn.execute(f"SELECT count(*) FROM {rollups.TABLE} WHERE requests <= 0").fetchone()[0] == 0
        orphans = f"SELECT count(*) FROM {rollups.SKETCHES_TABLE} WHERE rid NOT IN (SELECT rid FROM {rollups.TABLE})"
        assert conn.execute(orphans).fetchone()[0] == 0
    finally:
        conn.close()


def test_a_journal_written_by_schema_7_is_migrated_to_one_sketch_per_row(tmp_path: Path) -> None:
    """`data/journal-v7.db.gz`: 200 requests written by the writer of schema 7 (per-row
    triggers, a `rollup_sketch` row per bucket), the event bodies left out to keep it small."""
    path = tmp_path / "j.db"
    path.write_bytes(gzip.decompress((Path(__file__).parent / "data" / "journal-v7.db.gz").read_bytes()))
    conn = sqlite3.connect(path)
    assert schema.schema_version(conn) == 7
    v7_minutes = conn.execute(f"SELECT count(*), sum(requests) FROM {rollups.TABLE} WHERE grain = 60").fetchone()
    conn.close()
    with JournalReader(path) as reader:  # read-only, before a writer migrates it: scanned
        reader.exact_up_to = 0
        assert not reader.rollups and reader.stats("")["source"] == "scan"
    seen: list[tuple[int, int]] = []
    conn = schema.connect(path, progress=lambda done, total: seen.append((done, total)))
    try:
        assert schema.schema_version(conn) == schema.SCHEMA_VERSION
        assert seen and seen[-1] == (200, 200)
        names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master")}
        assert rollups.V7_SKETCH_TABLE not in names and rollups.PENDING_TABLE in names
        assert (
            conn.execute(f"SELECT count(*), sum(requests) FROM {rollups.TABLE} WHERE grain = 60").fetchone()
            == v7_minutes
        )
    finally:
        conn.close()
    with JournalReader(path) as reader:
        reader.exact_up_to = 0
        for query in ("", "model:claude-sonnet-4", "has:error"):
            ours, scan = reader.stats(query), _scan(reader, query)
            assert ours["source"] == "rollups" and ours["requests"] == scan["requests"]
            assert ours["by_status"] == scan["by_status"] and ours["by_model"] == scan["by_model"]
            for metric in ("duration", "ttfe"):
                mine, exact = ours["latency_ms"][metric], scan["latency_ms"][metric]
                assert mine["count"] == exact["count"]
                assert all(_close(mine[p], exact[p]) for p in ("p50", "p90", "p99"))


def test_a_journal_of_the_previous_version_gets_its_rollups_when_migrated(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.apply_pragmas(conn)
    schema.migrate(conn, schema.MIGRATIONS[:6])
    conn.executemany(
        "INSERT INTO requests (id, ts, model, status, duration_ms, input_tokens, completed)"
        " VALUES (?, ?, ?, ?, ?, ?, ?)",
        [
            ("r0", 100.0, "m", 200, 10.0, 5, 1),
            ("r1", 130.0, "m", 200, 30.0, 7, 1),
            ("r2", 190.0, None, 500, 1.0, None, 1),
            ("r3", 200.0, "m", None, None, None, 0),  # in flight
        ],
    )
    conn.close()
    schema.connect(path).close()
    with JournalReader(path) as reader:
        assert reader.rollups
        reader.exact_up_to = 0
        numbers = reader.stats("")
        assert reader.get_request("r0")["cost_usd"] is None  # type: ignore[index]
    assert numbers["source"] == "rollups" and numbers["scanned"] == 1  # the one in flight
    assert (numbers["requests"], numbers["completed"], numbers["in_flight"]) == (4, 3, 1)
    assert numbers["by_model"] == {"m": 3} and numbers["tokens"]["input"] == 12
    assert numbers["latency_ms"]["duration"]["max"] == 30.0
    assert numbers["latency_ms"]["duration"]["mean"] == pytest.approx(41.0 / 3)
    conn = sqlite3.connect(path)
    try:
        # One minute row each here (a model, a status each): three requests in three rows.
        minutes = f"SELECT sum(requests), count(*) FROM {rollups.TABLE} WHERE grain = 60"
        assert conn.execute(minutes).fetchone() == (3, 3)
        days = f"SELECT sum(requests), count(*) FROM {rollups.TABLE} WHERE grain = 86400"
        assert conn.execute(days).fetchone() == (3, 2)  # one day: m/200 and None/500
    finally:
        conn.close()


def test_the_sketch_reads_within_its_error() -> None:
    values = [math.exp(i / 37.0) for i in range(-200, 600)] + [0.0, 0.0]
    counts: dict[int, int] = {}
    sketch.add(counts, values)
    ordered = sorted(values)
    for p in (0.001, 0.25, 0.5, 0.9, 0.99, 1.0):
        exact = ordered[max(0, math.ceil(p * len(ordered)) - 1)]
        (estimate,) = sketch.percentiles(counts, [p])
        assert estimate is not None and _close(estimate, exact), (p, estimate, exact)
    merged: dict[int, int] = {}
    for part in (values[:300], values[300:]):
        half: dict[int, int] = {}
        sketch.add(half, part)
        for b, n in half.items():
            merged[b] = merged.get(b, 0) + n
    assert merged == counts


def test_cost_is_a_term_of_the_query_language(journal: Path) -> None:
    with JournalReader(journal) as reader:
        rows = reader.list_requests(limit=TRAFFIC.requests)
        costs = [r["cost_usd"] for r in rows if r["cost_usd"] is not None]
        assert costs and len(costs) < len(rows)  # qwen3-8b has no price
        threshold = min(costs)
        assert reader.count(f"cost:>{threshold}") == sum(1 for c in costs if c > threshold) > 0
        assert reader.count("cost:>=$0") == len(costs)
        assert reader.count("!cost:>=0") == len(rows) - len(costs)
        numbers = reader.stats(f"cost:>{threshold}")
        assert numbers["source"] == "scan"  # the rollups keep no per-request cost
        assert numbers["cost_usd"]["total"] == pytest.approx(sum(c for c in costs if c > threshold))


@pytest.mark.parametrize("vector_from", [0, 1 << 40])
def test_a_stored_sketch_gives_back_its_counts_and_many_add_up(
    monkeypatch: pytest.MonkeyPatch, vector_from: int
) -> None:
    # Both ways `merge_all` adds (bucket by bucket, and as numpy vectors past a size).
    monkeypatch.setattr(sketch, "_VECTOR_FROM", vector_from)
    rng = random.Random(3)
    for _ in range(100):
        stored, total = [], {}
        for _ in range(rng.randint(1, 30)):
            counts: dict[int, int] = {}
            for _ in range(rng.randint(0, 30)):
                b = sketch.ZERO if rng.random() < 0.05 else rng.randint(-50, 300)
                counts[b] = counts.get(b, 0) + rng.choice([1, 2, 5, -1, 3_000_000_000])  # past 32 bits too
            back: dict[int, int] = {}
            sketch.merge(back, sketch.encode(counts))
            assert {b: c for b, c in back.items() if c} == {b: c for b, c in counts.items() if c}
            stored.append(sketch.encode(counts))
            for b, c in counts.items():
                total[b] = total.get(b, 0) + c
        merged: dict[int, int] = {}
        sketch.merge_all(merged, stored)
        assert {b: c for b, c in merged.items() if c} == {b: c for b, c in total.items() if c}
        first, last = _counts(stored[0]), _counts(stored[-1])
        both = {b: first.get(b, 0) + last.get(b, 0) for b in first.keys() | last.keys()}
        assert sketch.add_encoded(stored[0], stored[-1]) == sketch.encode(both)


def _counts(stored: bytes | None) -> dict[int, int]:
    out: dict[int, int] = {}
    sketch.merge(out, stored)
    return out
