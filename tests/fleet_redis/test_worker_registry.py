"""The shared worker registry (`--worker-registry redis://…`): two replicas, each with a static
scripted worker of its own, and a second scripted worker added at run time through one of them.
Redis is a real redis-server; the replicas learn of changes from its change feed."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import httpx
import pytest
import redis

from tests.conftest import Scripted
from tests.fleet_redis.conftest import eventually
from tools.servers.redis import RedisServer, SilencingProxy
from tools.spawn import Spawned, spawn_gateway, spawn_together, spawn_worker

STATIC_MODEL = "static-model"
ADDED_MODEL = "added-model"


@pytest.fixture(scope="module")
def static_worker() -> Iterator[Spawned]:
    proc = spawn_worker(models=[STATIC_MODEL])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def added_worker() -> Iterator[Spawned]:
    proc = spawn_worker(models=[ADDED_MODEL])
    try:
        yield proc
    finally:
        proc.stop()


def replica(static: Spawned, url: str) -> Spawned:
    return spawn_gateway([static.url], extra=["--worker-registry", url])


@pytest.fixture
def pair(static_worker: Spawned, redis_server: RedisServer) -> Iterator[list[Spawned]]:
    started = spawn_together([partial(replica, static_worker, redis_server.url)] * 2)
    try:
        yield started
    finally:
        for each in started:
            each.stop()


def listed(gateway: Spawned, url: str) -> dict[str, Any] | None:
    workers = httpx.get(f"{gateway.url}/workers", timeout=5).json()["workers"]
    return next((w for w in workers if w["url"] == url), None)


def ready(gateway: Spawned, url: str) -> dict[str, Any] | None:
    found = listed(gateway, url)
    return found if found is not None and found["status"] == "ready" else None


def ask(gateway: Spawned, model: str) -> httpx.Response:
    body = {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=30)


def test_a_worker_added_on_one_replica_is_routed_to_by_all_and_survives_a_restart(
    pair: list[Spawned], static_worker: Spawned, added_worker: Spawned, redis_server: RedisServer
) -> None:
    a, b = pair
    added = Scripted(added_worker.url)
    added.reset()
    posted = httpx.post(f"{a.url}/workers", json={"url": added_worker.url}, timeout=5)
    assert posted.status_code == 202, posted.text
    worker_id = posted.json()["worker_id"]
    start = time.monotonic()
    on_b = eventually(lambda: ready(b, added_worker.url), timeout=5, what="B serving the added worker")
    print(f"added on A, ready on B after {time.monotonic() - start:.3f}s")
    assert on_b["id"] == worker_id  # one id in the fleet
    answer = ask(b, ADDED_MODEL)
    assert answer.status_code == 200, answer.text
    assert len(added.received()) == 1
    # The static workers stay each replica's own: neither is in Redis.
    assert redis.Redis.from_url(redis_server.url, decode_responses=True).hkeys("smg:workers") == [worker_id]

    # Removed through B: A stops routing to it.
    assert httpx.delete(f"{b.url}/workers/{worker_id}", timeout=5).status_code == 202
    eventually(lambda: listed(a, added_worker.url) is None, timeout=5, what="A forgetting the removed worker")
    assert ask(a, ADDED_MODEL).status_code == 404

    # Added again, then A restarts: it loads the fleet's workers before it serves.
    again = httpx.post(f"{b.url}/workers", json={"url": added_worker.url}, timeout=5)
    assert again.status_code == 202, again.text
    eventually(lambda: ready(a, added_worker.url), timeout=5, what="A serving the re-added worker")
    a.stop()
    pair[0] = a = replica(static_worker, redis_server.url)
    assert ready(a, added_worker.url) is not None
    assert ask(a, ADDED_MODEL).status_code == 200


def test_a_url_is_registered_once_in_the_fleet(pair: list[Spawned], added_worker: Spawned) -> None:
    a, b = pair
    first = httpx.post(f"{a.url}/workers", json={"url": added_worker.url}, timeout=5)
    assert first.status_code == 202
    twice = httpx.post(f"{b.url}/workers", json={"url": added_worker.url + "/"}, timeout=5)
    assert twice.status_code == 409, twice.text
    assert twice.json()["code"] == "WORKER_ALREADY_EXISTS"
    assert first.json()["worker_id"] in twice.json()["error"]


def test_a_replica_reloads_the_whole_set_when_its_feed_reconnects(
    pair: list[Spawned], added_worker: Spawned, redis_client: redis.Redis
) -> None:
    a, b = pair
    worker_id = httpx.post(f"{a.url}/workers", json={"url": added_worker.url}, timeout=5).json()["worker_id"]
    eventually(lambda: ready(b, added_worker.url), timeout=5, what="B serving the added worker")
    # A change the feed never announced (as if its message were lost), then the feed's
    # connections drop: each replica reloads the set and drops the worker.
    redis_client.hdel("smg:workers", worker_id)
    redis_client.hdel("smg:workers:urls", added_worker.url)
    redis_client.incr("smg:workers:version")
    redis_client.client_kill_filter(_type="pubsub")
    for gateway in (a, b):
        eventually(lambda g=gateway: listed(g, added_worker.url) is None, timeout=5, what="the reload")


def test_redis_down_keeps_routing_and_refuses_changes_until_it_returns(
    pair: list[Spawned], added_worker: Spawned, redis_server: RedisServer
) -> None:
    a, b = pair
    worker_id = httpx.post(f"{a.url}/workers", json={"url": added_worker.url}, timeout=5).json()["worker_id"]
    eventually(lambda: ready(b, added_worker.url), timeout=5, what="B serving the added worker")
    redis_server.stop()
    assert ask(b, ADDED_MODEL).status_code == 200  # the known workers are still routed to
    refused = httpx.delete(f"{b.url}/workers/{worker_id}", timeout=5)
    assert refused.status_code == 503, refused.text
    assert refused.json()["code"] == "WORKER_REGISTRY_UNAVAILABLE"
    assert ready(a, added_worker.url) is not None
    redis_server.start()
    # Back: the feed resubscribes, and changes reach every replica again.
    removed = eventually(
        lambda: httpx.delete(f"{b.url}/workers/{worker_id}", timeout=5).status_code == 202, what="a removal accepted"
    )
    assert removed
    eventually(lambda: listed(a, added_worker.url) is None, timeout=5, what="A forgetting the removed worker")


def test_a_replica_refuses_a_shared_worker_that_leads_to_itself(pair: list[Spawned]) -> None:
    a, b = pair
    # A checks only its own address: B's passes there, and B must refuse it when it loads it.
    added = httpx.post(f"{a.url}/workers", json={"url": b.url}, timeout=10)
    assert added.status_code == 202, added.text
    eventually(lambda: "not served here" in b.log(), what="B refusing its own address")
    assert "leads to this gateway itself" in b.log()
    assert listed(b, b.url) is None
    assert listed(a, b.url) is not None


def test_ipc_workers_stay_out_of_the_shared_registry(pair: list[Spawned], redis_client: redis.Redis) -> None:
    a, _ = pair
    refused = httpx.post(f"{a.url}/workers", json={"url": "ipc:///tmp/smg-engine.sock"}, timeout=10)
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "IPC_WORKER_NOT_SHARED"
    assert "--worker-urls" in refused.json()["error"]
    assert redis_client.hlen("smg:workers") == 0


def test_a_feed_whose_connection_went_silent_is_noticed_and_made_again(
    static_worker: Spawned, added_worker: Spawned, redis_server: RedisServer
) -> None:
    with SilencingProxy(redis_server.port) as proxy:
        behind = replica(static_worker, proxy.url)
        direct = replica(static_worker, redis_server.url)
        try:
            proxy.silence()  # behind's subscription is half-open now, and nothing tells it
            added = httpx.post(f"{direct.url}/workers", json={"url": added_worker.url}, timeout=10)
            assert added.status_code == 202, added.text
            # Its idle feed's PING goes unanswered: dropped, made again, the whole set reloaded.
            eventually(lambda: ready(behind, added_worker.url), timeout=15, what="the silent replica caught up")
        finally:
            behind.stop()
            direct.stop()


EXTERNAL = {
    "url": "http://127.0.0.1:9",  # never called: its models are given
    "provider": "anthropic",
    "runtime_type": "external",
    "api_key": "wk-fleet-secret-key",
    "models": ["claude-fleet"],
}


def test_an_external_workers_api_key_is_stored_only_sealed(
    static_worker: Spawned, redis_server: RedisServer, redis_client: redis.Redis
) -> None:
    env = {"SMG_TENANT_SECRET": "0123456789abcdef0123456789abcdef"}
    started = [
        spawn_gateway([static_worker.url], extra=["--worker-registry", redis_server.url], env=env) for _ in range(2)
    ]
    try:
        a, b = started
        added = httpx.post(f"{a.url}/workers", json=EXTERNAL, timeout=10)
        assert added.status_code == 202, added.text
        stored = redis_client.hget("smg:workers", added.json()["worker_id"]) or ""
        assert "wk-fleet-secret-key" not in stored and "api_key_sealed" in stored
        eventually(lambda: listed(b, EXTERNAL["url"]), what="the other replica opening it")
        assert "not served here" not in b.log()
    finally:
        for each in started:
            each.stop()


def test_without_a_fleet_secret_an_api_key_is_not_written_to_redis(
    pair: list[Spawned], redis_client: redis.Redis
) -> None:
    refused = httpx.post(f"{pair[0].url}/workers", json=EXTERNAL, timeout=10)
    assert refused.status_code == 400, refused.text
    assert refused.json()["code"] == "WORKER_KEY_NOT_SEALABLE"
    assert "SMG_TENANT_SECRET" in refused.json()["error"]
    assert redis_client.hlen("smg:workers") == 0
    assert listed(pair[0], EXTERNAL["url"]) is None
