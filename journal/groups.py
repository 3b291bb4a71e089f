"""Statistics per group and time bucket (`smg journal stats --by … --every …`).

One SQL pass over the selected summary rows reads each request's group value, bucket,
status, latency, time to first event and token counts; grouping and the percentiles are done
here, so the cost is one indexed read of the matches whatever the number of groups. A bucket
is `floor(ts / every) * every` (epoch seconds, UTC-aligned); a request without an arrival time
has no bucket (None). Percentiles are nearest-rank, as in `journal.stats`.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from journal.stats import PERCENTILES, percentile_label, rank

GROUPS: dict[str, str] = {
    "tenant": "tenant",
    "key": "key_fp",
    "user": "user_id",
    "session": "session_id",
    "model": "model",
    "worker": "worker",
    "backend": "backend",
    "status": "status",
    "stop_reason": "stop_reason",
}
"""`--by` names and the `requests` column each groups by."""
_FAILED = "(IFNULL(status, 0) >= 400 OR error_type IS NOT NULL OR error_code IS NOT NULL)"
_EVERY = re.compile(r"(\d+)([smhd])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_every(text: str) -> int:
    """`30s`, `1m`, `1h`, `1d` → seconds. Raises ValueError."""
    match = _EVERY.fullmatch(text.strip())
    if not match or int(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a bucket width (a whole number and s, m, h or d: 1m, 1h, 1d)")
    return int(match.group(1)) * _UNITS[match.group(2)]


@dataclass
class _Acc:
    requests: int = 0
    errors: int = 0
    hung_up: int = 0
    tokens_in: int = 0
    tokens_out: int = 0
    cost_usd: float = 0.0
    priced: int = 0
    durations: list[float] = field(default_factory=list)
    ttfes: list[float] = field(default_factory=list)


def compute(
    conn: sqlite3.Connection,
    where: str = "1",
    params: Sequence[Any] = (),
    *,
    by: str | None = None,
    every: int | None = None,
    percentiles: Sequence[float] = PERCENTILES,
) -> list[dict[str, Any]]:
    """One dict per (group, bucket) with requests: `group` (None without `by`), `bucket`
    (epoch seconds, None without `every`), `requests`, `errors`, `error_rate`, `hung_up`,
    `latency_ms` and `ttft_ms` ({`count`, `p50`, …}), `tokens_in`, `tokens_out`, `cost_usd`
    (None when no request of the group has a price). Sorted by
    bucket, then by requests (most first). Raises ValueError for an unknown `by`."""
    if by is not None and by not in GROUPS:
        raise ValueError(f"cannot group by {by!r}; choose one of {', '.join(GROUPS)}")
    group = GROUPS[by] if by is not None else "NULL"
    bucket = f"CAST(ts / {int(every)} AS INTEGER) * {int(every)}" if every else "NULL"
    sql = (
        f"SELECT {group}, {bucket}, {_FAILED}, hung_up, duration_ms, ttfe_ms, input_tokens, output_tokens, cost_usd"
        f" FROM requests WHERE ({where or '1'})"
    )
    return aggregate(conn.execute(sql, list(params)), percentiles)


def aggregate(rows: Iterable[Sequence[Any]], percentiles: Sequence[float] = PERCENTILES) -> list[dict[str, Any]]:
    """`compute`'s dicts from its read, whatever store ran it: per selected request `(group,
    bucket, failed, hung_up, duration_ms, ttfe_ms, input_tokens, output_tokens, cost_usd)`."""
    accs: dict[tuple[Any, Any], _Acc] = {}
    for g, b, failed, hung_up, duration, ttfe, tin, tout, cost in rows:
        acc = accs.get((g, b))
        if acc is None:
            acc = accs[(g, b)] = _Acc()
        acc.requests += 1
        acc.errors += 1 if failed else 0
        acc.hung_up += 1 if hung_up else 0
        acc.tokens_in += tin if isinstance(tin, int) else 0
        acc.tokens_out += tout if isinstance(tout, int) else 0
        if isinstance(cost, int | float):
            acc.cost_usd += cost
            acc.priced += 1
        if duration is not None:
            acc.durations.append(duration)
        if ttfe is not None:
            acc.ttfes.append(ttfe)
    out = [
        {
            "group": g,
            "bucket": b,
            "requests": a.requests,
            "errors": a.errors,
            "error_rate": a.errors / a.requests,
            "hung_up": a.hung_up,
            "latency_ms": _distribution(a.durations, percentiles),
            "ttft_ms": _distribution(a.ttfes, percentiles),
            "tokens_in": a.tokens_in,
            "tokens_out": a.tokens_out,
            "cost_usd": a.cost_usd if a.priced else None,
        }
        for (g, b), a in accs.items()
    ]
    out.sort(key=lambda r: (r["bucket"] is None, r["bucket"] or 0, -r["requests"], str(r["group"])))
    return out


def _distribution(values: list[float], percentiles: Sequence[float]) -> dict[str, Any]:
    values.sort()
    out: dict[str, Any] = {"count": len(values)}
    for p in percentiles:
        out[percentile_label(p)] = values[rank(p, len(values))] if values else None
    return out


def series(rows: list[dict[str, Any]], metric: str) -> list[tuple[Any, float | None]]:
    """`(bucket, value)` of one metric per row: `requests`, `errors`, `error_rate`, `hung_up`,
    `tokens_in`, `tokens_out`, or a percentile of `latency` or `ttft` (`latency_p99`,
    `ttft_p50`). Raises ValueError for another name."""
    out: list[tuple[Any, float | None]] = []
    for row in rows:
        if metric in ("requests", "errors", "error_rate", "hung_up", "tokens_in", "tokens_out"):
            value: float | None = float(row[metric])
        else:
            kind, _, label = metric.partition("_")
            if kind not in ("latency", "ttft") or label not in row[f"{kind}_ms"] or label == "count":
                raise ValueError(
                    f"cannot plot {metric!r}; choose requests, errors, error_rate, hung_up, tokens_in, tokens_out,"
                    " latency_p50, latency_p99, ttft_p50, …"
                )
            value = row[f"{kind}_ms"][label]
        out.append((row["bucket"], value))
    return out
