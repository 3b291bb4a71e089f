"""A latency sketch that merges by addition: counts per fixed log-scale bucket.

A positive value `v` falls in bucket `floor(log2(v) * 16)`; zero and negative values in
`ZERO`. Every bucket spans a factor of 2^(1/16) (about 4.4 %), and it is read back as its
geometric middle, so a value read from the sketch is within `RELATIVE_ERROR` (2.2 %) of one of
the values that fell in its bucket. The buckets are the same everywhere (no parameters, no
resizing), so the sketch of a union is the bucket-wise sum of the sketches: that is what lets
the rollups (`journal.rollups`) keep one per minute and group and answer any range by adding.

The bucket is computed by Python (`bucket`: the rollups' fold and the requests a rollup query
reads from the summary table) and by SQL (`bucket_sql`) with the same C `log2`.

A rollup row keeps each sketch as one value (`encode`): the counts of its run of buckets, so a
read over any range adds one value per row (`merge`, `merge_all`) and a write adds two
(`add_encoded`, the SQL function the rollups' upsert calls).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Sequence
from typing import Any

PER_OCTAVE = 16
ZERO = -(1 << 20)
"""The bucket of zero and negative values (read back as 0)."""
RELATIVE_ERROR = 2 ** (1 / (2 * PER_OCTAVE)) - 1
"""The most a value read from the sketch differs from a value in its bucket, relatively."""


def bucket_sql(value: str) -> str:
    """SQL for the bucket of the numeric expression `value` (NULL when it is not a number)."""
    return (
        f"CASE WHEN typeof({value}) NOT IN ('integer', 'real') THEN NULL WHEN {value} > 0"
        f" THEN CAST(floor(log2({value}) * {PER_OCTAVE}) AS INTEGER) ELSE {ZERO} END"
    )


def bucket(value: float) -> int:
    """The bucket of a number (`bucket_sql` in Python)."""
    return math.floor(math.log2(value) * PER_OCTAVE) if value > 0 else ZERO


def value(index: int) -> float:
    """The value a bucket is read back as: its geometric middle (0 for `ZERO`)."""
    return 0.0 if index == ZERO else float(2 ** ((index + 0.5) / PER_OCTAVE))


def add(counts: dict[int, int], values: Iterable[Any]) -> None:
    """Count each number of `values` in its bucket (None and non-numbers are skipped)."""
    for v in values:
        if isinstance(v, int | float) and not isinstance(v, bool):
            b = bucket(v)
            counts[b] = counts.get(b, 0) + 1


def percentiles(counts: dict[int, int], ps: Sequence[float], top: float | None = None) -> list[float | None]:
    """The nearest-rank percentiles `ps` read from bucket `counts`: the value of the bucket
    that holds the p-th value. `top`, the exact maximum when known, bounds what is read."""
    n = sum(counts.values())
    if n <= 0:
        return [None for _ in ps]
    ordered = sorted((b, c) for b, c in counts.items() if c > 0)
    out: list[float | None] = []
    for p in ps:
        rank = min(n, max(1, math.ceil(p * n)))
        seen = 0
        for b, c in ordered:
            seen += c
            if seen >= rank:
                v = value(b)
                out.append(min(v, top) if top is not None else v)
                break
    return out


_HEAD = struct.Struct("<Biq")  # width of a count (4 or 8 bytes), first bucket, count of ZERO
_WIDTH = {4: "i", 8: "q"}
_INT32 = 1 << 31


def encode(counts: dict[int, int]) -> bytes | None:
    """The stored form of bucket `counts` (None when every count is zero): a head (the width
    of a count, the first bucket of the run, the count of `ZERO`), then the count of every
    bucket from the first to the last that holds one, as 32-bit integers (64 when one needs it)."""
    zero = counts.get(ZERO, 0)
    held = {b: c for b, c in counts.items() if c and b != ZERO}
    if not held and not zero:
        return None
    lo, hi = (min(held), max(held)) if held else (0, -1)
    run = [0] * (hi - lo + 1)
    for b, c in held.items():
        run[b - lo] = c
    width = 4 if not held or (-_INT32 <= min(held.values()) and max(held.values()) < _INT32) else 8
    return _HEAD.pack(width, lo, zero) + struct.pack(f"<{len(run)}{_WIDTH[width]}", *run)


def merge(counts: dict[int, int], stored: bytes | None) -> None:
    """Add a stored sketch (`encode`) into `counts`."""
    if not stored:
        return
    width, lo, zero = _HEAD.unpack_from(stored)
    if zero:
        counts[ZERO] = counts.get(ZERO, 0) + zero
    for b, c in enumerate(
        struct.unpack_from(f"<{(len(stored) - _HEAD.size) // width}{_WIDTH[width]}", stored, _HEAD.size), lo
    ):
        if c:
            counts[b] = counts.get(b, 0) + c


_VECTOR_FROM = 1 << 15  # stored bytes from which `merge_all` adds with numpy


def merge_all(counts: dict[int, int], stored: Iterable[bytes | None]) -> None:
    """Add many stored sketches into `counts`: a range's rollup rows. Past a few thousand
    buckets in all they are added as vectors (numpy, imported then), not bucket by bucket."""
    values = [v for v in stored if v]
    if sum(map(len, values)) < _VECTOR_FROM:
        for value in values:
            merge(counts, value)
        return
    import numpy as np

    runs: dict[int, tuple[list[bytes], list[int], list[int]]] = {4: ([], [], []), 8: ([], [], [])}
    head = _HEAD.size
    for value in values:
        width, lo, zero = _HEAD.unpack_from(value)
        if zero:
            counts[ZERO] = counts.get(ZERO, 0) + zero
        payloads, firsts, lengths = runs[width]
        payloads.append(value[head:])
        firsts.append(lo)
        lengths.append((len(value) - head) // width)
    for width, (payloads, firsts, lengths) in runs.items():
        if not payloads:
            continue
        n = np.frombuffer(b"".join(payloads), dtype=f"<i{width}")
        sizes = np.asarray(lengths)
        starts = np.cumsum(sizes) - sizes
        # Each count's bucket: its run's first bucket plus its place in the run.
        buckets = np.arange(len(n)) + np.repeat(np.asarray(firsts) - starts, sizes)
        low = int(buckets.min())
        sums = np.bincount(buckets - low, weights=n)  # float64: exact below 2**53 requests
        for offset in np.flatnonzero(sums).tolist():
            counts[low + offset] = counts.get(low + offset, 0) + round(float(sums[offset]))


def add_encoded(a: bytes | None, b: bytes | None) -> bytes | None:
    """The stored sketch of the union of two stored sketches (buckets that reach zero dropped)."""
    if not a or not b:
        return (a or b) or None
    counts: dict[int, int] = {}
    merge(counts, a)
    merge(counts, b)
    return encode(counts)
