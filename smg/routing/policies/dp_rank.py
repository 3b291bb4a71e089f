"""The data-parallel rank policy (`--dp-minimum-tokens-scheduler`, the reference's
`MinimumTokensPolicy`): which rank of the chosen engine serves the request.

Under `--dp-aware` an engine with N ranks is N workers (`url@rank`). The pool's policy picks one
of them as it picks any worker; this policy then re-picks, among the available ranks of that same
engine, the one holding the fewest KV-cache tokens: the engine's last `GetLoads` count for the
rank (`num_used_tokens`) plus what this policy has sent it since, each request adding its
estimated cost. Equal counts go to the lowest rank. The count is the worker's own
(`kv_tokens`), so the next poll replaces what was added, as the reference's load cache is
refreshed by its monitor. A worker that is not a rank, or an engine none of whose ranks has
reported (no `GetLoads`, no poll yet), keeps the pool policy's choice.

The cost is the reference's estimate for a request it has not tokenized: the routing text's
words times 1.3, rounded up, at least 1 token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol, TypeVar

from smg.routing.policies.base import Candidate, Choice


class RankCandidate(Candidate, Protocol):
    """A worker as the rank policy sees it: which rank of its engine it is, and its token count."""

    dp_rank: int | None
    kv_tokens: int | None


R = TypeVar("R", bound=RankCandidate)


def estimated_cost(text: str) -> int:
    """The tokens a request is counted as before the engine reports it."""
    return max(1, math.ceil(len(text.split()) * 1.3))


class MinimumTokensPolicy:
    name = "dp_minimum_tokens"

    def choose_rank(self, choice: Choice[R], candidates: Sequence[R], cost: int) -> Choice[R]:
        """The rank of `choice.worker`'s engine with the fewest tokens, among `candidates`, charged
        `cost` tokens; `choice` itself when there is no rank to choose."""
        chosen = choice.worker
        if chosen.dp_rank is None:
            return choice
        ranks = [c for c in candidates if c.url == chosen.url and c.dp_rank is not None and c.kv_tokens is not None]
        if not ranks:
            return choice
        best = min(ranks, key=lambda c: (c.kv_tokens or 0, c.dp_rank or 0))
        before = best.kv_tokens or 0
        best.kv_tokens = before + cost
        reason = f"{choice.reason}; dp rank {best.dp_rank}: fewest KV tokens ({before}, of {len(ranks)} ranks)"
        return Choice(best, reason)
