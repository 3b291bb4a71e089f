"""`random`: a uniformly random candidate."""

from __future__ import annotations

import random
from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, RouteContext


class RandomPolicy:
    name = "random"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        index = self._rng.randrange(len(candidates))
        return Choice(candidates[index], f"random {index + 1} of {len(candidates)}")

    def forget(self, worker_id: str) -> None:
        pass
