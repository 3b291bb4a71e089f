"""The load-only policies' decisions, the factory, and properties every policy keeps."""

from __future__ import annotations

import hashlib
import random
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smg.routing.policies import POLICY_NAMES, PolicyConfig, RouteContext, make_policy
from tests.routing._pool import Clock, Worker, ids, pool, spread

CTX = RouteContext(model="m", text="hello")


def test_round_robin_cycles_per_model() -> None:
    policy = make_policy("round_robin")
    workers = pool(3)
    a, b = RouteContext("a"), RouteContext("b")
    assert ids(policy, workers, [a, a, b, a, b, a]) == ["w0", "w1", "w0", "w2", "w1", "w0"]


def test_round_robin_reason_names_the_turn() -> None:
    policy = make_policy("round_robin")
    policy.choose(pool(3), CTX)
    assert policy.choose(pool(3), CTX).reason == "round robin 2 of 3"


def test_random_is_uniform_and_seeded() -> None:
    counts = spread(make_policy("random", rng=random.Random(7)), pool(3), CTX, 3000)
    assert set(counts) == {"w0", "w1", "w2"}
    assert all(900 <= n <= 1100 for n in counts.values()), counts
    first = ids(make_policy("random", rng=random.Random(7)), pool(3), [CTX] * 50)
    again = ids(make_policy("random", rng=random.Random(7)), pool(3), [CTX] * 50)
    assert first == again


def test_power_of_two_takes_the_lower_load_of_the_pair() -> None:
    policy = make_policy("power_of_two", rng=random.Random(1))
    assert set(spread(policy, pool(2, 5, 1), CTX, 200)) == {"w1"}
    choice = policy.choose(pool(2, 5, 1), CTX)
    assert choice.reason in ("lower load of two: 5 vs 1", "lower load of two: 1 vs 5")


def test_power_of_two_never_picks_the_busiest() -> None:
    # The busiest worker is always paired with a less loaded one; the idlest wins every pair it is in.
    counts = spread(make_policy("power_of_two", rng=random.Random(2)), pool(3, 0, 1, 2), CTX, 3000)
    assert "w2" not in counts
    # w0 is in 2 of the 3 possible pairs, w1 wins only the (w1, w2) pair.
    assert 1850 <= counts["w0"] <= 2150 and 850 <= counts["w1"] <= 1150, counts


def test_power_of_two_pairs_are_distinct_and_ties_spread() -> None:
    counts = spread(make_policy("power_of_two", rng=random.Random(3)), pool(2), CTX, 2000)
    assert 900 <= counts["w0"] <= 1100, counts


def test_power_of_two_with_one_worker() -> None:
    choice = make_policy("power_of_two", rng=random.Random(0)).choose(pool(1, 9), CTX)
    assert (choice.worker.id, choice.reason) == ("w0", "only worker")


def test_least_load_takes_the_lowest() -> None:
    choice = make_policy("least_load", rng=random.Random(0)).choose(pool(3, 3, 0, 1), CTX)
    assert (choice.worker.id, choice.reason) == ("w1", "least load 0 of 3,0,1")


def test_least_load_spreads_equal_loads() -> None:
    counts = spread(make_policy("least_load", rng=random.Random(4)), pool(4, 2, 2, 2, 5), CTX, 3000)
    assert "w3" not in counts
    assert all(900 <= counts[w] <= 1100 for w in ("w0", "w1", "w2")), counts


@pytest.mark.parametrize("name", ["least_load", "power_of_two", "cache_aware"])
def test_a_worker_holding_a_long_stream_gets_no_short_requests(name: str) -> None:
    # w0 holds one long stream; short requests (no two alike) each finish before the next arrives.
    workers = pool(3, 1)
    contexts = [RouteContext("m", hashlib.sha256(bytes([i % 256, i // 256])).hexdigest()) for i in range(600)]
    counts = Counter(ids(make_policy(name, rng=random.Random(5)), workers, contexts))
    assert "w0" not in counts
    assert 250 <= counts["w1"] <= 350, counts


def test_least_load_under_concurrency_keeps_the_stream_holder_below_its_share() -> None:
    # Requests stay in flight for three arrivals; w0 also holds a stream for the whole run.
    workers = pool(3, 1)
    policy = make_policy("least_load", rng=random.Random(6))
    in_flight: list[Worker] = []
    counts: Counter[str] = Counter()
    for _ in range(3000):
        if len(in_flight) == 3:
            in_flight.pop(0).load -= 1
        worker = policy.choose(workers, CTX).worker
        worker.load += 1
        in_flight.append(worker)
        counts[worker.id] += 1
    assert counts["w0"] < 3000 / 3 * 0.75 < min(counts["w1"], counts["w2"]), counts


def test_passthrough_takes_the_first() -> None:
    policy = make_policy("passthrough")
    assert ids(policy, pool(3, 9), [CTX] * 3) == ["w0", "w0", "w0"]


def test_make_policy_names() -> None:
    for name in POLICY_NAMES:
        assert make_policy(name).name == name
    with pytest.raises(ValueError, match="unknown routing policy 'bucket'"):
        make_policy("bucket")


def test_default_config_is_the_references() -> None:
    config = PolicyConfig()
    assert (config.cache_threshold, config.balance_abs_threshold, config.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (config.eviction_interval_secs, config.max_tree_size) == (120, 2**26)
    assert (config.prefix_token_count, config.prefix_hash_load_factor, config.prefix_hash_balance_abs_threshold) == (
        256,
        1.25,
        10,
    )


@pytest.mark.parametrize(
    ("knob", "message"),
    [
        ({"cache_threshold": 1.5}, "--cache-threshold must be between 0.0 and 1.0"),
        ({"cache_threshold": float("nan")}, "--cache-threshold"),
        ({"balance_rel_threshold": 0.9}, "--balance-rel-threshold must be at least 1.0"),
        ({"max_tree_size": 0}, "--max-tree-size must be positive"),
        ({"prefix_token_count": 0}, "--prefix-token-count must be positive"),
        ({"prefix_hash_load_factor": 0.5}, "--prefix-hash-load-factor must be at least 1.0"),
        ({"eviction_interval_secs": -1}, "--eviction-interval must not be negative"),
    ],
)
def test_config_refuses_what_the_reference_refuses(knob: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PolicyConfig(**knob)  # type: ignore[arg-type]


# Lone surrogates included: JSON text may carry them into the routing text.
_text = st.text(max_size=40) | st.text(st.characters(categories=["Cs", "Ll", "Zs"]), max_size=40)
_workers = st.lists(
    st.builds(Worker, id=st.text(min_size=1, max_size=6), url=st.just("http://w"), load=st.integers(0, 200)),
    min_size=1,
    max_size=8,
    unique_by=lambda w: w.id,
)
_contexts = st.builds(
    RouteContext,
    model=st.sampled_from(["a", "b"]),
    text=_text,
    routing_key=st.none() | st.text(min_size=1, max_size=8),
    affinity_key=st.none() | st.text(min_size=1, max_size=8),
)
_steps = st.lists(st.tuples(_workers, _contexts, st.booleans()), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(POLICY_NAMES), steps=_steps, seed=st.integers(0, 2**32))
def test_any_pool_and_request_get_one_of_the_candidates(
    name: str, steps: list[tuple[list[Worker], RouteContext, bool]], seed: int
) -> None:
    clock = Clock()
    config = PolicyConfig(eviction_interval_secs=5, max_tree_size=30, max_idle_secs=7)
    policy = make_policy(name, config, rng=random.Random(seed), clock=clock)
    for workers, ctx, drop_first in steps:
        choice = policy.choose(workers, ctx)
        assert any(choice.worker is w for w in workers)
        assert choice.reason
        if drop_first:
            policy.forget(workers[0].id)
        clock.advance(3)


@pytest.mark.parametrize("name", POLICY_NAMES)
def test_a_seeded_policy_replays_its_decisions(name: str) -> None:
    rng = random.Random(11)
    script = [
        (pool(4, *(rng.randrange(5) for _ in range(4))), RouteContext("m", f"t{rng.randrange(6)}")) for _ in range(80)
    ]

    def run() -> list[tuple[str, str]]:
        policy = make_policy(name, rng=random.Random(99), clock=Clock())
        return [(c.worker.id, c.reason) for c in (policy.choose(w, ctx) for w, ctx in script)]

    assert run() == run()
