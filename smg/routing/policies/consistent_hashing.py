"""`consistent_hashing`: the same key to the same worker, for session affinity.

The key is the request's routing key; without one, a digest of a stable client header
(authorization, x-forwarded-for, cookie: `RouteContext.affinity_key`); a truly anonymous request
goes to a random candidate. Workers sit on a hash ring (see `ring`), so a worker going down moves
only its own keys, and one joining takes about 1/n of them.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, RouteContext
from smg.routing.policies.ring import HashRing


class ConsistentHashingPolicy:
    name = "consistent_hashing"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._ring = HashRing()

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        if ctx.routing_key is not None:
            return Choice(self._ring.lookup(ctx.routing_key, candidates), "hash ring on routing key")
        if ctx.affinity_key is not None:
            return Choice(self._ring.lookup(ctx.affinity_key, candidates), "hash ring on client identity")
        index = self._rng.randrange(len(candidates))
        return Choice(candidates[index], f"no key: random {index + 1} of {len(candidates)}")

    def forget(self, worker_id: str) -> None:
        self._ring.remove(worker_id)
