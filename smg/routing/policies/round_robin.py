"""`round_robin`: each model's candidates in turn, one counter per model."""

from __future__ import annotations

from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, RouteContext


class RoundRobinPolicy:
    name = "round_robin"

    def __init__(self) -> None:
        self._counters: dict[str, int] = {}

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        count = self._counters.get(ctx.model, 0)
        self._counters[ctx.model] = count + 1
        index = count % len(candidates)
        return Choice(candidates[index], f"round robin {index + 1} of {len(candidates)}")

    def forget(self, worker_id: str) -> None:
        pass
