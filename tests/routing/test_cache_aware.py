"""cache_aware: prefix affinity, the spill gate, per-model trees, eviction on the clock, forget."""

from __future__ import annotations

import random
from collections import defaultdict

from smg.routing.policies import PolicyConfig, RouteContext, make_policy
from smg.routing.policies.cache_aware import CacheAwarePolicy
from tests.routing._pool import Clock, ids, pool

T1 = "You are a terse assistant. Summarise the following report."
T2 = "Translate into French: the cat sits on the mat."
T3 = "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)"


def _policy(clock: Clock | None = None, config: PolicyConfig = PolicyConfig()) -> CacheAwarePolicy:
    policy = make_policy("cache_aware", config, rng=random.Random(0), clock=clock or Clock())
    assert isinstance(policy, CacheAwarePolicy)
    return policy


def ctx(text: str, model: str = "m") -> RouteContext:
    return RouteContext(model, text)


def test_repeated_prefixes_go_where_they_went_before() -> None:
    policy = _policy()
    workers = pool(3)
    # Misses go to the least loaded, equal loads to the one sent fewest requests, then pool order.
    assert ids(policy, workers, [ctx(T1), ctx(T1), ctx(T2), ctx(T3), ctx(T1 + " It is long."), ctx(T2)]) == [
        "w0",
        "w0",
        "w1",
        "w2",
        "w0",
        "w1",
    ]


def test_reasons_say_hit_or_miss() -> None:
    policy = _policy()
    workers = pool(3, 2, 0, 1)
    assert policy.choose(workers, ctx(T1)).reason == "cache miss 0.00, least load 0 of 2,0,1"
    assert policy.choose(workers, ctx(T1)).reason == "cache match 1.00"


def test_the_threshold_is_exclusive() -> None:
    policy = _policy()
    workers = pool(3)
    policy.choose(workers, ctx("abc"))  # w0 holds "abc"
    # 3 of 10 characters matched is exactly 0.3: not enough.
    assert policy.choose(workers, ctx("abcdefghij")).worker.id == "w1"
    # 3 of 9 is above it, and the best holder is the less loaded of w0 and w1.
    workers[1].load = 1
    assert policy.choose(workers, ctx("abcxyzuvw")).worker.id == "w0"


def test_a_higher_threshold_needs_a_longer_match() -> None:
    policy = _policy(config=PolicyConfig(cache_threshold=0.9))
    workers = pool(2)
    policy.choose(workers, ctx(T1))
    assert policy.choose(workers, ctx(T1[:40] + " Then translate it.")).worker.id == "w1"
    assert policy.choose(workers, ctx(T1)).worker.id == "w0"


def test_imbalance_overrides_the_cache() -> None:
    policy = _policy()
    workers = pool(3)
    policy.choose(workers, ctx(T1))  # w0 holds T1
    # Mean 30: 90 is over 1.5 x 30 but not over 30 + 64, so the cache still wins.
    workers[0].load = 90
    assert policy.choose(workers, ctx(T1)).worker.id == "w0"
    # Mean 33.3: 100 is over both margins; the request spills to the least loaded.
    workers[0].load, workers[2].load = 100, 0
    choice = policy.choose(workers, ctx(T1))
    assert choice.worker.id == "w1"
    assert choice.reason.startswith("cache match 1.00 on a worker at load 100 (mean 33.3); spilled to least load 0")


def test_a_spilled_prefix_gains_a_second_home() -> None:
    policy = _policy()
    workers = pool(3)
    policy.choose(workers, ctx(T1))
    workers[0].load = 100
    assert policy.choose(workers, ctx(T1)).worker.id == "w1"
    # Both hold T1 now: the less loaded holder takes it, and w2 (not a holder) never does.
    workers[0].load, workers[1].load, workers[2].load = 3, 5, 0
    assert policy.choose(workers, ctx(T1)).worker.id == "w0"
    workers[0].load = 6
    assert policy.choose(workers, ctx(T1)).worker.id == "w1"


def test_a_holder_that_is_not_a_candidate_is_passed_over() -> None:
    policy = _policy()
    workers = pool(3)
    policy.choose(workers, ctx(T1))  # w0
    choice = policy.choose(workers[1:], ctx(T1))
    assert choice.worker.id == "w1"
    assert choice.reason == "cache match 1.00 on no candidate; least load 0 of 0,0"


def test_trees_are_per_model() -> None:
    policy = _policy()
    workers = pool(2)
    policy.choose(workers, ctx(T1, "a"))  # w0
    policy.choose(workers, ctx(T1, "b"))  # w1 (w0 was sent more)
    assert policy.choose(workers, ctx(T1, "a")).worker.id == "w0"
    assert policy.choose(workers, ctx(T1, "b")).worker.id == "w1"
    assert policy.tree_sizes("a") == {"w0": len(T1)}
    assert policy.tree_sizes("b") == {"w1": len(T1)}


def test_conversations_stick_and_spread() -> None:
    policy = _policy()
    workers = pool(3)
    rng = random.Random(3)
    systems = [f"System prompt number {i}: you are assistant {i}, be helpful. " * 3 for i in range(6)]
    turns: dict[int, str] = {i: systems[i] for i in range(6)}
    homes: dict[int, set[str]] = defaultdict(set)
    for _ in range(300):
        i = rng.randrange(6)
        turns[i] += f" user says {rng.randrange(1000)}."
        homes[i].add(policy.choose(workers, ctx(turns[i])).worker.id)
    assert all(len(h) == 1 for h in homes.values()), homes
    assert {w for h in homes.values() for w in h} == {"w0", "w1", "w2"}


def test_characters_not_bytes() -> None:
    policy = _policy()
    workers = pool(2)
    policy.choose(workers, ctx("日本語のテキスト"))
    assert policy.tree_sizes("m") == {"w0": 8}
    assert policy.choose(workers, ctx("日本語の別の文")).reason == "cache match 0.57"


def test_eviction_runs_when_the_clock_passes_the_interval() -> None:
    clock = Clock()
    policy = _policy(clock, config=PolicyConfig(max_tree_size=10, eviction_interval_secs=30))
    workers = pool(2)
    a, b = "aaaaaaaaaa", "bbbbbbbbbb"
    assert ids(policy, workers, [ctx(a), ctx(b)]) == ["w0", "w1"]
    clock.advance(29)
    assert policy.choose(workers, ctx(a)).reason == "cache match 1.00"  # a is now the more recent
    assert policy.tree_sizes("m") == {"w0": 10, "w1": 10}
    clock.advance(1)
    # The trim runs first, dropping b (least recently used); the request is then routed on what is left.
    assert policy.choose(workers, ctx(b)).reason.startswith("cache miss 0.00")
    assert policy.tree_sizes("m")["w0"] == 10
    assert policy.choose(workers, ctx(a)).reason == "cache match 1.00"


def test_eviction_waits_a_full_interval_again() -> None:
    clock = Clock()
    policy = _policy(clock, config=PolicyConfig(max_tree_size=4, eviction_interval_secs=30))
    workers = pool(1)
    clock.advance(30)
    policy.choose(workers, ctx("abcdefgh"))  # trimmed an empty tree, then inserted
    clock.advance(29)
    assert policy.choose(workers, ctx("abcdefgh")).reason == "cache match 1.00"
    clock.advance(1)
    assert policy.choose(workers, ctx("abcdefgh")).reason.startswith("cache miss 0.00")


def test_no_eviction_when_the_interval_is_zero() -> None:
    clock = Clock()
    policy = _policy(clock, config=PolicyConfig(max_tree_size=1, eviction_interval_secs=0))
    policy.choose(pool(1), ctx(T1))
    clock.advance(10**6)
    assert policy.choose(pool(1), ctx(T1)).reason == "cache match 1.00"


def test_forget_drops_the_workers_tree() -> None:
    policy = _policy()
    workers = pool(2)
    policy.choose(workers, ctx(T1))  # w0
    policy.choose(workers, ctx(T2))  # w1
    policy.forget("w0")
    assert policy.tree_sizes("m") == {"w1": len(T2)}
    # w0 may come back under the same id: it starts cold, and its old requests no longer count.
    assert policy.choose(workers, ctx(T1)).reason.startswith("cache miss 0.00")
    assert policy.choose(workers, ctx(T2)).worker.id == "w1"


def test_empty_text_routes_by_load() -> None:
    policy = _policy()
    choice = policy.choose(pool(3, 4, 2, 3), ctx(""))
    assert (choice.worker.id, choice.reason) == ("w1", "cache miss 0.00, least load 2 of 4,2,3")
