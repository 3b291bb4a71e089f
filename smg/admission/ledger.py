"""Where token budgets live: the buckets of every tenant scope, in memory or in a SQLite file.

A bucket holds a scope's tokens and requests for one minute (and dollars, for a model rule
stated in money; without one its dollars are never read): it starts full (the per-minute
values), refills continuously at a sixtieth of them per second, is debited at admission and
trued up when the response ends (which may push the tokens below zero: a debt that the refill
pays back before the next request is admitted). The arithmetic is `refill`/`decide`, pure
functions of the stored state and the time.

`SqliteLedger` keeps the buckets in a file that any number of gateway processes share: each
reservation is one `BEGIN IMMEDIATE` transaction (read, refill, check, debit, commit), so
processes on one host draw from one budget, and a restarted gateway resumes the buckets it
left (time is wall-clock seconds, so the refill over the downtime is counted). It runs on a
thread of its own: a lock held by another process never stalls the event loop.
`MemoryLedger` is the same for one process, forgotten at exit.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from smg.admission.policy import Limits, Scope

_PRUNE_EVERY = 1024  # reservations between sweeps of buckets that are full again


@dataclass
class Bucket:
    tokens: float
    requests: float
    updated: float  # epoch seconds of the last refill
    dollars: float = 0.0  # what is left to spend, when the scope has a money limit


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after: int | None = None  # seconds until it would fit; None: it never fits the scope
    unavailable: bool = False  # the shared budgets could not be read (Redis away, failing closed)


def full(limits: Limits, now: float) -> Bucket:
    return Bucket(
        float(limits.tokens_per_minute), float(limits.requests_per_minute), now, limits.dollars_per_minute or 0.0
    )


def refill(bucket: Bucket, limits: Limits, now: float) -> Bucket:
    elapsed = max(0.0, now - bucket.updated)  # a clock stepping back refills nothing
    tcap, rcap = float(limits.tokens_per_minute), float(limits.requests_per_minute)
    dcap = limits.dollars_per_minute
    return Bucket(
        min(tcap, bucket.tokens + elapsed * tcap / 60.0),
        min(rcap, bucket.requests + elapsed * rcap / 60.0),
        max(now, bucket.updated),
        min(dcap, bucket.dollars + elapsed * dcap / 60.0) if dcap else 0.0,
    )


def decide(bucket: Bucket, limits: Limits, tokens: int, dollars: float = 0.0) -> Decision:
    """Whether `tokens`, `dollars` (when the scope has a money limit) and one request fit in
    the (refilled) bucket, and if not, for how long."""
    dcap = limits.dollars_per_minute
    short_of_money = dcap is not None and bucket.dollars < dollars
    if bucket.tokens >= tokens and bucket.requests >= 1 and not short_of_money:
        return Decision(True)
    if tokens > limits.tokens_per_minute or (dcap is not None and dollars > dcap):
        return Decision(False, None)  # more than the scope ever holds: waiting cannot help
    waits = []
    if bucket.tokens < tokens:
        waits.append((tokens - bucket.tokens) / (limits.tokens_per_minute / 60.0))
    if bucket.requests < 1:
        waits.append((1 - bucket.requests) / (limits.requests_per_minute / 60.0))
    if dcap is not None and short_of_money:
        waits.append((dollars - bucket.dollars) / (dcap / 60.0))
    return Decision(False, max(1, math.ceil(max(waits))))


def debit(bucket: Bucket, tokens: int, dollars: float) -> None:
    """Take an admitted request's reservation out of the bucket."""
    bucket.tokens -= tokens
    bucket.requests -= 1
    bucket.dollars -= dollars


def true_up(bucket: Bucket, limits: Limits, delta: int, dollars: float) -> None:
    """Charge a finished request's use beyond its reservation (negative: give back; never
    above the caps)."""
    bucket.tokens = min(float(limits.tokens_per_minute), bucket.tokens - delta)
    if limits.dollars_per_minute is not None:
        bucket.dollars = min(limits.dollars_per_minute, bucket.dollars - dollars)


def _is_full(bucket: Bucket, limits: Limits, now: float) -> bool:
    again = refill(bucket, limits, now)
    dcap = limits.dollars_per_minute
    return (
        again.tokens >= limits.tokens_per_minute
        and again.requests >= limits.requests_per_minute
        and (dcap is None or again.dollars >= dcap)
    )


def _combine(decisions: Sequence[Decision]) -> Decision:
    denied = [d for d in decisions if not d.allowed]
    if not denied:
        return Decision(True)
    if any(d.retry_after is None for d in denied):
        return Decision(False, None)
    return Decision(False, max(d.retry_after or 0 for d in denied))


class Ledger(Protocol):
    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float, dollars: float = 0.0) -> Decision:
        """Debit `tokens`, one request and (from scopes with a money limit) `dollars` from
        every scope if all of them afford it."""
        ...

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float, dollars: float = 0.0) -> None:
        """Add `delta` tokens and `dollars` of use (negative: give back) to every scope."""
        ...

    def close(self) -> None: ...


class MemoryLedger:
    """The buckets of this process only."""

    def __init__(self) -> None:
        self._buckets: dict[str, tuple[Bucket, Limits]] = {}
        self._count = 0

    def _get(self, scope: Scope, now: float) -> Bucket:
        held = self._buckets.get(scope.key)
        return refill(held[0], scope.limits, now) if held else full(scope.limits, now)

    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float, dollars: float = 0.0) -> Decision:
        buckets = [self._get(s, now) for s in scopes]
        decision = _combine([decide(b, s.limits, tokens, dollars) for b, s in zip(buckets, scopes, strict=True)])
        if decision.allowed:
            for bucket, scope in zip(buckets, scopes, strict=True):
                debit(bucket, tokens, dollars)
                self._buckets[scope.key] = (bucket, scope.limits)
        self._count += 1
        if self._count % _PRUNE_EVERY == 0:
            self._buckets = {k: v for k, v in self._buckets.items() if not _is_full(v[0], v[1], now)}
        return decision

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float, dollars: float = 0.0) -> None:
        for scope in scopes:
            bucket = self._get(scope, now)
            true_up(bucket, scope.limits, delta, dollars)
            self._buckets[scope.key] = (bucket, scope.limits)

    def close(self) -> None:
        self._buckets.clear()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS buckets (
    key        TEXT PRIMARY KEY,
    tokens     REAL NOT NULL,
    requests   REAL NOT NULL,
    updated    REAL NOT NULL,
    token_cap  REAL NOT NULL,
    request_cap REAL NOT NULL,
    dollars    REAL NOT NULL DEFAULT 0,
    dollar_cap REAL
)
"""
# A state file written before budgets in money: its buckets have no money limit.
_MONEY_COLUMNS = (("dollars", "REAL NOT NULL DEFAULT 0"), ("dollar_cap", "REAL"))


class SqliteLedger:
    """The buckets in a SQLite file shared by every gateway process that names it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smg-ratelimit")
        self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        # A commit survives the process (WAL, synchronous=NORMAL): a crash loses no debit.
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(_SCHEMA)
        have = {row[1] for row in self._db.execute("PRAGMA table_info(buckets)")}
        for name, kind in _MONEY_COLUMNS:
            if name not in have:
                self._db.execute(f"ALTER TABLE buckets ADD COLUMN {name} {kind}")
        self._count = 0

    def _load(self, scope: Scope, now: float) -> Bucket:
        row = self._db.execute(
            "SELECT tokens, requests, updated, dollars, dollar_cap FROM buckets WHERE key = ?", (scope.key,)
        ).fetchone()
        if not row:
            return full(scope.limits, now)
        tokens, requests, updated, dollars, dollar_cap = row
        if dollar_cap is None:  # a bucket from before its money limit: none of it spent yet
            dollars = scope.limits.dollars_per_minute or 0.0
        return refill(Bucket(tokens, requests, updated, dollars), scope.limits, now)

    def _store(self, scope: Scope, bucket: Bucket) -> None:
        self._db.execute(
            "INSERT INTO buckets (key, tokens, requests, updated, token_cap, request_cap, dollars, dollar_cap)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(key) DO UPDATE SET tokens = excluded.tokens, requests = excluded.requests,"
            " updated = excluded.updated, token_cap = excluded.token_cap, request_cap = excluded.request_cap,"
            " dollars = excluded.dollars, dollar_cap = excluded.dollar_cap",
            (
                scope.key,
                bucket.tokens,
                bucket.requests,
                bucket.updated,
                scope.limits.tokens_per_minute,
                scope.limits.requests_per_minute,
                bucket.dollars,
                scope.limits.dollars_per_minute,
            ),
        )

    def _reserve(self, scopes: Sequence[Scope], tokens: int, now: float, dollars: float) -> Decision:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            buckets = [self._load(s, now) for s in scopes]
            decision = _combine([decide(b, s.limits, tokens, dollars) for b, s in zip(buckets, scopes, strict=True)])
            if decision.allowed:
                for bucket, scope in zip(buckets, scopes, strict=True):
                    debit(bucket, tokens, dollars)
                    self._store(scope, bucket)
            self._count += 1
            if self._count % _PRUNE_EVERY == 0:
                self._prune(now)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return decision

    def _prune(self, now: float) -> None:
        # A bucket refilled to the brim is the same as no row (a new bucket starts full).
        self._db.execute(
            "DELETE FROM buckets WHERE tokens + (? - updated) * token_cap / 60.0 >= token_cap"
            " AND requests + (? - updated) * request_cap / 60.0 >= request_cap"
            " AND (dollar_cap IS NULL OR dollars + (? - updated) * dollar_cap / 60.0 >= dollar_cap)",
            (now, now, now),
        )

    def _settle(self, scopes: Sequence[Scope], delta: int, now: float, dollars: float) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for scope in scopes:
                bucket = self._load(scope, now)
                true_up(bucket, scope.limits, delta, dollars)
                self._store(scope, bucket)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float, dollars: float = 0.0) -> Decision:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._reserve, scopes, tokens, now, dollars)

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float, dollars: float = 0.0) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._settle, scopes, delta, now, dollars)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._db.close()
