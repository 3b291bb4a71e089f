"""The error an admission gate answers with: an `ApiError` the server journals as refused at
admission (a `rejected` event, stage `admission`), whatever stage the request had reached."""

from __future__ import annotations

from dataclasses import dataclass

from smg.protocol.errors import ApiError


@dataclass
class Refused(ApiError):
    """429/503 from a concurrency or tenant-budget gate."""


SHARED_STATE_RETRY_AFTER_SECS = 2


def shared_state_unavailable(what: str) -> Refused:
    """503 `shared_state_unavailable`: a gate's shared state (Redis) is unreachable and the
    gateway fails closed (`--redis-failure-mode closed`)."""
    return Refused(
        503,
        f"Service temporarily unavailable: {what}",
        code="shared_state_unavailable",
        headers={"Retry-After": str(SHARED_STATE_RETRY_AFTER_SECS)},
    )
