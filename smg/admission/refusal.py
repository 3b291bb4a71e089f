"""The error an admission gate answers with: an `ApiError` the server journals as refused at
admission (a `rejected` event, stage `admission`), whatever stage the request had reached."""

from __future__ import annotations

from dataclasses import dataclass

from smg.protocol.errors import ApiError


@dataclass
class Refused(ApiError):
    """429/503 from a concurrency or tenant-budget gate."""
