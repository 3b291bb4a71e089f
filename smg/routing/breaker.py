"""A circuit breaker per worker, sans I/O: closed → open after `failure_threshold` failures in a
row (a success resets the count; failures older than the window no longer count), open →
half-open after a cool-down or when a health check brings the worker back, half-open → closed
after enough successes (or open again at the first failure). Half-open lets requests through.
What an answer counts as is `outcome_of_status`. The clock is injected so tests drive it
without sleeping."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from smg.flags import option

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True)
class BreakerConfig:
    """`--cb-failure-threshold`, `--cb-success-threshold`, `--cb-timeout-duration-secs`,
    `--cb-window-duration-secs`, `--disable-circuit-breaker` (the reference's defaults)."""

    enabled: bool = field(
        default=True, metadata=option("--disable-circuit-breaker", "No circuit breakers.", invert=True)
    )
    failure_threshold: int = field(
        default=10, metadata=option("--cb-failure-threshold", "Failures within the window that open a breaker.")
    )
    success_threshold: int = field(
        default=3, metadata=option("--cb-success-threshold", "Successes that close a half-open breaker.")
    )
    timeout_secs: float = field(
        default=60.0, metadata=option("--cb-timeout-duration-secs", "How long a breaker stays open before a probe.")
    )
    window_secs: float = field(
        default=120.0, metadata=option("--cb-window-duration-secs", "Failures older than this no longer count.")
    )


# Statuses that count against a worker; 429 (a worker at capacity) counts neither way.
FAILURE_STATUSES = frozenset({408, 500, 502, 503, 504})
CAPACITY_STATUSES = frozenset({429})


def outcome_of_status(status: int) -> bool | None:
    """True: a success; False: a failure; None: not recorded."""
    if status in CAPACITY_STATUSES:
        return None
    return status not in FAILURE_STATUSES


class CircuitBreaker:
    __slots__ = ("config", "_clock", "_state", "_failures", "_successes", "_opened_at")

    def __init__(self, config: BreakerConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self._clock = clock
        self._state: BreakerState = "closed"
        self._failures: deque[float] = deque()
        self._successes = 0
        self._opened_at = 0.0

    @property
    def state(self) -> BreakerState:
        if self._state == "open" and self._clock() - self._opened_at >= self.config.timeout_secs:
            self._state = "half_open"
            self._successes = 0
        return self._state

    def allows(self) -> bool:
        """Whether a request may go to the worker now."""
        return not self.config.enabled or self.state != "open"

    def record(self, ok: bool) -> None:
        if not self.config.enabled:
            return
        state = self.state
        if ok:
            self._failures.clear()
            if state == "half_open":
                self._successes += 1
                if self._successes >= self.config.success_threshold:
                    self._close()
            return
        now = self._clock()
        if state == "half_open":
            self._open(now)
            return
        self._failures.append(now)
        while self._failures and now - self._failures[0] > self.config.window_secs:
            self._failures.popleft()
        if len(self._failures) >= self.config.failure_threshold:
            self._open(now)

    def readmit(self) -> None:
        """A health check found the worker up again: an open breaker lets requests probe it."""
        if self.config.enabled and self._state == "open":
            self._state = "half_open"
            self._successes = 0

    def _open(self, now: float) -> None:
        self._state = "open"
        self._opened_at = now
        self._failures.clear()
        self._successes = 0

    def _close(self) -> None:
        self._state = "closed"
        self._failures.clear()
        self._successes = 0
