"""A pool of workers as the policies see them, and a clock the tests move by hand."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from smg.routing.policies import Policy, RouteContext


@dataclass
class Worker:
    id: str
    url: str
    load: int = 0


def pool(n: int, *loads: int) -> list[Worker]:
    """Workers w0..w{n-1}; `loads` gives the first ones' loads."""
    padded = list(loads) + [0] * (n - len(loads))
    return [Worker(f"w{i}", f"http://10.0.0.{i}:8000", padded[i]) for i in range(n)]


class Clock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def ids(policy: Policy, workers: Sequence[Worker], contexts: Sequence[RouteContext]) -> list[str]:
    """The worker each context is sent to, in order, with loads left as they are."""
    return [policy.choose(workers, ctx).worker.id for ctx in contexts]


def spread(policy: Policy, workers: Sequence[Worker], ctx: RouteContext, times: int) -> Counter[str]:
    """How many of `times` identical requests each worker gets, with loads left as they are."""
    return Counter(policy.choose(workers, ctx).worker.id for _ in range(times))
