"""`passthrough`: the first candidate, for a gateway in front of a single worker.

Neither load- nor cache-aware by design; with more than one worker only the first healthy one in
the pool's order gets traffic, which is logged once.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, RouteContext

log = logging.getLogger("smg.routing")


class PassthroughPolicy:
    name = "passthrough"

    def __init__(self) -> None:
        self._warned = False

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        if len(candidates) > 1 and not self._warned:
            self._warned = True
            log.warning(
                "the passthrough policy is meant for one worker but %d are available; only the first gets traffic",
                len(candidates),
            )
        return Choice(candidates[0], "passthrough: first worker")

    def forget(self, worker_id: str) -> None:
        pass
