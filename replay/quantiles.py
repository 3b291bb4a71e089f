"""Percentiles of a stream of durations in bounded memory, for replays of whole queries.

A batch replay of a million requests keeps four distributions (latency and time to first
token, recorded and replayed); holding every value would grow with the query. `Quantiles`
keeps the first `exact_up_to` values as they are (small runs report exact nearest-rank
percentiles, as `journal.stats` does), then folds them into logarithmic buckets 1% wide: the
memory is then a few hundred counters whatever the count, and a percentile is the midpoint of
its bucket, within 0.5% of the true value.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from journal.stats import percentile_label, rank

PERCENTILES = (0.5, 0.9, 0.99)
_GROWTH = math.log(1.01)
_FLOOR = 0.001  # ms: below it every value shares one bucket


class Quantiles:
    """Count, max and percentiles of the values `add`ed (milliseconds, never negative)."""

    def __init__(self, exact_up_to: int = 10_000) -> None:
        self._exact_up_to = exact_up_to
        self._values: list[float] | None = []
        self._buckets: Counter[int] = Counter()
        self.count = 0
        self.max: float | None = None

    def add(self, value: float) -> None:
        self.count += 1
        self.max = value if self.max is None else max(self.max, value)
        if self._values is not None:
            self._values.append(value)
            if len(self._values) <= self._exact_up_to:
                return
            values, self._values = self._values, None
            for v in values:
                self._buckets[_bucket(v)] += 1
            return
        self._buckets[_bucket(value)] += 1

    def percentile(self, p: float) -> float | None:
        if not self.count:
            return None
        target = rank(p, self.count)
        if self._values is not None:
            return sorted(self._values)[target]
        seen = 0
        for key in sorted(self._buckets):
            seen += self._buckets[key]
            if seen > target:
                return _middle(key)
        return self.max

    def summary(self, percentiles: tuple[float, ...] = PERCENTILES) -> dict[str, Any]:
        """`{"count", "p50", "p90", "p99", "max"}` (None for the values of an empty one)."""
        out: dict[str, Any] = {"count": self.count}
        ordered = sorted(self._values) if self._values is not None else None
        for p in percentiles:
            if ordered is not None:
                value = ordered[rank(p, len(ordered))] if ordered else None
            else:
                value = self.percentile(p)
            out[percentile_label(p)] = None if value is None else round(value, 3)
        out["max"] = None if self.max is None else round(self.max, 3)
        return out


def _bucket(value: float) -> int:
    return math.floor(math.log(max(value, _FLOOR) / _FLOOR) / _GROWTH)


def _middle(key: int) -> float:
    return _FLOOR * math.exp((key + 0.5) * _GROWTH)
