"""The hash ring, consistent_hashing and prefix_hash: stability under churn, balance, fallbacks."""

from __future__ import annotations

import random
from collections import Counter

from smg.routing.policies import PolicyConfig, RouteContext, make_policy
from smg.routing.policies.ring import HashRing
from tests.routing._pool import Worker, pool, spread

KEYS = [f"session-{i}" for i in range(3000)]


def _owners(ring: HashRing, workers: list[Worker]) -> dict[str, str]:
    return {key: ring.lookup(key, workers).id for key in KEYS}


def test_keys_spread_evenly_over_the_ring() -> None:
    counts = Counter(_owners(HashRing(), pool(5)).values())
    assert len(counts) == 5
    assert all(450 <= n <= 750 for n in counts.values()), counts


def test_removing_a_worker_moves_only_its_keys() -> None:
    ring, workers = HashRing(), pool(10)
    before = _owners(ring, workers)
    ring.remove("w3")
    after = _owners(ring, [w for w in workers if w.id != "w3"])
    moved = {key for key in KEYS if before[key] != after[key]}
    assert moved == {key for key in KEYS if before[key] == "w3"}
    assert 150 <= len(moved) <= 450  # about 1/10 of 3000


def test_adding_a_worker_takes_about_one_nth() -> None:
    ring, workers = HashRing(), pool(10)
    before = _owners(ring, workers)
    grown = [*workers, Worker("w10", "http://10.0.0.10:8000")]
    after = _owners(ring, grown)
    moved = [key for key in KEYS if before[key] != after[key]]
    assert all(after[key] == "w10" for key in moved)
    assert 130 <= len(moved) <= 420  # about 1/11 of 3000


def test_a_missing_candidate_is_skipped_without_moving_other_keys() -> None:
    ring, workers = HashRing(), pool(6)
    before = _owners(ring, workers)
    # w2 is down: not a candidate, but still on the ring.
    after = _owners(ring, [w for w in workers if w.id != "w2"])
    assert all(after[k] == before[k] for k in KEYS if before[k] != "w2")
    assert "w2" in ring
    # Back up: every key returns to where it was.
    assert _owners(ring, workers) == before


def test_placement_does_not_depend_on_candidate_order_or_history() -> None:
    workers = pool(5)
    shuffled = workers[:]
    random.Random(1).shuffle(shuffled)
    churned = HashRing()
    churned.lookup("x", pool(8))
    churned.remove("w5")
    churned.remove("w6")
    churned.remove("w7")
    assert _owners(HashRing(), workers) == _owners(churned, shuffled)


def test_consistent_hashing_follows_the_routing_key() -> None:
    policy = make_policy("consistent_hashing", rng=random.Random(0))
    workers = pool(4)
    first = {k: policy.choose(workers, RouteContext("m", routing_key=k)).worker.id for k in ("a", "b", "c", "d", "e")}
    for _ in range(3):
        for key, worker_id in first.items():
            choice = policy.choose(workers, RouteContext("m", text="anything", routing_key=key))
            assert (choice.worker.id, choice.reason) == (worker_id, "hash ring on routing key")
    assert len(set(first.values())) > 1


def test_consistent_hashing_falls_back_to_client_identity_then_random() -> None:
    policy = make_policy("consistent_hashing", rng=random.Random(0))
    workers = pool(4)
    by_client = spread(policy, workers, RouteContext("m", affinity_key="digest-of-a-bearer-key"), 50)
    assert len(by_client) == 1
    choice = policy.choose(workers, RouteContext("m", affinity_key="digest-of-a-bearer-key"))
    assert choice.reason == "hash ring on client identity"
    anonymous = spread(policy, workers, RouteContext("m"), 2000)
    assert all(400 <= n <= 600 for n in anonymous.values()), anonymous
    assert policy.choose(workers, RouteContext("m")).reason.startswith("no key: random")


def test_consistent_hashing_forget_takes_the_worker_off_the_ring() -> None:
    policy = make_policy("consistent_hashing")
    workers = pool(5)
    keys = [f"k{i}" for i in range(500)]
    before = {k: policy.choose(workers, RouteContext("m", routing_key=k)).worker.id for k in keys}
    policy.forget("w1")
    rest = [w for w in workers if w.id != "w1"]
    after = {k: policy.choose(rest, RouteContext("m", routing_key=k)).worker.id for k in keys}
    assert all(after[k] == before[k] for k in keys if before[k] != "w1")
    fresh = HashRing()
    assert after == {k: fresh.lookup(k, rest).id for k in keys}


PROMPT = "You are a careful reviewer. " * 60  # 1680 characters


def test_prefix_hash_groups_requests_by_their_head() -> None:
    policy = make_policy("prefix_hash")
    workers = pool(6)
    # 256 tokens is 1024 characters: what follows them does not matter.
    homes = {policy.choose(workers, RouteContext("m", PROMPT + f" question {i}")).worker.id for i in range(40)}
    assert len(homes) == 1
    heads = {policy.choose(workers, RouteContext("m", f"{i} " + PROMPT)).worker.id for i in range(40)}
    assert len(heads) > 3


def test_prefix_hash_prefix_length_is_a_knob() -> None:
    policy = make_policy("prefix_hash", PolicyConfig(prefix_token_count=2))
    workers = pool(6)
    assert len({policy.choose(workers, RouteContext("m", f"12345678{i}")).worker.id for i in range(30)}) == 1
    assert len({policy.choose(workers, RouteContext("m", f"1234567{i}")).worker.id for i in range(10)}) > 1


def test_prefix_hash_prefers_the_routing_key() -> None:
    policy = make_policy("prefix_hash")
    workers = pool(6)
    contexts = [RouteContext("m", f"{i} {PROMPT}", routing_key="conv-9") for i in range(30)]
    homes = {policy.choose(workers, ctx).worker.id for ctx in contexts}
    assert len(homes) == 1
    assert policy.choose(workers, RouteContext("m", "x", routing_key="conv-9")).reason == "hash ring on routing key"


def test_prefix_hash_leaves_an_overloaded_owner() -> None:
    policy = make_policy("prefix_hash")
    workers = pool(4)
    ctx = RouteContext("m", PROMPT)
    owner = policy.choose(workers, ctx).worker
    others = [w for w in workers if w is not owner]
    # Loads 14 on the owner, 0 elsewhere: mean (14 + 1) / 4 = 3.75, limit max(4.7, 13.75); 14 is over.
    owner.load = 14
    choice = policy.choose(workers, ctx)
    assert choice.worker is others[0]
    assert choice.reason == "ring owner overloaded at 14; least load 0 of " + ",".join(str(w.load) for w in workers)
    # 13 is within the limit: the owner keeps it.
    owner.load = 13
    assert policy.choose(workers, ctx).worker is owner
    # Relative margin: with everyone busy the owner must be over 1.25 x the mean as well.
    for w in others:
        w.load = 40
    owner.load = 60  # mean 45.25, limit max(56.56, 55.25)
    assert policy.choose(workers, ctx).worker is others[0]
    owner.load = 55  # mean 44, limit max(55, 54): over the absolute margin only
    assert policy.choose(workers, ctx).worker is owner


def test_prefix_hash_without_text_or_key_goes_by_load() -> None:
    choice = make_policy("prefix_hash").choose(pool(3, 2, 1, 1), RouteContext("m"))
    assert (choice.worker.id, choice.reason) == ("w1", "no prefix: least load 1 of 2,1,1")


def test_prefix_hash_forget_takes_the_worker_off_the_ring() -> None:
    policy = make_policy("prefix_hash")
    workers = pool(5)
    texts = [f"{i} document" for i in range(300)]
    before = {t: policy.choose(workers, RouteContext("m", t)).worker.id for t in texts}
    policy.forget("w4")
    after = {t: policy.choose(workers[:4], RouteContext("m", t)).worker.id for t in texts}
    assert all(after[t] == before[t] for t in texts if before[t] != "w4")
    assert any(before[t] == "w4" for t in texts)
