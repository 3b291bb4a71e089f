"""`stats` and `stats --by/--every` answered from the rollups (`journal.rollups`).

A query the rollups can answer (`journal.query.rollup_plan`) is read in three parts: the whole
minutes of its range from the rollup rows and their sketches (a grouped read whose size is the
number of rollup rows, not of requests), the requests of the partial minutes at its edges from
the summary table (through the time index), and the requests in flight (through their partial
index). The parts are summed; the sketches are merged by adding their buckets. Counts, token
and cost sums, means and maxima are exact; percentiles are read from the sketches, within
`journal.sketch.RELATIVE_ERROR` of a value of the selection (the maximum bounds them).

`EXACT_UP_TO`: a selection the rollups count at most this many requests of is scanned instead
(`journal.stats`, exact nearest-rank percentiles), which at that size costs milliseconds.

Both stores run the same reads (the fleet journal keeps the same rollups, `journal.pg.rollups`):
a `Dialect` says how a store binds a parameter and buckets an arrival time, and `Run` runs a
statement there.
"""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from journal import rollups, sketch
from journal.query import RollupPlan
from journal.stats import PERCENTILES, percentile_label, spend

EXACT_UP_TO = 20_000
"""Selections of at most this many requests are scanned: exact, and as fast."""

_FAILED = "(COALESCE(status, 0) >= 400 OR error_type IS NOT NULL OR error_code IS NOT NULL)"
_NULL = "CAST(NULL AS TEXT)"

Run = Callable[[str, list[Any]], list[tuple[Any, ...]]]
"""Runs a statement with its parameters in the store and returns its rows."""


@dataclass(frozen=True)
class Dialect:
    """What differs between the stores' SQL here: the parameter placeholder, the start of
    the `every`-second bucket of a request's (real) arrival time, and how a rollup row's
    sketches (`journal.rollups.SKETCHES`) are read: values merged here, or (the fleet journal's
    `jsonb`) summed by bucket in the database."""

    placeholder: str
    bucket: Callable[[int], str]
    sketch_values: bool = True


SQLITE = Dialect("?", lambda every: f"CAST(ts / {every} AS INTEGER) * {every}")
POSTGRES = Dialect("%s", lambda every: f"(floor(ts / {every}) * {every})::bigint", sketch_values=False)


def sqlite_run(conn: sqlite3.Connection) -> Run:
    """`Run` on a SQLite connection."""
    return lambda sql, params: conn.execute(sql, params).fetchall()


_BREAKDOWN = ("status", "model", "backend", "error_code", "error_type", "stop_reason")
_GROUPABLE = {"tenant", "key_fp", "model", "worker", "backend", "status", "stop_reason"}


@dataclass
class _Parts:
    """Where each part of a plan is read: SQL conditions with their parameters."""

    rollup: tuple[str, list[Any]] | None
    scans: list[tuple[str, list[Any]]]


def _cover(lo: float | None, hi: float | None, grains: Sequence[int]) -> list[tuple[int, float | None, float | None]]:
    """[lo, hi) (whole minutes, None: open) as `(grain, start, end)` ranges of rollup rows, the
    coarsest that fit first: a week is seven day rows and the hours and minutes at its ends."""
    grain, finer = grains[0], grains[1:]
    if not finer:
        return [(grain, lo, hi)]
    start = None if lo is None else math.ceil(lo / grain) * grain
    end = None if hi is None else math.floor(hi / grain) * grain
    if start is not None and end is not None and start >= end:
        return _cover(lo, hi, finer)
    out: list[tuple[int, float | None, float | None]] = [(grain, start, end)]
    if lo is not None and start is not None and lo < start:
        out += _cover(lo, start, finer)
    if hi is not None and end is not None and end < hi:
        out += _cover(end, hi, finer)
    return out


def _parts(plan: RollupPlan, dialect: Dialect, grains: Sequence[int] = rollups.GRAINS) -> _Parts:
    where, params = f"({plan.where})", list(plan.params)
    mark = dialect.placeholder

    def _range(lo: float | None, hi: float | None) -> tuple[str, list[Any]]:
        sql, params = "", []
        if lo is not None:
            sql += f" AND ts IS NOT NULL AND ts >= {mark}"
            params.append(lo)
        if hi is not None:
            sql += f" AND ts IS NOT NULL AND ts < {mark}"
            params.append(hi)
        return sql, params

    lo, hi = plan.since, plan.until
    whole_lo = math.ceil(lo / rollups.MINUTE) * rollups.MINUTE if lo is not None else None
    whole_hi = math.floor(hi / rollups.MINUTE) * rollups.MINUTE if hi is not None else None
    time_sql, time_params = _range(lo, hi)
    in_flight = (f"completed = 0 AND {where}{time_sql}", [*params, *time_params])
    if whole_lo is not None and whole_hi is not None and whole_lo >= whole_hi:
        return _Parts(None, [in_flight, (f"completed = 1 AND {where}{time_sql}", [*params, *time_params])])
    scans = [in_flight]
    if lo is not None and whole_lo is not None and lo < whole_lo:
        edge_sql, edge_params = _range(lo, whole_lo)
        scans.append((f"completed = 1 AND {where}{edge_sql}", [*params, *edge_params]))
    if hi is not None and whole_hi is not None and whole_hi < hi:
        edge_sql, edge_params = _range(whole_hi, hi)
        scans.append((f"completed = 1 AND {where}{edge_sql}", [*params, *edge_params]))
    ranges, range_params = [], []
    for grain, start, end in _cover(whole_lo, whole_hi, grains):
        sql, bounds = _range(start, end)
        ranges.append(f"(grain = {grain}{sql})")
        range_params += bounds
    return _Parts((f"{where} AND ({' OR '.join(ranges)})", [*params, *range_params]), scans)


def counted(run: Run, plan: RollupPlan, dialect: Dialect = SQLITE) -> int:
    """How many completed requests the rollups hold in the whole minutes of `plan`'s range."""
    part = _parts(plan, dialect).rollup
    if part is None:
        return 0
    rows = run(f"SELECT sum(requests) FROM {rollups.TABLE} WHERE {part[0]}", part[1])
    return int(rows[0][0] or 0) if rows else 0


@dataclass
class _Sketch:
    counts: dict[int, int] = field(default_factory=dict)
    n: int = 0
    total: float = 0.0
    top: float | None = None

    def add_values(self, values: Sequence[Any]) -> None:
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        sketch.add(self.counts, numbers)
        self.n += len(numbers)
        self.total += math.fsum(numbers)
        if numbers:
            self.top = max(numbers) if self.top is None else max(self.top, *numbers)

    def add_sums(self, n: Any, total: Any, top: Any) -> None:
        self.n += int(n or 0)
        self.total += float(total or 0.0)
        if top is not None:
            self.top = top if self.top is None else max(self.top, top)

    def distribution(self, percentiles: Sequence[float], *, mean: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {"count": self.n}
        if mean:
            out["mean"] = self.total / self.n if self.n else None
            out["max"] = self.top
        values = sketch.percentiles(self.counts, percentiles, self.top)
        for p, v in zip(percentiles, values, strict=True):
            out[percentile_label(p)] = v
        return out


def _merge_sketches(
    run: Run,
    part: tuple[str, list[Any]],
    group: str,
    bucket: str,
    dialect: Dialect,
    into: Callable[[Any, Any], list[dict[int, int]]],
) -> None:
    """Add the sketches of the rollup rows `part` selects into `into(group, bucket)`'s counts
    (one per metric, `journal.rollups.METRICS` order): the stored values merged here, or the
    fleet journal's summed there by group and bucket."""
    if dialect.sketch_values:
        sketches = ", ".join(rollups.SKETCHES)
        stored: dict[tuple[Any, Any], list[list[bytes | None]]] = {}
        for g, b, *values in run(
            f"SELECT {group}, {bucket}, {sketches} FROM {rollups.TABLE} JOIN {rollups.SKETCHES_TABLE} USING (rid)"
            f" WHERE {part[0]} AND requests != 0",
            part[1],
        ):
            lists = stored.get((g, b))
            if lists is None:
                lists = stored[(g, b)] = [[] for _ in rollups.SKETCHES]
            for kept, value in zip(lists, values, strict=True):
                kept.append(value)
        for (g, b), lists in stored.items():
            for counts, kept in zip(into(g, b), lists, strict=True):
                sketch.merge_all(counts, kept)
        return
    per_metric = ", ".join(f"({m}, s.{c})" for m, c in enumerate(rollups.SKETCHES))
    for g, b, metric, sb, n in run(
        f"SELECT {group}, {bucket}, m.metric, e.key::bigint, sum(e.value::bigint) FROM {rollups.TABLE}"
        f" JOIN {rollups.SKETCHES_TABLE} AS s USING (rid) CROSS JOIN LATERAL (VALUES {per_metric}) AS m (metric, v)"
        f" CROSS JOIN LATERAL jsonb_each_text(m.v) AS e WHERE {part[0]} GROUP BY 1, 2, 3, 4",
        part[1],
    ):
        counts = into(g, b)[int(metric)]
        counts[int(sb)] = counts.get(int(sb), 0) + int(n)


_SCANNED = "status, model, backend, error_code, error_type, stop_reason, ts, completed, input_tokens,"
_SCANNED += " output_tokens, cost_usd, duration_ms, ttfe_ms, hung_up"


def stats(
    run: Run, plan: RollupPlan, dialect: Dialect = SQLITE, percentiles: Sequence[float] = PERCENTILES
) -> tuple[dict[str, Any], int]:
    """`journal.stats.compute`'s dict for `plan`, and how many requests were read from the
    summary table (the edges and those in flight)."""
    parts = _parts(plan, dialect)
    cells: Counter[tuple[Any, ...]] = Counter()
    sums: dict[str, float] = dict.fromkeys(
        ("input", "output", "cost", "priced", "rated", "rated_output", "rated_ms"), 0.0
    )
    first_ts: float | None = None
    last_ts: float | None = None
    metrics = {name: _Sketch() for name in rollups.METRICS}
    if parts.rollup is not None:
        where, params = parts.rollup
        for row in run(
            f"SELECT {', '.join(_BREAKDOWN)}, sum(requests), sum(input_tokens), sum(output_tokens),"
            " sum(cost_usd), sum(priced), sum(duration_n), sum(duration_sum), sum(ttfe_n), sum(ttfe_sum),"
            " sum(rated), sum(rated_output), sum(rated_ms), min(first_ts), max(last_ts), max(duration_max),"
            f" max(ttfe_max) FROM {rollups.TABLE} WHERE {where} GROUP BY {', '.join(_BREAKDOWN)}",
            params,
        ):
            n = int(row[6])
            if n == 0:
                continue
            cells[row[:6]] += n
            for name, v in zip(("input", "output", "cost", "priced"), row[7:11], strict=True):
                sums[name] += float(v)
            metrics["duration"].add_sums(row[11], row[12], row[20])
            metrics["ttfe"].add_sums(row[13], row[14], row[21])
            sums["rated"] += int(row[15])
            sums["rated_output"] += int(row[16])
            sums["rated_ms"] += float(row[17])
            first_ts = row[18] if first_ts is None or (row[18] is not None and row[18] < first_ts) else first_ts
            last_ts = row[19] if last_ts is None or (row[19] is not None and row[19] > last_ts) else last_ts
        every_metric = [metrics[name].counts for name in rollups.METRICS]
        _merge_sketches(run, parts.rollup, _NULL, _NULL, dialect, lambda g, b: every_metric)
    scanned = 0
    in_flight = 0
    rates: list[float] = []
    for where, params in parts.scans:
        rows = run(f"SELECT {_SCANNED} FROM requests WHERE {where}", params)
        scanned += len(rows)
        for row in rows:
            status, model, backend, code, etype, stop, ts, completed, tin, tout, cost, dur, ttfe, _ = row
            cells[(status, model, backend, code, etype, stop)] += 1
            in_flight += 0 if completed else 1
            sums["input"] += tin if isinstance(tin, int) else 0
            sums["output"] += tout if isinstance(tout, int) else 0
            if isinstance(cost, int | float):
                sums["cost"] += cost
                sums["priced"] += 1
            if isinstance(tout, int) and isinstance(dur, int | float) and dur > 0:
                sums["rated"] += 1
                sums["rated_output"] += tout
                sums["rated_ms"] += dur
                rates.append(tout * 1000.0 / dur)
            if isinstance(ts, int | float):
                first_ts = ts if first_ts is None or ts < first_ts else first_ts
                last_ts = ts if last_ts is None or ts > last_ts else last_ts
        metrics["duration"].add_values([r[11] for r in rows])
        metrics["ttfe"].add_values([r[12] for r in rows])
    sketch.add(metrics["rate"].counts, rates)
    breakdowns: list[Counter[Any]] = [Counter() for _ in range(6)]
    errors = 0
    for (status, model, backend, code, etype, stop), n in cells.items():
        failed = (status if isinstance(status, int) else 0) >= 400 or etype is not None or code is not None
        errors += n if failed else 0
        klass = "none" if status is None else f"{int(status) // 100}xx"
        for counter, value in zip(
            breakdowns,
            (klass, status, model, backend, (code or etype or f"status {status}") if failed else None, stop),
            strict=True,
        ):
            if value is not None:
                counter[value] += n
    classes, statuses, models, backends, codes, stops = (_ordered(c) for c in breakdowns)
    total = sum(cells.values())
    median = sketch.percentiles(metrics["rate"].counts, [0.5])[0]
    out: dict[str, Any] = {
        "requests": total,
        "completed": total - in_flight,
        "in_flight": in_flight,
        "errors": errors,
        "first_ts": first_ts,
        "last_ts": last_ts,
        "by_status_class": classes,
        "by_status": {str(k): v for k, v in statuses.items()},
        "by_model": models,
        "by_backend": backends,
        "error_codes": codes,
        "stop_reasons": stops,
        "latency_ms": {
            "duration": metrics["duration"].distribution(percentiles),
            "ttfe": metrics["ttfe"].distribution(percentiles),
        },
        "tokens": {
            "input": int(sums["input"]),
            "output": int(sums["output"]),
            "rated_requests": int(sums["rated"]),
            "output_per_s": sums["rated_output"] * 1000.0 / sums["rated_ms"] if sums["rated_ms"] > 0 else None,
            "output_per_s_median": median,
        },
        "cost_usd": spend(sums["cost"], sums["priced"]),
    }
    return out, scanned


def groups(
    run: Run,
    plan: RollupPlan,
    dialect: Dialect = SQLITE,
    *,
    column: str | None,
    every: int | None,
    percentiles: Sequence[float] = PERCENTILES,
) -> tuple[list[dict[str, Any]], int] | None:
    """`journal.groups.compute`'s rows for `plan` grouped by the `requests` column `column`
    and `every` seconds, and how many requests were read from the summary table; None when the
    rollups cannot group so (a column they do not keep, a bucket not a whole number of minutes)."""
    if (column is not None and column not in _GROUPABLE) or (every is not None and every % rollups.MINUTE):
        return None
    # Rows of a grain that divides the bucket width fall each in one bucket.
    grains = [g for g in rollups.GRAINS if every is None or every % g == 0]
    parts = _parts(plan, dialect, grains)
    group = column or _NULL
    # A rollup row's `ts` is a whole minute, an integer: integer division buckets it in both stores.
    rolled_bucket = f"(ts / {int(every)}) * {int(every)}" if every else _NULL
    bucket = dialect.bucket(int(every)) if every else _NULL
    accs: dict[tuple[Any, Any], dict[str, Any]] = {}

    def acc(key: tuple[Any, Any]) -> dict[str, Any]:
        found = accs.get(key)
        if found is None:
            found = accs[key] = {
                "requests": 0,
                "errors": 0,
                "hung_up": 0,
                "tokens_in": 0,
                "tokens_out": 0,
                "cost": 0.0,
                "priced": 0,
                "duration": _Sketch(),
                "ttfe": _Sketch(),
            }
        return found

    if parts.rollup is not None:
        where, params = parts.rollup
        for g, b, failed, hung, n, tin, tout, cost, priced, dn, dmax, tn, tmax in run(
            f"SELECT {group}, {rolled_bucket}, {_FAILED}, hung_up, sum(requests), sum(input_tokens),"
            " sum(output_tokens), sum(cost_usd), sum(priced), sum(duration_n), max(duration_max),"
            f" sum(ttfe_n), max(ttfe_max) FROM {rollups.TABLE} WHERE {where} GROUP BY 1, 2, 3, 4",
            params,
        ):
            if not n:
                continue
            a = acc((g, b))
            a["requests"] += int(n)
            a["errors"] += int(n) if failed else 0
            a["hung_up"] += int(n) if hung else 0
            a["tokens_in"] += int(tin)
            a["tokens_out"] += int(tout)
            a["cost"] += float(cost)
            a["priced"] += int(priced)
            a["duration"].add_sums(dn, 0.0, dmax)
            a["ttfe"].add_sums(tn, 0.0, tmax)
        unused: dict[int, int] = {}  # the output rate: not a column of a grouped row

        def metric_counts(g: Any, b: Any) -> list[dict[int, int]]:
            a = acc((g, b))
            return [a["duration"].counts, a["ttfe"].counts, unused]

        _merge_sketches(run, parts.rollup, group, rolled_bucket, dialect, metric_counts)
    scanned = 0
    for where, params in parts.scans:
        rows = run(
            f"SELECT {group}, {bucket}, {_FAILED}, hung_up, duration_ms, ttfe_ms, input_tokens, output_tokens,"
            f" cost_usd FROM requests WHERE {where}",
            params,
        )
        scanned += len(rows)
        for g, b, failed, hung, dur, ttfe, tin, tout, cost in rows:
            a = acc((g, b))
            a["requests"] += 1
            a["errors"] += 1 if failed else 0
            a["hung_up"] += 1 if hung else 0
            a["tokens_in"] += tin if isinstance(tin, int) else 0
            a["tokens_out"] += tout if isinstance(tout, int) else 0
            if isinstance(cost, int | float):
                a["cost"] += cost
                a["priced"] += 1
            a["duration"].add_values([dur])
            a["ttfe"].add_values([ttfe])
    out = [
        {
            "group": g,
            "bucket": b,
            "requests": a["requests"],
            "errors": a["errors"],
            "error_rate": a["errors"] / a["requests"],
            "hung_up": a["hung_up"],
            "latency_ms": a["duration"].distribution(percentiles, mean=False),
            "ttft_ms": a["ttfe"].distribution(percentiles, mean=False),
            "tokens_in": a["tokens_in"],
            "tokens_out": a["tokens_out"],
            "cost_usd": a["cost"] if a["priced"] else None,
        }
        for (g, b), a in accs.items()
        if a["requests"]
    ]
    out.sort(key=lambda r: (r["bucket"] is None, r["bucket"] or 0, -r["requests"], str(r["group"])))
    return out, scanned


def _ordered(counts: Counter[Any]) -> dict[Any, int]:
    def key(item: tuple[Any, int]) -> tuple[int, int, Any]:
        value = item[0]
        if isinstance(value, int | float):
            return (-item[1], 0, value)
        return (-item[1], 1, value) if isinstance(value, str) else (-item[1], 2, bytes(value))

    return dict(sorted(counts.items(), key=key))
