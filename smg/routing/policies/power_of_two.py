"""`power_of_two`: two distinct random candidates, the less loaded one wins (a tie is a coin toss)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, RouteContext


class PowerOfTwoPolicy:
    name = "power_of_two"

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        n = len(candidates)
        if n == 1:
            return Choice(candidates[0], "only worker")
        # An offset from the first pick keeps the second one distinct without a retry loop.
        i = self._rng.randrange(n)
        j = (i + 1 + self._rng.randrange(n - 1)) % n
        a, b = candidates[i], candidates[j]
        if a.load == b.load:
            winner = a if self._rng.random() < 0.5 else b
        else:
            winner = a if a.load < b.load else b
        return Choice(winner, f"lower load of two: {a.load} vs {b.load}")

    def forget(self, worker_id: str) -> None:
        pass
