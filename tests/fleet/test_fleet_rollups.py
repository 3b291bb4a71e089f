"""The fleet journal's rollups (`journal.pg.rollups`) against a scan of the same PostgreSQL
journal: shipped by the real shipper from a journal the real writer wrote (priced), sent again,
changed after shipping, trimmed and dropped by retention, and read by `smg journal stats`."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import psycopg
import pytest

from journal import schema as local_schema
from journal import sketch
from journal.pg import outbox
from journal.pg.prune import prune
from journal.pg.read import PostgresReader
from journal.pg.shipper import Shipper
from journal.prices import parse
from tests.fleet.conftest import until
from tools.build_journal import T0, Traffic, build

PRICES = parse({"models": {"claude-*": {"input": 1.0, "output": 5.0}}})
TRAFFIC = Traffic(1200, span_s=2 * 86_400.0)  # T0 is mid-day: three UTC days

_SUMS = (
    "count(*), COALESCE(sum(input_tokens), 0), COALESCE(sum(output_tokens), 0), COALESCE(sum(cost_usd), 0),"
    " count(duration_ms), COALESCE(sum(duration_ms), 0), count(ttfe_ms)"
)
_ROLLED = (
    "COALESCE(sum(requests), 0), COALESCE(sum(input_tokens), 0), COALESCE(sum(output_tokens), 0),"
    " COALESCE(sum(cost_usd), 0), COALESCE(sum(duration_n), 0), COALESCE(sum(duration_sum), 0),"
    " COALESCE(sum(ttfe_n), 0)"
)


def _ship(started: list[Shipper], path: Path, url: str, n: int, *, duplicates: int = 0) -> Shipper:
    shipper = Shipper(path, url, "web-1", batch_size=300)
    shipper.start()
    started.append(shipper)
    until(
        lambda: (
            shipper.stats["requests_shipped"] + shipper.stats["duplicates"] >= n + duplicates
            and shipper.stats["unshipped"] == 0
        ),
        timeout=30.0,
        what="shipping",
    )
    return shipper


def _by(
    conn: psycopg.Connection[Any], column: str, grain: int = 60
) -> tuple[dict[Any, tuple[Any, ...]], dict[Any, tuple[Any, ...]]]:
    """Per value of `column`: the sums from a scan of the completed requests, and from the
    rollup rows of one grain (each request is counted once per grain)."""
    scan = {
        r[0]: tuple(r[1:])
        for r in conn.execute(f"SELECT {column}, {_SUMS} FROM requests WHERE completed = 1 GROUP BY 1").fetchall()
    }
    rolled = {
        r[0]: tuple(r[1:])
        for r in conn.execute(
            f"SELECT {column}, {_ROLLED} FROM rollups WHERE grain = %s GROUP BY 1 HAVING sum(requests) != 0", (grain,)
        )
    }
    return scan, rolled


def _same(scan: dict[Any, tuple[Any, ...]], rolled: dict[Any, tuple[Any, ...]]) -> None:
    assert scan.keys() == rolled.keys()
    for key, exact in scan.items():
        got = rolled[key]
        assert got[:3] == exact[:3] and got[4] == exact[4] and got[6] == exact[6], key
        assert float(got[3]) == pytest.approx(float(exact[3])) and float(got[5]) == pytest.approx(float(exact[5]))


def _percentile_agrees(conn: psycopg.Connection[Any], p: float) -> None:
    values = sorted(
        v for (v,) in conn.execute("SELECT duration_ms FROM requests WHERE completed = 1 AND duration_ms IS NOT NULL")
    )
    counts = dict(
        conn.execute(
            "SELECT e.key::bigint, sum(e.value::bigint)::bigint FROM rollup_sketches JOIN rollups USING (rid)"
            " CROSS JOIN LATERAL jsonb_each_text(duration_sketch) AS e WHERE grain = 86400 GROUP BY 1"
        )
    )
    (estimate,) = sketch.percentiles({int(b): int(n) for b, n in counts.items()}, [p])
    exact = values[max(0, math.ceil(p * len(values)) - 1)]
    assert estimate is not None and abs(estimate - exact) <= sketch.RELATIVE_ERROR * exact + 1e-9


async def test_shipped_requests_are_rolled_up_once_however_often_sent(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    path = tmp_path / "j.db"
    await build(path, TRAFFIC, prices=PRICES)
    _ship(started, path, sink, TRAFFIC.requests).stop()
    with psycopg.connect(sink, autocommit=True) as conn:
        for column in ("model", "worker", "status", "key_fp", "day", "error_code"):
            for grain in (60, 3600, 86400):
                _same(*_by(conn, column, grain))
        _percentile_agrees(conn, 0.5)
        _percentile_agrees(conn, 0.99)
        total = conn.execute("SELECT sum(requests), sum(cost_usd) FROM rollups WHERE grain = 3600").fetchone()
        assert total is not None and int(total[0]) == TRAFFIC.requests and float(total[1]) > 0
    # Everything queued again (a crash between PostgreSQL's commit and the local cursor's):
    # the resent rows are the same, so nothing is counted twice.
    local = local_schema.connect(path)
    local.execute(f"INSERT INTO {outbox.TABLE} (rk, queued) SELECT rk, 0 FROM requests WHERE completed = 1")
    local.close()
    _ship(started, path, sink, 0, duplicates=TRAFFIC.requests)
    with psycopg.connect(sink, autocommit=True) as conn:
        _same(*_by(conn, "model"))
        # A summary that changed after it shipped is upserted: its old row leaves the rollups.
        conn.execute("UPDATE requests SET status = 503, model = 'moved' WHERE id = 'req_00000001'")
        scan, rolled = _by(conn, "model")
        _same(scan, rolled)
        assert rolled["moved"][0] == 1


async def test_retention_keeps_the_rollups_to_what_the_journal_holds(
    tmp_path: Path, sink: str, started: list[Shipper]
) -> None:
    path = tmp_path / "j.db"
    await build(path, TRAFFIC, prices=PRICES)
    _ship(started, path, sink, TRAFFIC.requests).stop()
    with psycopg.connect(sink, autocommit=True) as conn:
        days = [d for (d,) in conn.execute("SELECT DISTINCT day FROM requests ORDER BY 1")]
    # The first day dropped whole and the second trimmed up to a cutoff inside it.
    cutoff = T0 + 86_400.0 + 3600.0
    result = prune(sink, max_age_s=1.0, now=cutoff + 1.0)
    assert result.requests_deleted > 0
    with psycopg.connect(sink, autocommit=True) as conn:
        left = [d for (d,) in conn.execute("SELECT DISTINCT day FROM requests ORDER BY 1")]
        assert left == days[1:]
        for column in ("day", "model", "status"):
            for grain in (60, 3600, 86400):
                _same(*_by(conn, column, grain))
        assert conn.execute("SELECT count(*) FROM rollups WHERE day = %s", (days[0],)).fetchone() == (0,)


async def test_stats_of_the_fleet_journal_read_the_rollups(tmp_path: Path, sink: str, started: list[Shipper]) -> None:
    path = tmp_path / "j.db"
    await build(path, TRAFFIC, prices=PRICES)
    _ship(started, path, sink, TRAFFIC.requests).stop()
    with PostgresReader(sink) as reader:
        reader.exact_up_to = 0
        ours = reader.stats("model:claude-*")
        assert ours["source"] == "rollups"
        reader.exact_up_to = 10**9
        exact = reader.stats("model:claude-*")
        assert exact["source"] == "scan"
        grouped = reader.group_stats("", by="worker")
        assert reader.stats_source.startswith("scanned")
        reader.exact_up_to = 0
        rolled = reader.group_stats("", by="worker")
        assert reader.stats_source.startswith("from rollups")
    for key in ("requests", "completed", "errors", "by_model", "by_status", "error_codes", "stop_reasons"):
        assert ours[key] == exact[key], key
    assert ours["tokens"]["output"] == exact["tokens"]["output"]
    assert ours["cost_usd"]["total"] == pytest.approx(exact["cost_usd"]["total"])
    for p in ("p50", "p99"):
        got, want = ours["latency_ms"]["duration"][p], exact["latency_ms"]["duration"][p]
        assert abs(got - want) <= sketch.RELATIVE_ERROR * want + 1e-9
    assert [(r["group"], r["requests"], r["tokens_out"]) for r in rolled] == [
        (r["group"], r["requests"], r["tokens_out"]) for r in grouped
    ]
