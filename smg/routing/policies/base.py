"""What every routing policy sees and returns: candidates, the request's routing context, a choice.

A policy is a plain object with no I/O and no background task. It is handed the healthy,
breaker-closed workers of one pool (non-empty, in a stable order) and picks one; whatever it
remembers (counters, prefix trees, hash rings, sticky pins) is kept per model inside it and
dropped per worker through `forget`. Randomness comes from an injected `random.Random` and time
from an injected clock, so a seeded policy replays the same decisions.

`PolicyConfig` is the one typed object holding every knob of every policy, with the reference
gateway's defaults and flag names.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from smg.flags import option


class Candidate(Protocol):
    """A worker as a policy sees it; the registry's worker satisfies this."""

    @property
    def id(self) -> str:
        """Stable worker id."""
        ...

    @property
    def url(self) -> str: ...

    @property
    def load(self) -> int:
        """Requests in flight at the gateway, plus the engine-reported queue when known."""
        ...


C = TypeVar("C", bound=Candidate)

ASSIGNMENT_MODES = ("random", "min_load", "min_group", "delegate")


@dataclass(frozen=True, slots=True)
class RouteContext:
    """The request as the policies route it.

    `text` is `keys.routing_text(request)`; `routing_key` is `keys.routing_key(headers, names)`;
    `affinity_key` is `keys.affinity_key(headers)`, a digest of a stable client header that
    `consistent_hashing` falls back to when there is no routing key.
    """

    model: str
    text: str = ""
    routing_key: str | None = None
    affinity_key: str | None = None
    cost: int = 1  # tokens the request is counted as by the rank policy (`dp_rank.estimated_cost`)


@dataclass(frozen=True, slots=True)
class Choice(Generic[C]):
    """The chosen worker and a short reason for the journal."""

    worker: C
    reason: str


class Policy(Protocol):
    name: str

    def choose(self, candidates: Sequence[C], ctx: RouteContext) -> Choice[C]:
        """Pick one of `candidates` (non-empty, stable order) for the request `ctx`."""
        ...

    def forget(self, worker_id: str) -> None:
        """The worker left the registry: drop whatever is remembered about it."""
        ...


@dataclass(frozen=True)
class PolicyConfig:
    """Every policy knob, with the reference gateway's defaults (its Rust CLI) and flag names.

    cache_aware:
      `cache_threshold` (`--cache-threshold`, alias `--cache-match-threshold`; 0.3): the matched
      share of the routing text above which a worker already holding the prefix is preferred.
      `balance_abs_threshold` (`--balance-abs-threshold`, alias `--spill-abs-threshold`; 64) and
      `balance_rel_threshold` (`--balance-rel-threshold`, alias `--spill-rel-threshold`; 1.5): a
      cache-matched worker whose load exceeds the pool's mean load by more than both margins is
      passed over for the least-loaded one.
      `eviction_interval_secs` (`--eviction-interval`, 120; the Python wrapper's
      `--eviction-interval-secs` defaults to 60): how often the prefix trees are trimmed; 0 never.
      `max_tree_size` (`--max-tree-size`; 2**26): characters each model's tree may hold, summed over
      its workers, after a trim.
    prefix_hash:
      `prefix_token_count` (`--prefix-token-count`; 256): tokens of prefix hashed; untokenized
      text hashes four characters per token.
      `prefix_hash_load_factor` (`--prefix-hash-load-factor`; 1.25) and
      `prefix_hash_balance_abs_threshold` (`--prefix-hash-balance-abs-threshold`; 10): the ring's
      owner is overloaded when its load exceeds the mean (counting the incoming request) by both
      this multiple and this many requests.
    manual:
      `max_idle_secs` (`--max-idle-secs`, alias `--sticky-key-idle-secs`; 14400): a routing key's
      pin is dropped after this long unused, checked every `eviction_interval_secs`.
      `assignment_mode` (`--assignment-mode`; `random` for the manual policy): how a first-seen key
      picks its worker: `random`, `min_load`, `min_group` (fewest pinned keys), or `delegate`
      (which the manual policy treats as `min_load`).
    routing keys:
      `routing_key_headers` (`--routing-key-headers`; `x-smg-routing-key`): the headers read, in
      order, for the routing key (`keys.routing_key`).
    """

    cache_threshold: float = field(
        default=0.3,
        metadata=option(
            "--cache-threshold",
            "cache_aware: the matched share of the prompt above which the worker holding it is preferred.",
            aliases=("--cache-match-threshold",),
        ),
    )
    balance_abs_threshold: int = field(
        default=64,
        metadata=option(
            "--balance-abs-threshold",
            "cache_aware: requests over the mean load past which a matched worker is passed over.",
            aliases=("--spill-abs-threshold",),
        ),
    )
    balance_rel_threshold: float = field(
        default=1.5,
        metadata=option(
            "--balance-rel-threshold",
            "cache_aware: times the mean load past which a matched worker is passed over.",
            aliases=("--spill-rel-threshold",),
        ),
    )
    eviction_interval_secs: float = field(
        default=120.0,
        metadata=option(
            "--eviction-interval-secs",
            "Seconds between trims of the prefix trees and of idle pins; 0 never.",
            aliases=("--eviction-interval",),
        ),
    )
    max_tree_size: int = field(
        default=2**26, metadata=option("--max-tree-size", "cache_aware: characters each model's tree keeps.")
    )
    prefix_token_count: int = field(
        default=256, metadata=option("--prefix-token-count", "prefix_hash: tokens of the prompt hashed.")
    )
    prefix_hash_load_factor: float = field(
        default=1.25,
        metadata=option("--prefix-hash-load-factor", "prefix_hash: times the mean load that overloads an owner."),
    )
    prefix_hash_balance_abs_threshold: int = field(
        default=10,
        metadata=option(
            "--prefix-hash-balance-abs-threshold", "prefix_hash: requests over the mean load that overload an owner."
        ),
    )
    max_idle_secs: float = field(
        default=14400.0,
        metadata=option(
            "--max-idle-secs", "manual: seconds a routing key's pin lasts unused.", aliases=("--sticky-key-idle-secs",)
        ),
    )
    assignment_mode: str = field(
        default="random",
        metadata=option("--assignment-mode", "manual: how a new key picks its worker: random, min_load, min_group."),
    )
    routing_key_headers: tuple[str, ...] = field(
        default=("x-smg-routing-key",),
        metadata=option("--routing-key-headers", "Headers read, in order, for the sticky routing key."),
    )

    def __post_init__(self) -> None:
        # The reference's startup checks. Each condition is false for NaN, so NaN is refused too.
        checks = (
            (0.0 <= self.cache_threshold <= 1.0, "--cache-threshold must be between 0.0 and 1.0"),
            (self.balance_rel_threshold >= 1.0, "--balance-rel-threshold must be at least 1.0"),
            (self.balance_abs_threshold >= 0, "--balance-abs-threshold must not be negative"),
            (self.eviction_interval_secs >= 0, "--eviction-interval must not be negative"),
            (self.max_tree_size > 0, "--max-tree-size must be positive"),
            (self.prefix_token_count > 0, "--prefix-token-count must be positive"),
            (self.prefix_hash_load_factor >= 1.0, "--prefix-hash-load-factor must be at least 1.0"),
            (self.prefix_hash_balance_abs_threshold >= 0, "--prefix-hash-balance-abs-threshold must not be negative"),
            (self.max_idle_secs >= 0, "--max-idle-secs must not be negative"),
            (
                self.assignment_mode in ASSIGNMENT_MODES,
                f"--assignment-mode must be one of {', '.join(ASSIGNMENT_MODES)}",
            ),
        )
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


def least_loaded(candidates: Sequence[C], rng: random.Random) -> C:
    """The candidate with the lowest load; equal loads are broken uniformly at random."""
    best = min(c.load for c in candidates)
    tied = [c for c in candidates if c.load == best]
    return tied[0] if len(tied) == 1 else tied[rng.randrange(len(tied))]


def loads_of(candidates: Sequence[Candidate]) -> str:
    """The pool's loads for a reason string: `3,0,1` in candidate order, or a range for a large pool."""
    loads = [c.load for c in candidates]
    if len(loads) <= 8:
        return ",".join(map(str, loads))
    return f"{min(loads)}..{max(loads)} over {len(loads)}"
