"""Where token budgets live: the buckets of every tenant scope, in memory or in a SQLite file.

A bucket holds a scope's tokens and requests for one minute: it starts full (the per-minute
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


@dataclass(frozen=True)
class Decision:
    allowed: bool
    retry_after: int | None = None  # seconds until it would fit; None: it never fits the scope
    unavailable: bool = False  # the shared budgets could not be read (Redis away, failing closed)


def full(limits: Limits, now: float) -> Bucket:
    return Bucket(float(limits.tokens_per_minute), float(limits.requests_per_minute), now)


def refill(bucket: Bucket, limits: Limits, now: float) -> Bucket:
    elapsed = max(0.0, now - bucket.updated)  # a clock stepping back refills nothing
    tcap, rcap = float(limits.tokens_per_minute), float(limits.requests_per_minute)
    return Bucket(
        min(tcap, bucket.tokens + elapsed * tcap / 60.0),
        min(rcap, bucket.requests + elapsed * rcap / 60.0),
        max(now, bucket.updated),
    )


def decide(bucket: Bucket, limits: Limits, tokens: int) -> Decision:
    """Whether `tokens` and one request fit in the (refilled) bucket, and if not, for how long."""
    if bucket.tokens >= tokens and bucket.requests >= 1:
        return Decision(True)
    if tokens > limits.tokens_per_minute:
        return Decision(False, None)  # more than the scope ever holds: waiting cannot help
    waits = []
    if bucket.tokens < tokens:
        waits.append((tokens - bucket.tokens) / (limits.tokens_per_minute / 60.0))
    if bucket.requests < 1:
        waits.append((1 - bucket.requests) / (limits.requests_per_minute / 60.0))
    return Decision(False, max(1, math.ceil(max(waits))))


def _is_full(bucket: Bucket, limits: Limits, now: float) -> bool:
    again = refill(bucket, limits, now)
    return again.tokens >= limits.tokens_per_minute and again.requests >= limits.requests_per_minute


def _combine(decisions: Sequence[Decision]) -> Decision:
    denied = [d for d in decisions if not d.allowed]
    if not denied:
        return Decision(True)
    if any(d.retry_after is None for d in denied):
        return Decision(False, None)
    return Decision(False, max(d.retry_after or 0 for d in denied))


class Ledger(Protocol):
    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float) -> Decision:
        """Debit `tokens` and one request from every scope if all of them afford it."""
        ...

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float) -> None:
        """Add `delta` tokens of use (negative: give back) to every scope."""
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

    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float) -> Decision:
        buckets = [self._get(s, now) for s in scopes]
        decision = _combine([decide(b, s.limits, tokens) for b, s in zip(buckets, scopes, strict=True)])
        if decision.allowed:
            for bucket, scope in zip(buckets, scopes, strict=True):
                bucket.tokens -= tokens
                bucket.requests -= 1
                self._buckets[scope.key] = (bucket, scope.limits)
        self._count += 1
        if self._count % _PRUNE_EVERY == 0:
            self._buckets = {k: v for k, v in self._buckets.items() if not _is_full(v[0], v[1], now)}
        return decision

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float) -> None:
        for scope in scopes:
            bucket = self._get(scope, now)
            bucket.tokens = min(float(scope.limits.tokens_per_minute), bucket.tokens - delta)
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
    request_cap REAL NOT NULL
)
"""


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
        self._count = 0

    def _load(self, scope: Scope, now: float) -> Bucket:
        row = self._db.execute("SELECT tokens, requests, updated FROM buckets WHERE key = ?", (scope.key,)).fetchone()
        return refill(Bucket(*row), scope.limits, now) if row else full(scope.limits, now)

    def _store(self, scope: Scope, bucket: Bucket) -> None:
        self._db.execute(
            "INSERT INTO buckets (key, tokens, requests, updated, token_cap, request_cap) VALUES (?, ?, ?, ?, ?, ?)"
            " ON CONFLICT(key) DO UPDATE SET tokens = excluded.tokens, requests = excluded.requests,"
            " updated = excluded.updated, token_cap = excluded.token_cap, request_cap = excluded.request_cap",
            (
                scope.key,
                bucket.tokens,
                bucket.requests,
                bucket.updated,
                scope.limits.tokens_per_minute,
                scope.limits.requests_per_minute,
            ),
        )

    def _reserve(self, scopes: Sequence[Scope], tokens: int, now: float) -> Decision:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            buckets = [self._load(s, now) for s in scopes]
            decision = _combine([decide(b, s.limits, tokens) for b, s in zip(buckets, scopes, strict=True)])
            if decision.allowed:
                for bucket, scope in zip(buckets, scopes, strict=True):
                    bucket.tokens -= tokens
                    bucket.requests -= 1
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
            " AND requests + (? - updated) * request_cap / 60.0 >= request_cap",
            (now, now),
        )

    def _settle(self, scopes: Sequence[Scope], delta: int, now: float) -> None:
        self._db.execute("BEGIN IMMEDIATE")
        try:
            for scope in scopes:
                bucket = self._load(scope, now)
                bucket.tokens = min(float(scope.limits.tokens_per_minute), bucket.tokens - delta)
                self._store(scope, bucket)
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    async def reserve(self, scopes: Sequence[Scope], tokens: int, now: float) -> Decision:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._reserve, scopes, tokens, now)

    async def settle(self, scopes: Sequence[Scope], delta: int, now: float) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self._settle, scopes, delta, now)

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._db.close()
