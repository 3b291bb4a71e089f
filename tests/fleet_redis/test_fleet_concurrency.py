"""Fleet-wide concurrency (`--fleet-concurrency redis://…`): two replicas in front of the
scripted engine count `--max-concurrent-requests` together in a real redis-server. Held
streams keep slots busy; a replica killed with SIGKILL gives its slots back when its lease
expires (`--fleet-lease-secs`)."""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis

from journal.events import Admission
from tests.admission.conftest import MODEL, QWEN3, events_until, new_id
from tests.admission.test_concurrency import HeldStream
from tests.fleet_redis.conftest import eventually
from tools.engine_control import EngineControl
from tools.servers.redis import RedisServer
from tools.spawn import Spawned, spawn_gateway, spawn_together

USER = [{"role": "user", "content": "Say hello."}]
BODY = {"model": MODEL, "max_tokens": 32, "messages": USER}
HELD = {"text": "one two three four five six", "hold_after": 2}
LEASE_SECS = 2


def replica(engine: Spawned, url: str, limit: int, *flags: str, journal: object = None) -> Spawned:
    return spawn_gateway(
        [engine.url],
        journal=journal,  # type: ignore[arg-type]
        extra=[
            "--model-path", str(QWEN3), "--max-concurrent-requests", str(limit), "--fleet-concurrency", url,
            "--fleet-lease-secs", str(LEASE_SECS), *flags,
        ],
    )  # fmt: skip


def held_slots(client: redis.Redis) -> int:
    return sum(int(n) for n in client.hvals("smg:fleet:held"))


@pytest.fixture
def pair(adm_engine: Spawned, redis_server: RedisServer) -> Iterator[list[Spawned]]:
    started = spawn_together([partial(replica, adm_engine, redis_server.url, 3, "--queue-size", "0")] * 2)
    try:
        yield started
    finally:
        for each in started:
            each.stop()


def _shed(response: httpx.Response) -> None:
    assert response.status_code == 429, response.text
    assert response.headers["x-smg-error-code"] == "admission_queue_full"
    assert response.headers["retry-after"] == "2"


def test_two_replicas_serve_exactly_the_fleet_limit_at_once(
    pair: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    a, b = pair
    engine_control.script(default=HELD)
    clients = [httpx.Client(base_url=a.url, timeout=30), httpx.Client(base_url=b.url, timeout=30)]
    held: list[HeldStream] = []
    try:
        for i in range(3):
            held.append(HeldStream(clients[i % 2], new_id()))
        assert held_slots(redis_client) == 3
        # Two more, one on each replica: the fleet is full, and neither replica alone is.
        for client in clients:
            _shed(client.post("/v1/messages", json=BODY))
        assert len(engine_control.received()) == 3
    finally:
        for stream in held:
            stream.close()
    eventually(lambda: held_slots(redis_client) == 0, what="every slot given back")
    engine_control.script(default={"text": "ok"})
    try:
        assert clients[1].post("/v1/messages", json=BODY).status_code == 200
    finally:
        for client in clients:
            client.close()


def test_a_request_queued_on_one_replica_takes_the_slot_freed_on_the_other(
    adm_engine: Spawned,
    redis_server: RedisServer,
    engine_control: EngineControl,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    journal = tmp_path / "b.db"
    a = replica(adm_engine, redis_server.url, 1, "--queue-size", "4", "--queue-timeout-secs", "30")
    b = replica(adm_engine, redis_server.url, 1, "--queue-size", "4", "--queue-timeout-secs", "30", journal=journal)
    engine_control.script(HELD, default={"text": "ok"})
    try:
        with httpx.Client(base_url=a.url, timeout=30) as client, concurrent.futures.ThreadPoolExecutor(1) as pool:
            holder = HeldStream(client, new_id())
            try:
                rid = new_id()
                waiting = pool.submit(
                    httpx.post, f"{b.url}/v1/messages", json=BODY, headers={"x-request-id": rid}, timeout=30
                )
                # Validated (journaled before admission) while the one slot is held: it waits.
                events_until(journal, rid, "validated")
                assert held_slots(redis_client) == 1
                assert not waiting.done()
            finally:
                holder.close()  # the client on A hangs up: its slot goes to B's waiter
            answer = waiting.result(timeout=30)
        assert answer.status_code == 200, answer.text
        [gate] = [e for e in events_until(journal, rid, "completed") if isinstance(e, Admission)]
        assert gate.decision == "admitted" and gate.queued_ms > 0
    finally:
        a.stop()
        b.stop()


def test_a_killed_replica_gives_its_slots_back_when_its_lease_expires(
    pair: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    a, b = pair
    engine_control.script(default=HELD)
    with httpx.Client(base_url=a.url, timeout=30) as client:
        held = [HeldStream(client, new_id()) for _ in range(3)]
        assert held_slots(redis_client) == 3
        [killed_lease] = redis_client.hkeys("smg:fleet:held")
        _shed(httpx.post(f"{b.url}/v1/messages", json=BODY, timeout=30))
        a.kill()  # SIGKILL: nothing is given back, the heartbeat stops
        for stream in held:
            stream.close()
    engine_control.script(default={"text": "ok"})
    # Within the lease (plus a heartbeat's slack), B is served again.
    eventually(
        lambda: httpx.post(f"{b.url}/v1/messages", json=BODY, timeout=30).status_code == 200,
        timeout=LEASE_SECS * 2 + 2,
        what="the killed replica's slots free again",
    )
    assert not redis_client.zscore("smg:fleet:leases", killed_lease)
    eventually(lambda: held_slots(redis_client) == 0, what="B's slot given back")


def _redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def test_a_live_replica_keeps_its_slots_past_the_lease_by_renewing_it(
    pair: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    a, b = pair
    engine_control.script(default=HELD)
    with httpx.Client(base_url=a.url, timeout=30) as client:
        held = [HeldStream(client, new_id()) for _ in range(3)]
        try:
            [(lease, first_expiry)] = redis_client.zrange("smg:fleet:leases", 0, -1, withscores=True)
            # Past the expiry the lease had when taken: the heartbeat has moved it on.
            eventually(lambda: _redis_ms(redis_client) > first_expiry + 200, timeout=LEASE_SECS * 3, what="time")
            assert redis_client.zscore("smg:fleet:leases", lease) > first_expiry
            assert held_slots(redis_client) == 3
            _shed(httpx.post(f"{b.url}/v1/messages", json=BODY, timeout=30))
        finally:
            for stream in held:
                stream.close()


@pytest.mark.parametrize("mode", ["closed", "open"])
def test_redis_down_refuses_or_admits_as_the_failure_mode_says(
    adm_engine: Spawned, redis_server: RedisServer, engine_control: EngineControl, mode: str, tmp_path: Path
) -> None:
    engine_control.script(default={"text": "ok"})
    journal = tmp_path / "journal.db"
    gateway = replica(adm_engine, redis_server.url, 2, "--redis-failure-mode", mode, journal=journal)
    try:
        assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, timeout=30).status_code == 200
        redis_server.stop()
        for _ in range(3):
            rid = new_id()
            down = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers={"x-request-id": rid}, timeout=30)
            if mode == "closed":
                assert down.status_code == 503, down.text
                assert down.headers["x-smg-error-code"] == "shared_state_unavailable"
                assert down.json()["error"]["type"] == "overloaded_error"
                [gate] = [e for e in events_until(journal, rid, "completed") if isinstance(e, Admission)]
                assert gate.decision == "unavailable"
            else:
                assert down.status_code == 200, down.text
        assert gateway.log().count("is unreachable") == 1, gateway.log()
        redis_server.start()
        eventually(lambda: "is reachable again" in gateway.log(), what="Redis seen back")
        assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, timeout=30).status_code == 200
    finally:
        gateway.stop()


def test_a_slot_counted_by_a_take_whose_answer_was_lost_comes_back_on_a_busy_replica(
    adm_engine: Spawned, redis_server: RedisServer, engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    # A lease long enough to outlive the frozen server: the replica stays busy under one lease.
    gateway = replica(adm_engine, redis_server.url, 3, "--fleet-lease-secs", "6")
    engine_control.script(default=HELD)
    try:
        with httpx.Client(base_url=gateway.url, timeout=30) as client:
            held = HeldStream(client, new_id())
            try:
                assert held_slots(redis_client) == 1
                redis_server.freeze()
                try:
                    # The take is sent, its answer never comes: refused (closed) after the timeout.
                    lost = client.post("/v1/messages", json=BODY)
                    assert lost.status_code == 503, lost.text
                    assert lost.headers["x-smg-error-code"] == "shared_state_unavailable"
                finally:
                    redis_server.thaw()  # runs the take it was sent: one slot counted that nobody holds
                # The heartbeat writes the count the replica really holds, while its lease lives on.
                eventually(lambda: held_slots(redis_client) == 1, timeout=8, what="the lost slot given back")
                assert len(redis_client.zrange("smg:fleet:leases", 0, -1)) == 1
            finally:
                held.close()
        eventually(lambda: held_slots(redis_client) == 0, what="every slot given back")
    finally:
        gateway.stop()
