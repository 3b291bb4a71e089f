"""A consistent-hash ring over worker ids, shared by `consistent_hashing` and `prefix_hash`.

Each worker sits at 150 virtual positions, `hash(f"{id}#{n}")`; a key hashes to a position and
walks clockwise to the first worker among the request's candidates. A worker that is down is
skipped without moving anyone else's keys, and adding or removing one worker moves only the keys
in the arcs it takes or frees, about 1/n of them. Positions are the first 8 bytes of BLAKE2b,
stable across processes and Python versions.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Sequence
from typing import TypeVar

from smg.routing.policies.base import Candidate

VIRTUAL_NODES = 150

C = TypeVar("C", bound=Candidate)


def position(key: str) -> int:
    """A ring position for `key` (lone surrogates, which JSON text may carry, hash as they are)."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


class HashRing:
    def __init__(self) -> None:
        # Sorted (position, id); the id breaks a position collision between two workers the same
        # way in every process.
        self._entries: list[tuple[int, str]] = []
        self._positions: list[int] = []
        self._members: set[str] = set()

    def __contains__(self, worker_id: str) -> bool:
        return worker_id in self._members

    def __len__(self) -> int:
        return len(self._members)

    def add(self, worker_id: str) -> None:
        if worker_id in self._members:
            return
        self._members.add(worker_id)
        self._entries.extend((position(f"{worker_id}#{n}"), worker_id) for n in range(VIRTUAL_NODES))
        self._entries.sort()
        self._positions = [pos for pos, _ in self._entries]

    def remove(self, worker_id: str) -> None:
        if worker_id not in self._members:
            return
        self._members.discard(worker_id)
        self._entries = [entry for entry in self._entries if entry[1] != worker_id]
        self._positions = [pos for pos, _ in self._entries]

    def lookup(self, key: str, candidates: Sequence[C]) -> C:
        """The first candidate clockwise from `key`'s position; candidates join the ring first."""
        by_id = {c.id: c for c in candidates}
        for worker_id in by_id:
            self.add(worker_id)
        start = bisect.bisect_left(self._positions, position(key))
        total = len(self._entries)
        for step in range(total):
            found = by_id.get(self._entries[(start + step) % total][1])
            if found is not None:
                return found
        raise AssertionError("every candidate is on the ring")
