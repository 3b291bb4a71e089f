"""`prefix_hash`: a hash ring keyed by the prompt's head, a cheap stand-in for `cache_aware`.

The key is the routing key when the request has one, else the first `prefix_token_count * 4`
characters of the routing text (four characters for each token of the reference's token prefix:
the gateway routes on text). The ring's owner of that key takes the request unless it is
overloaded: its load above the pool's mean, counting the incoming request, by both
`prefix_hash_load_factor` times and `prefix_hash_balance_abs_threshold` requests. Then the
least-loaded candidate that is not overloaded takes it, or the owner when all are. A request with
neither key nor text goes to the least-loaded candidate.
"""

from __future__ import annotations

from collections.abc import Sequence

from smg.routing.policies.base import C, Choice, PolicyConfig, RouteContext, loads_of
from smg.routing.policies.ring import HashRing

CHARS_PER_TOKEN = 4


class PrefixHashPolicy:
    name = "prefix_hash"

    def __init__(self, config: PolicyConfig) -> None:
        self._config = config
        self._ring = HashRing()

    def _overloaded(self, load: int, total: int, n: int) -> bool:
        if total == 0:
            return False
        mean = (total + 1) / n
        config = self._config
        return load > max(mean * config.prefix_hash_load_factor, mean + config.prefix_hash_balance_abs_threshold)

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        if ctx.routing_key is not None:
            key, keyed_on = ctx.routing_key, "routing key"
        elif ctx.text:
            key, keyed_on = ctx.text[: self._config.prefix_token_count * CHARS_PER_TOKEN], "prefix"
        else:
            # min() keeps the first of equal loads, as the reference's fallback does.
            worker = min(candidates, key=lambda c: c.load)
            return Choice(worker, f"no prefix: least load {worker.load} of {loads_of(candidates)}")
        owner = self._ring.lookup(key, candidates)
        total, n = sum(c.load for c in candidates), len(candidates)
        if not self._overloaded(owner.load, total, n):
            return Choice(owner, f"hash ring on {keyed_on}")
        fit = [c for c in candidates if not self._overloaded(c.load, total, n)]
        if not fit:
            return Choice(owner, f"hash ring on {keyed_on}; every worker overloaded")
        worker = min(fit, key=lambda c: c.load)
        reason = f"ring owner overloaded at {owner.load}; least load {worker.load} of {loads_of(candidates)}"
        return Choice(worker, reason)

    def forget(self, worker_id: str) -> None:
        self._ring.remove(worker_id)
