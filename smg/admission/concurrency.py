"""Concurrency admission: at most `--max-concurrent-requests` requests in flight, up to
`--queue-size` more waiting (first come, first served) for at most `--queue-timeout-secs`.

The reference gateway's answers: no free slot and no room to wait → 429 `admission_queue_full`
at once; waited too long → 503 `admission_queue_timeout`; both with `Retry-After: 2`. A slot is
held until the response has been produced to its end (the whole SSE stream) or the client went
away. A freed slot is handed straight to the first waiter, so a newcomer cannot overtake the
queue.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Protocol

from journal.events import Admission, Event
from smg.admission.refusal import Refused
from smg.backends.base import Call
from smg.flags import option

Handler = Callable[[Call], AsyncGenerator[Event, None]]

RETRY_AFTER_SECS = 2


@dataclass(frozen=True)
class ConcurrencyConfig:
    """`--max-concurrent-requests` (-1: no limit), `--queue-size` (0: no queue), `--queue-timeout-secs`."""

    max_concurrent_requests: int = field(
        default=-1,
        metadata=option(
            "--max-concurrent-requests",
            "Requests served at once (Messages and count_tokens; a stream counts until it ends). -1: no limit.",
        ),
    )
    queue_size: int = field(
        default=100, metadata=option("--queue-size", "Requests that may wait for a slot; 0: refuse at once.")
    )
    queue_timeout_secs: float = field(
        default=60.0, metadata=option("--queue-timeout-secs", "Longest wait for a slot (503 after it).")
    )
    fleet: str | None = field(
        default=None,
        metadata=option(
            "--fleet-concurrency",
            "redis://HOST:PORT/DB: count --max-concurrent-requests across every replica naming this server "
            "(slots are leases that expire with their replica, see --fleet-lease-secs).",
        ),
    )

    @property
    def enabled(self) -> bool:
        return self.max_concurrent_requests > 0

    def check(self) -> None:
        """Raises ValueError for settings that cannot work."""
        if self.queue_size < 0:
            raise ValueError("--queue-size must be 0 or more")
        if self.enabled and self.queue_size > 0 and self.queue_timeout_secs <= 0:
            raise ValueError("--queue-timeout-secs must be > 0 when --queue-size > 0")


def _shed(status: int, code: str, message: str) -> Refused:
    return Refused(status, message, code=code, headers={"Retry-After": str(RETRY_AFTER_SECS)})


@dataclass(frozen=True)
class Admitted:
    """A slot was granted after `queued_s` seconds of waiting (0 when one was free)."""

    queued_s: float
    queued: bool
    lease: str | None = None  # a fleet-wide slot's lease (`smg.admission.fleet`); None for a local one


class Limiter:
    """The slots and the queue. `acquire` raises the refusal; `release` frees or hands on."""

    def __init__(self, config: ConcurrencyConfig) -> None:
        self.capacity = config.max_concurrent_requests
        self.queue_size = config.queue_size
        self.timeout = config.queue_timeout_secs
        self.in_use = 0
        self._waiters: deque[asyncio.Future[None]] = deque()

    @property
    def waiting(self) -> int:
        return sum(not w.done() for w in self._waiters)

    async def acquire(self) -> Admitted:
        if self.in_use < self.capacity and not self.waiting:
            self.in_use += 1
            return Admitted(0.0, queued=False)
        if self.queue_size == 0:
            raise _shed(429, "admission_queue_full", "concurrency limit reached and queuing is disabled")
        if self.waiting >= self.queue_size:
            raise _shed(429, "admission_queue_full", "admission queue is at capacity")
        start = time.perf_counter()
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            async with asyncio.timeout(self.timeout):
                await waiter
        except TimeoutError:
            if not (waiter.done() and not waiter.cancelled()):
                raise _shed(503, "admission_queue_timeout", "timed out waiting for an admission slot") from None
            # The slot was handed over just as the wait ran out: it is ours.
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot as the client left: pass it on
            raise
        finally:
            self._forget(waiter)
        return Admitted(time.perf_counter() - start, queued=True)

    def release(self, admitted: Admitted | None = None) -> None:
        """A request ended: its slot goes to the first live waiter, else back to the pool."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot changes hands; in_use stays
                return
        self.in_use -= 1

    def _forget(self, waiter: asyncio.Future[None]) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass


_DECISIONS = {
    "admission_queue_full": "queue_full",
    "admission_queue_timeout": "queue_timeout",
    "shared_state_unavailable": "unavailable",  # --fleet-concurrency with Redis away, failing closed
}


class Slots(Protocol):
    """A concurrency limiter: this process's (`Limiter`) or the fleet's (`FleetLimiter`)."""

    async def acquire(self) -> Admitted: ...

    def release(self, admitted: Admitted | None = None) -> None: ...


def concurrency_layer(limiter: Slots) -> Callable[[Handler], Handler]:
    """Each request holds a slot from before routing until its last event (or its cancellation)."""

    def layer(inner: Handler) -> Handler:
        async def handle(call: Call) -> AsyncGenerator[Event, None]:
            start = time.perf_counter()
            try:
                admitted = await limiter.acquire()
            except Refused as refused:
                yield Admission(
                    gate="concurrency",
                    decision=_DECISIONS.get(refused.code or "", "refused"),
                    queued_ms=round((time.perf_counter() - start) * 1000, 3),
                    tenant=call.tenant,
                )
                raise refused
            try:
                yield Admission(
                    gate="concurrency",
                    decision="admitted",
                    queued_ms=round(admitted.queued_s * 1000, 3),
                    tenant=call.tenant,
                )
                async with aclosing(inner(call)) as events:
                    async for event in events:
                        yield event
            finally:
                limiter.release(admitted)

        return handle

    return layer
