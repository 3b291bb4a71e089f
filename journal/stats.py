"""Aggregate statistics over the `requests` summary table (`smg journal stats`).

Pure over a sqlite3 connection and an SQL boolean expression selecting the rows (what
`journal.query.compile_query` produces; empty for every row). Everything is an SQL aggregate
or an indexed `ORDER BY … LIMIT 1 OFFSET k`, so no query loads the rows into Python.

Percentiles use the nearest-rank method: p is the smallest value with at least p·n values at
or below it. Output tokens per second are computed over requests that report output tokens
and a positive duration, two ways: all their output tokens over all their time (what the
gateway delivered overall), and the median of each request's own rate.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import Any

PERCENTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

# A failed request: an error status, or an error after a stream had started (its status is
# the 200 the client got before the SSE `error` event). The same rule as the query's `has:error`.
_FAILED = "(IFNULL(status, 0) >= 400 OR error_type IS NOT NULL OR error_code IS NOT NULL)"
# Requests that produced output at a measurable rate.
_RATED = "output_tokens IS NOT NULL AND duration_ms > 0"


def compute(
    conn: sqlite3.Connection,
    where: str = "",
    params: Sequence[Any] = (),
    percentiles: Sequence[float] = PERCENTILES,
) -> dict[str, Any]:
    """Counts, breakdowns, latency percentiles and token throughput of the selected requests.

    Keys: `requests`, `completed`, `in_flight`, `errors` (status >= 400, or an error after
    the stream started), `first_ts`, `last_ts`; `by_status_class`, `by_status`, `by_model`,
    `by_backend`, `error_codes` (`error_code`, else `error_type`, of those errors), `stop_reasons` (each a
    {value: count} dict, largest first); `latency_ms` ({`duration`, `ttfe`} → {`count`,
    `mean`, `max`, `p50`, …}); `tokens` (`input`, `output`, `output_per_s`,
    `output_per_s_median`, `rated_requests`).
    """
    sel = _Selection(conn, where, params)
    total, completed, errors, first_ts, last_ts = sel.one(
        f"count(*), total(completed), total({_FAILED}), min(ts), max(ts)"
    )
    out: dict[str, Any] = {
        "requests": int(total),
        "completed": int(completed),
        "in_flight": int(total - completed),
        "errors": int(errors),
        "first_ts": first_ts,
        "last_ts": last_ts,
        "by_status_class": sel.counts(
            "CASE WHEN status IS NULL THEN 'none' ELSE CAST(status / 100 AS TEXT) || 'xx' END"
        ),
        "by_status": {str(k): v for k, v in sel.counts("status", "status IS NOT NULL").items()},
        "by_model": sel.counts("model", "model IS NOT NULL"),
        "by_backend": sel.counts("backend", "backend IS NOT NULL"),
        "error_codes": sel.counts("COALESCE(error_code, error_type, 'status ' || status)", _FAILED),
        "stop_reasons": sel.counts("stop_reason", "stop_reason IS NOT NULL"),
        "latency_ms": {
            "duration": sel.distribution("duration_ms", "duration_ms IS NOT NULL", percentiles),
            "ttfe": sel.distribution("ttfe_ms", "ttfe_ms IS NOT NULL", percentiles),
        },
    }
    input_tokens, output_tokens = sel.one("total(input_tokens), total(output_tokens)")
    rated, rated_output, rated_ms = sel.one("count(*), total(output_tokens), total(duration_ms)", _RATED)
    median = sel.ranked("output_tokens * 1000.0 / duration_ms", _RATED, int(rated), 0.5)
    out["tokens"] = {
        "input": int(input_tokens),
        "output": int(output_tokens),
        "rated_requests": int(rated),
        "output_per_s": rated_output * 1000.0 / rated_ms if rated_ms > 0 else None,
        "output_per_s_median": median,
    }
    return out


def percentile_label(p: float) -> str:
    """`0.5` → `p50`, `0.999` → `p99.9`."""
    return "p" + f"{p * 100:.3f}".rstrip("0").rstrip(".")


def rank(p: float, n: int) -> int:
    """The 0-based index of the nearest-rank p-th percentile among n sorted values."""
    return min(n - 1, max(0, math.ceil(p * n) - 1))


class _Selection:
    """SQL over the selected rows of `requests`, an extra condition ANDed in per query."""

    def __init__(self, conn: sqlite3.Connection, where: str, params: Sequence[Any]) -> None:
        self._conn = conn
        self._where = f"({where})" if where.strip() else "1"
        self._params = list(params)

    def _sql(self, select: str, extra: str | None, tail: str = "") -> str:
        cond = f"{self._where} AND ({extra})" if extra else self._where
        return f"SELECT {select} FROM requests WHERE {cond} {tail}"

    def one(self, select: str, extra: str | None = None) -> tuple[Any, ...]:
        row: tuple[Any, ...] = self._conn.execute(self._sql(select, extra), self._params).fetchone()
        return row

    def counts(self, expr: str, extra: str | None = None) -> dict[Any, int]:
        rows = self._conn.execute(
            self._sql(f"{expr} AS k, count(*) AS n", extra, "GROUP BY k ORDER BY n DESC, k"), self._params
        ).fetchall()
        return {k: int(n) for k, n in rows}

    def ranked(self, expr: str, extra: str, n: int, p: float) -> float | None:
        if n == 0:
            return None
        row = self._conn.execute(
            self._sql(f"{expr} AS v", extra, "ORDER BY v LIMIT 1 OFFSET ?"), [*self._params, rank(p, n)]
        ).fetchone()
        return None if row is None else float(row[0])

    def distribution(self, column: str, extra: str, percentiles: Sequence[float]) -> dict[str, Any]:
        n, mean, top = self.one(f"count({column}), avg({column}), max({column})", extra)
        out: dict[str, Any] = {"count": int(n), "mean": mean, "max": top}
        for p in percentiles:
            out[percentile_label(p)] = self.ranked(column, extra, int(n), p)
        return out
