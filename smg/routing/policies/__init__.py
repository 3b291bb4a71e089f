"""The routing policies: which worker of a pool takes a request. `make_policy` builds one by name."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

from smg.routing.policies.base import Candidate, Choice, Policy, PolicyConfig, RouteContext
from smg.routing.policies.cache_aware import CacheAwarePolicy
from smg.routing.policies.consistent_hashing import ConsistentHashingPolicy
from smg.routing.policies.dp_rank import MinimumTokensPolicy, estimated_cost
from smg.routing.policies.keys import affinity_key, rid_key, routing_key, routing_text, strip_lineage
from smg.routing.policies.least_load import LeastLoadPolicy
from smg.routing.policies.manual import ManualPolicy
from smg.routing.policies.passthrough import PassthroughPolicy
from smg.routing.policies.power_of_two import PowerOfTwoPolicy
from smg.routing.policies.prefix_hash import PrefixHashPolicy
from smg.routing.policies.random_choice import RandomPolicy
from smg.routing.policies.round_robin import RoundRobinPolicy

__all__ = [
    "NEEDS_TEXT",
    "POLICY_NAMES",
    "Candidate",
    "Choice",
    "MinimumTokensPolicy",
    "Policy",
    "PolicyConfig",
    "RouteContext",
    "affinity_key",
    "estimated_cost",
    "make_policy",
    "rid_key",
    "routing_key",
    "routing_text",
    "strip_lineage",
]

# The reference's `--policy` choices that are built here (it also has `bucket`, a PD prefill policy).
POLICY_NAMES: tuple[str, ...] = (
    "cache_aware",
    "round_robin",
    "random",
    "power_of_two",
    "least_load",
    "consistent_hashing",
    "prefix_hash",
    "passthrough",
    "manual",
)

# Policies that must see the routing text to decide, so a request body cannot be streamed past
# them unread. prefix_hash uses the text when it has it and otherwise routes by load, as in the
# reference, which counts only cache_aware (and its unbuilt `bucket`) here.
NEEDS_TEXT: frozenset[str] = frozenset({"cache_aware"})


def make_policy(
    name: str,
    config: PolicyConfig = PolicyConfig(),
    *,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Policy:
    """A new policy called `name` (one of `POLICY_NAMES`), with its own state."""
    rng = rng if rng is not None else random.Random()
    if name == "cache_aware":
        return CacheAwarePolicy(config, rng, clock)
    if name == "round_robin":
        return RoundRobinPolicy()
    if name == "random":
        return RandomPolicy(rng)
    if name == "power_of_two":
        return PowerOfTwoPolicy(rng)
    if name == "least_load":
        return LeastLoadPolicy(rng)
    if name == "consistent_hashing":
        return ConsistentHashingPolicy(rng)
    if name == "prefix_hash":
        return PrefixHashPolicy(config)
    if name == "passthrough":
        return PassthroughPolicy()
    if name == "manual":
        return ManualPolicy(config, rng, clock)
    raise ValueError(f"unknown routing policy {name!r} (one of {', '.join(POLICY_NAMES)})")
