"""Aggregate statistics over the `requests` summary table (`smg journal stats`).

Pure over a sqlite3 connection and an SQL boolean expression selecting the rows (what
`journal.query.compile_query` produces; empty for every row). Two reads of the selection
whatever its size: an SQL aggregate for the totals, and per request its breakdowns' values (as
one key) and the three numbers the percentiles need, counted and sorted here. A query per
breakdown or per percentile, or a GROUP BY, scans or sorts the whole selection again each
time: seconds at a million rows.

Percentiles use the nearest-rank method: p is the smallest value with at least p·n values at
or below it. Output tokens per second are computed over requests that report output tokens
and a positive duration, two ways: all their output tokens over all their time (what the
gateway delivered overall), and the median of each request's own rate.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

PERCENTILES: tuple[float, ...] = (0.5, 0.9, 0.99)

# A failed request: an error status, or an error after a stream had started (its status is
# the 200 the client got before the SSE `error` event). The same rule as the query's `has:error`.
_FAILED = "(IFNULL(status, 0) >= 400 OR error_type IS NOT NULL OR error_code IS NOT NULL)"
# Requests that produced output at a measurable rate.
# `+`: not through the duration index, which holds nearly every row (a lookup per row).
_RATED = "output_tokens IS NOT NULL AND +duration_ms > 0"


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
    `output_per_s_median`, `rated_requests`); `cost_usd` (`total`, None when no request has a
    price, and `priced_requests`).
    """
    cond = f"({where})" if where.strip() else "1"
    args = list(params)
    totals = conn.execute(
        f"SELECT count(*), total(completed), total({_FAILED}), min(ts), max(ts),"
        f" total(input_tokens), total(output_tokens), total({_RATED}),"
        f" total(CASE WHEN {_RATED} THEN output_tokens END), total(cost_usd), count(cost_usd)"
        f" FROM requests WHERE {cond}",
        args,
    ).fetchone()
    # One read of the selection: per request, its breakdowns' values as one JSON array (a key
    # the Counter hashes at C speed; a few hundred distinct ones, decoded once each) and the
    # three numbers the percentiles need. Four values a row, not nine: building the rows'
    # Python objects is what a million requests cost.
    rows = conn.execute(
        "SELECT json_array(CASE WHEN status IS NULL THEN 'none' ELSE CAST(status / 100 AS TEXT) || 'xx' END,"
        f" status, model, backend, CASE WHEN {_FAILED} THEN COALESCE(error_code, error_type, 'status ' || status)"
        f" END, stop_reason), duration_ms, ttfe_ms, CASE WHEN {_RATED} THEN output_tokens * 1000.0 / duration_ms END"
        f" FROM requests WHERE {cond}",
        args,
    ).fetchall()
    return summarize(totals, rows, percentiles)


def summarize(
    totals: Sequence[Any], rows: list[tuple[Any, ...]], percentiles: Sequence[float] = PERCENTILES
) -> dict[str, Any]:
    """`compute`'s dict from its two reads, whatever store ran them: `totals` (count, completed,
    failed, first ts, last ts, input tokens, output tokens, rated requests, their output tokens,
    cost in dollars, requests with a cost)
    and per selected request `(breakdown key, duration, ttfe, rate)`, the key a JSON array of its
    status class, status, model, backend, error code and stop reason, the rate None for a
    request not rated.

    Sums of milliseconds (the means, the rated time) are summed here, exactly (`math.fsum`):
    the same number from any store, whatever order it reads the rows in."""
    total, completed, errors, first_ts, last_ts, input_tokens, output_tokens, rated, rated_output, cost, priced = totals
    columns: list[Any] = list(zip(*rows, strict=True)) if rows else [()] * 4
    del rows
    rated_ms = math.fsum(d for d, r in zip(columns[1], columns[3], strict=True) if r is not None and _number(d))
    timed, first = ([v for v in column if _number(v)] for column in columns[1:3])
    breakdowns: list[Counter[Any]] = [Counter() for _ in range(6)]
    for combination, n in Counter(columns[0]).items():
        for counter, value in zip(breakdowns, orjson.loads(combination), strict=True):
            if value is not None:
                counter[value] += n
    classes, statuses, models, backends, codes, stops = (_ordered(c) for c in breakdowns)
    durations, ttfes, rates = (_sorted(c) for c in columns[1:])
    out: dict[str, Any] = {
        "requests": int(total),
        "completed": int(completed),
        "in_flight": int(total - completed),
        "errors": int(errors),
        "first_ts": first_ts,
        "last_ts": last_ts,
        "by_status_class": classes,
        "by_status": {str(k): v for k, v in statuses.items()},
        "by_model": models,
        "by_backend": backends,
        "error_codes": codes,
        "stop_reasons": stops,
        "latency_ms": {
            "duration": _distribution(durations, percentiles, len(timed), math.fsum(timed)),
            "ttfe": _distribution(ttfes, percentiles, len(first), math.fsum(first)),
        },
    }
    out["tokens"] = {
        "input": int(input_tokens),
        "output": int(output_tokens),
        "rated_requests": int(rated),
        "output_per_s": rated_output * 1000.0 / rated_ms if rated_ms > 0 else None,
        "output_per_s_median": float(rates[rank(0.5, len(rates))]) if rates else None,
    }
    out["cost_usd"] = spend(cost, priced)
    return out


def spend(cost: Any, priced: Any) -> dict[str, Any]:
    """The `cost_usd` entry: the total in dollars of the requests with a price, and how many."""
    return {"total": float(cost or 0.0) if priced else None, "priced_requests": int(priced or 0)}


def _number(value: Any) -> bool:
    """A number, as SQLite's `typeof` says `integer` or `real` (an older file may hold text)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _ordered(counts: Counter[Any]) -> dict[Any, int]:
    """Largest first, ties by value (`ORDER BY n DESC, k`)."""
    return dict(sorted(counts.items(), key=lambda item: (-item[1], _sql_key(item[0]))))


def _sorted(column: Sequence[Any]) -> list[Any]:
    values = [v for v in column if v is not None]
    try:
        values.sort()
    except TypeError:  # text in a numeric column (an older file): sorted as SQLite would
        values.sort(key=_sql_key)
    return values


def _distribution(values: list[Any], percentiles: Sequence[float], numbers: int, summed: float) -> dict[str, Any]:
    """Of sorted `values`: count, mean (of the `numbers` of them that are numbers, summing to
    `summed`), max and the percentiles."""
    out: dict[str, Any] = {
        "count": len(values),
        "mean": summed / numbers if numbers else None,
        "max": values[-1] if values else None,
    }
    for p in percentiles:
        out[percentile_label(p)] = float(values[rank(p, len(values))]) if values else None
    return out


def _sql_key(value: Any) -> tuple[int, Any]:
    # SQLite's order across storage classes: numbers, then text, then blobs.
    if isinstance(value, int | float):
        return (0, value)
    return (1, value) if isinstance(value, str) else (2, bytes(value))


def percentile_label(p: float) -> str:
    """`0.5` → `p50`, `0.999` → `p99.9`."""
    return "p" + f"{p * 100:.3f}".rstrip("0").rstrip(".")


def rank(p: float, n: int) -> int:
    """The 0-based index of the nearest-rank p-th percentile among n sorted values."""
    return min(n - 1, max(0, math.ceil(p * n) - 1))
