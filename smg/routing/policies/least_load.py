"""`least_load`: the candidate with the fewest requests in flight (join the shortest queue).

`load` counts what the gateway has in flight plus the engine's reported queue when known, so a
worker holding a long stream stays busy in the count for as long as the stream lasts. Equal loads
are broken uniformly at random: breaking them by position would herd every idle-pool request onto
the first worker.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, RouteContext, least_loaded, loads_of


class LeastLoadPolicy:
    name = "least_load"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        worker = least_loaded(candidates, self._rng)
        return Choice(worker, f"least load {worker.load} of {loads_of(candidates)}")

    def forget(self, worker_id: str) -> None:
        pass
