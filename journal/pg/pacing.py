"""The shipper's decisions, apart from its I/O: when to try again, when an incident starts and
ends (one log line each, not one per attempt), and how long it goes on sending at shutdown.

`journal.pg.shipper` feeds it what happened (`failed`, `answered`, `stop`) with the time, and
does what it says; `tests/fleet/test_pacing.py` plays those sequences with no socket.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Pacing:
    """Retry waits double from `first_s` to `max_s` while attempts fail, and start again at
    `first_s` once one succeeds; after `stop`, shipping goes on for `drain_s` at most, and ends
    at the first failure or the first empty queue."""

    first_s: float = 0.5
    max_s: float = 5.0
    drain_s: float = 3.0
    failing_since: float | None = None
    """When the current incident started (None: shipping works)."""
    drain_until: float | None = None
    _retry_s: float = 0.0

    def __post_init__(self) -> None:
        self._retry_s = self.first_s

    def failed(self, now: float) -> tuple[bool, float]:
        """An attempt failed: `(whether an incident starts with it, seconds to wait)`."""
        starts = self.failing_since is None
        if starts:
            self.failing_since = now
        wait = self._retry_s
        self._retry_s = min(self._retry_s * 2, self.max_s)
        return starts, wait

    def answered(self, now: float) -> float | None:
        """An attempt succeeded: how long the incident it ends lasted (None when there was none)."""
        self._retry_s = self.first_s
        if self.failing_since is None:
            return None
        lasted = now - self.failing_since
        self.failing_since = None
        return lasted

    def stop(self, now: float) -> None:
        """Shutdown began: ship what is queued for `drain_s` more."""
        if self.drain_until is None:
            self.drain_until = now + self.drain_s

    @property
    def stopping(self) -> bool:
        return self.drain_until is not None

    def late(self, now: float) -> bool:
        """Past the drain: send no new batch."""
        return self.drain_until is not None and now >= self.drain_until
