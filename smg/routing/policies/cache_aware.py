"""`cache_aware` (the default): send a prompt where its prefix was sent before, unless that worker is swamped.

Each model keeps an approximate prefix tree of the routing texts recently sent to each worker.
For a request:

1. The tree is matched against the text. If the matched share is above `cache_threshold`, the
   candidates holding the matched prefix are preferred, the least loaded of them (ties at random).
2. That holder is passed over for the least-loaded candidate when its load exceeds the pool's
   mean load by more than `balance_abs_threshold` requests and by more than
   `balance_rel_threshold` times: a hot prefix then gains a second home instead of queueing behind
   one engine.
3. Below the threshold (or with nobody holding the prefix among the candidates) the request goes
   to the least-loaded candidate, ties broken by fewer requests sent there so far, then by pool
   order.
4. The chosen worker's tree records the text.

There is no pool-wide balance switch: as in the reference, load pressure is judged per request,
on the holder the cache would pick, and a miss always goes by load.

Trees are trimmed to `max_tree_size` characters per model every `eviction_interval_secs`, on the
first request after the interval (measured on the injected clock); least recently used entries go
first.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from smg.routing.policies.base import C, Choice, PolicyConfig, RouteContext, least_loaded, loads_of
from smg.routing.policies.radix import PrefixTree


class CacheAwarePolicy:
    name = "cache_aware"

    def __init__(self, config: PolicyConfig, rng: random.Random, clock: Callable[[], float]) -> None:
        self._config = config
        self._rng = rng
        self._clock = clock
        self._trees: dict[str, PrefixTree] = {}
        self._sent: dict[str, int] = {}  # requests sent to each worker by this policy
        self._next_eviction = clock() + config.eviction_interval_secs

    def tree_sizes(self, model: str) -> dict[str, int]:
        """Characters each worker holds in `model`'s tree."""
        tree = self._trees.get(model)
        return tree.sizes() if tree else {}

    def _maybe_evict(self) -> None:
        if self._config.eviction_interval_secs <= 0:
            return
        now = self._clock()
        if now < self._next_eviction:
            return
        for tree in self._trees.values():
            tree.evict(self._config.max_tree_size)
        self._next_eviction = now + self._config.eviction_interval_secs

    def _pick(self, candidates: Sequence[C], tree: PrefixTree, text: str) -> tuple[C, str]:
        config = self._config
        match = tree.match(text)
        if match.ratio > config.cache_threshold:
            holding = set(match.tenants)
            holders = [c for c in candidates if c.id in holding]
            if not holders:
                # The reference sends this to the pool's first worker without recording it; by load,
                # and recorded, the prefix gets a live home instead of piling onto one worker.
                return self._by_load(candidates, f"cache match {match.ratio:.2f} on no candidate;")
            holder = least_loaded(holders, self._rng)
            mean = sum(c.load for c in candidates) / len(candidates)
            rel, abs_ = config.balance_rel_threshold, config.balance_abs_threshold
            if holder.load > mean * rel and holder.load > mean + abs_:
                why = f"cache match {match.ratio:.2f} on a worker at load {holder.load} (mean {mean:.1f}); spilled to"
                return self._by_load(candidates, why)
            return holder, f"cache match {match.ratio:.2f}"
        return self._by_load(candidates, f"cache miss {match.ratio:.2f},")

    def _by_load(self, candidates: Sequence[C], why: str) -> tuple[C, str]:
        """The least-loaded candidate; equal loads go to the one sent fewer requests, then pool order."""
        index = min(range(len(candidates)), key=lambda i: (candidates[i].load, self._sent.get(candidates[i].id, 0), i))
        worker = candidates[index]
        return worker, f"{why} least load {worker.load} of {loads_of(candidates)}"

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        self._maybe_evict()
        tree = self._trees.get(ctx.model)
        if tree is None:
            tree = self._trees[ctx.model] = PrefixTree()
        worker, reason = self._pick(candidates, tree, ctx.text)
        tree.insert(ctx.text, worker.id)
        self._sent[worker.id] = self._sent.get(worker.id, 0) + 1
        return Choice(worker, reason)

    def forget(self, worker_id: str) -> None:
        for tree in self._trees.values():
            tree.remove(worker_id)
        self._sent.pop(worker_id, None)
