"""`manual`: a routing key stays on the worker it was first given (sticky sessions by header).

A first-seen key (per model) is assigned by `assignment_mode` and pinned; later requests with the
key go to the pinned worker while it is a candidate. When it is not (down, breaker open, removed),
the key is reassigned and the new worker is remembered next to the old one (two at most), so the
key returns to its original worker when that one is back. A pin unused for `max_idle_secs` is
dropped, checked every `eviction_interval_secs` on the injected clock. A request without a key
is assigned as a first-seen key would be, and nothing is pinned.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from smg.routing.policies.base import C, Choice, PolicyConfig, RouteContext, least_loaded

_MAX_PINNED = 2


@dataclass
class _Pin:
    workers: list[str]  # first is the original assignment
    last_used: float


class ManualPolicy:
    name = "manual"

    def __init__(self, config: PolicyConfig, rng: random.Random, clock: Callable[[], float]) -> None:
        self._config = config
        self._rng = rng
        self._clock = clock
        self._pins: dict[tuple[str, str], _Pin] = {}
        self._keys_per_worker: dict[str, int] = {}
        self._next_eviction = clock() + config.eviction_interval_secs

    def pinned(self, model: str, key: str) -> tuple[str, ...]:
        """The worker ids a key is pinned to, original first."""
        pin = self._pins.get((model, key))
        return tuple(pin.workers) if pin else ()

    def _maybe_evict(self, now: float) -> None:
        config = self._config
        if config.eviction_interval_secs <= 0 or config.max_idle_secs <= 0 or now < self._next_eviction:
            return
        for key in [k for k, pin in self._pins.items() if now - pin.last_used >= config.max_idle_secs]:
            self._set(key, None, now)
        self._next_eviction = now + config.eviction_interval_secs

    def _set(self, key: tuple[str, str], workers: list[str] | None, now: float) -> None:
        old = self._pins.pop(key, None)
        for worker_id in old.workers if old else ():
            self._keys_per_worker[worker_id] -= 1
        if workers:
            self._pins[key] = _Pin(workers, now)
            for worker_id in workers:
                self._keys_per_worker[worker_id] = self._keys_per_worker.get(worker_id, 0) + 1

    def _assign(self, candidates: Sequence[C]) -> C:
        mode = self._config.assignment_mode
        if mode == "random":
            return candidates[self._rng.randrange(len(candidates))]
        if mode == "min_group":
            fewest = min(self._keys_per_worker.get(c.id, 0) for c in candidates)
            tied = [c for c in candidates if self._keys_per_worker.get(c.id, 0) == fewest]
            return tied[self._rng.randrange(len(tied))]
        return least_loaded(candidates, self._rng)  # min_load, and delegate (nothing to delegate to here)

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        now = self._clock()
        self._maybe_evict(now)
        mode = self._config.assignment_mode
        if ctx.routing_key is None:
            return Choice(self._assign(candidates), f"no routing key: {mode}")
        key = (ctx.model, ctx.routing_key)
        pin = self._pins.get(key)
        if pin is None:
            worker = self._assign(candidates)
            self._set(key, [worker.id], now)
            return Choice(worker, f"new routing key: {mode}")
        pin.last_used = now
        by_id = {c.id: c for c in candidates}
        for worker_id in pin.workers:
            if worker_id in by_id:
                return Choice(by_id[worker_id], "pinned routing key")
        worker = self._assign(candidates)
        self._set(key, [*pin.workers[1 - _MAX_PINNED :], worker.id], now)
        return Choice(worker, f"pinned worker unavailable: {mode}")

    def forget(self, worker_id: str) -> None:
        for key, pin in list(self._pins.items()):
            if worker_id in pin.workers:
                self._set(key, [w for w in pin.workers if w != worker_id], pin.last_used)
        self._keys_per_worker.pop(worker_id, None)
