"""When the router tries another worker, and how long it waits first.

Only before any byte reached the client, and only for outcomes that another worker may well
not repeat: a worker that could not be reached or dropped the connection, one the engine
reports unavailable, and the statuses the reference gateway retries (408, 429, 502, 503, 504 —
not a worker's own 500, which it answers at once). Each retry waits
`initial × multiplier^(n-1)` ms, capped, with jitter. As in the reference,
`--retry-max-retries` counts every attempt, the first included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from smg.backends.base import FailureKind
from smg.flags import option

RETRYABLE_STATUSES = frozenset({408, 429, 502, 503, 504})
# A timed-out request may still be running on the worker: sending it again doubles the work
# and multiplies the client's wait by the attempt count, so a timeout is answered, not retried.
RETRYABLE_FAILURES: frozenset[FailureKind] = frozenset({"refused", "connect", "transport", "unavailable"})


@dataclass(frozen=True)
class RetryConfig:
    """`--retry-max-retries`, `--retry-initial-backoff-ms`, `--retry-max-backoff-ms`,
    `--retry-backoff-multiplier`, `--retry-jitter-factor`; `--disable-retries` is `max_retries=0`."""

    enabled: bool = field(default=True, metadata=option("--disable-retries", "Never retry upstream.", invert=True))
    max_retries: int = field(
        default=5, metadata=option("--retry-max-retries", "Attempts per request, the first included.")
    )
    initial_backoff_ms: int = field(default=50, metadata=option("--retry-initial-backoff-ms", "First retry's wait."))
    max_backoff_ms: int = field(default=30_000, metadata=option("--retry-max-backoff-ms", "Longest wait."))
    backoff_multiplier: float = field(
        default=1.5, metadata=option("--retry-backoff-multiplier", "Each wait is this many times the last.")
    )
    jitter_factor: float = field(default=0.2, metadata=option("--retry-jitter-factor", "Random share of each wait."))

    @property
    def max_attempts(self) -> int:
        return max(1, self.max_retries) if self.enabled else 1

    def backoff_seconds(self, retry: int, rng: random.Random | None = None) -> float:
        """The wait before retry number `retry` (1 for the first retry)."""
        base = min(self.initial_backoff_ms * self.backoff_multiplier ** (retry - 1), self.max_backoff_ms)
        jitter = base * self.jitter_factor * (2 * (rng or random).random() - 1)
        return max(0.0, base + jitter) / 1000.0
