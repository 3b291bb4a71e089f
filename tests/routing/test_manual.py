"""manual: routing keys pinned to workers, re-pinned when theirs is gone, dropped when idle."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from smg.routing.policies import PolicyConfig, RouteContext, make_policy
from smg.routing.policies.manual import ManualPolicy
from tests.routing._pool import Clock, pool


def _policy(clock: Clock | None = None, config: PolicyConfig = PolicyConfig()) -> ManualPolicy:
    policy = make_policy("manual", config, rng=random.Random(0), clock=clock or Clock())
    assert isinstance(policy, ManualPolicy)
    return policy


def keyed(key: str, model: str = "m") -> RouteContext:
    return RouteContext(model, "text", routing_key=key)


def test_a_key_stays_on_its_first_worker() -> None:
    policy = _policy()
    workers = pool(4)
    first = policy.choose(workers, keyed("conv-1"))
    assert first.reason == "new routing key: random"
    for load in range(5):
        first.worker.load = load * 10
        choice = policy.choose(workers, keyed("conv-1"))
        assert (choice.worker, choice.reason) == (first.worker, "pinned routing key")
    assert policy.pinned("m", "conv-1") == (first.worker.id,)


def test_new_keys_spread_at_random() -> None:
    policy = _policy()
    counts = Counter(policy.choose(pool(4), keyed(f"k{i}")).worker.id for i in range(2000))
    assert all(400 <= n <= 600 for n in counts.values()), counts


def test_keys_are_per_model() -> None:
    policy = _policy()
    workers = pool(8)
    a = {policy.choose(workers, keyed("same", "a")).worker.id for _ in range(5)}
    b = {policy.choose(workers, keyed("same", "b")).worker.id for _ in range(5)}
    assert len(a) == len(b) == 1
    assert policy.pinned("a", "same") == tuple(a) and policy.pinned("b", "same") == tuple(b)


def test_a_key_whose_worker_is_down_moves_and_comes_back() -> None:
    policy = _policy(config=PolicyConfig(assignment_mode="min_load"))
    workers = pool(3, 0, 1, 2)
    assert policy.choose(workers, keyed("k")).worker.id == "w0"
    choice = policy.choose(workers[1:], keyed("k"))
    assert (choice.worker.id, choice.reason) == ("w1", "pinned worker unavailable: min_load")
    assert policy.pinned("m", "k") == ("w0", "w1")
    assert policy.choose(workers[1:], keyed("k")).worker.id == "w1"
    assert policy.choose(workers, keyed("k")).worker.id == "w0"
    # A third home pushes out the oldest.
    assert policy.choose(workers[2:], keyed("k")).worker.id == "w2"
    assert policy.pinned("m", "k") == ("w1", "w2")


def test_requests_without_a_key_are_not_pinned() -> None:
    policy = _policy(config=PolicyConfig(assignment_mode="min_load"))
    choice = policy.choose(pool(3, 2, 0, 1), RouteContext("m", "text"))
    assert (choice.worker.id, choice.reason) == ("w1", "no routing key: min_load")


def test_min_group_spreads_keys_not_load() -> None:
    policy = _policy(config=PolicyConfig(assignment_mode="min_group"))
    workers = pool(3, 50, 0, 0)
    homes = Counter(policy.choose(workers, keyed(f"k{i}")).worker.id for i in range(30))
    assert homes == {"w0": 10, "w1": 10, "w2": 10}


def test_an_idle_pin_is_dropped_on_the_eviction_schedule() -> None:
    clock = Clock()
    policy = _policy(clock, PolicyConfig(max_idle_secs=100, eviction_interval_secs=60))
    workers = pool(2)
    policy.choose(workers, keyed("old"))
    clock.advance(50)
    policy.choose(workers, keyed("fresh"))
    clock.advance(10)  # first sweep at 60 s: "old" idle 60 s, kept
    policy.choose(workers, keyed("other"))
    assert policy.pinned("m", "old")
    clock.advance(60)  # second sweep at 120 s: "old" idle 120 s, dropped; "fresh" idle 70 s, kept
    policy.choose(workers, keyed("other"))
    assert policy.pinned("m", "old") == ()
    assert policy.pinned("m", "fresh")


def test_using_a_pin_keeps_it() -> None:
    clock = Clock()
    policy = _policy(clock, PolicyConfig(max_idle_secs=100, eviction_interval_secs=60))
    workers = pool(3)
    home = policy.choose(workers, keyed("k")).worker
    for _ in range(10):
        clock.advance(60)
        assert policy.choose(workers, keyed("k")).worker is home


def test_forget_unpins() -> None:
    policy = _policy(config=PolicyConfig(assignment_mode="min_load"))
    workers = pool(2, 0, 1)
    assert policy.choose(workers, keyed("k")).worker.id == "w0"
    policy.forget("w0")
    assert policy.pinned("m", "k") == ()
    assert policy.choose(workers, keyed("k")).reason == "new routing key: min_load"


def test_an_unknown_assignment_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="--assignment-mode must be one of random, min_load, min_group, delegate"):
        PolicyConfig(assignment_mode="sticky")
