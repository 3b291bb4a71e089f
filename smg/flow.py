"""A request's event stream: stamps each event with its time and sequence number and hands it
to the journal. The HTTP response is built from the same events (see `smg.projection`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from journal.events import Event


class EventSink(Protocol):
    async def append(self, request_id: str, seq: int, event: Event) -> None: ...


class Flow:
    """One request's events, in order. `emit` never waits for disk: the journal queues.

    A sink with an `offer` method (the journal writer's) takes an event without a coroutine of
    its own when its queue has room: `emit` runs for every token, twice."""

    __slots__ = ("request_id", "_sink", "_offer", "_t0", "_seq", "kinds_seen")

    def __init__(self, request_id: str, sink: EventSink, t0: float | None = None) -> None:
        self.request_id = request_id
        self._sink = sink
        self._offer: Callable[[str, int, Event], bool] | None = getattr(sink, "offer", None)
        self._t0 = time.perf_counter() if t0 is None else t0
        self._seq = 0
        self.kinds_seen: set[str] = set()

    def elapsed(self) -> float:
        return time.perf_counter() - self._t0

    async def emit(self, event: Event) -> Event:
        event.t = time.perf_counter() - self._t0
        self._seq += 1
        self.kinds_seen.add(event.kind)
        offer = self._offer
        if offer is None or not offer(self.request_id, self._seq, event):
            await self._sink.append(self.request_id, self._seq, event)
        return event
