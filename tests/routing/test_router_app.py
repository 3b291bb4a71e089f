"""The router behind the whole app, in process over playback engines: the worker API, the
policies deciding on real requests (a held stream's load, a routing key, a repeated prefix),
failover from an engine gone and the circuit breaker as `/workers` shows them.

The relay's own retry rule (a worker's 500 sent once, a 503 retried), IGW with HTTP and
Anthropic pools and a worker that never answers stay on loopback (`test_router_live.py`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from journal.events import Routed
from smg.backends.grpc.engines.playback import PlaybackEngine
from smg.routing.breaker import BreakerConfig
from smg.routing.config import RouterConfig
from smg.routing.workers import HealthConfig
from tests.inprocess import InProcessGateway, engine, gateway

URLS = [f"grpc://127.0.0.1:5100{i}" for i in range(3)]
KEY = {"authorization": "Bearer admin-key"}


async def _served_by(gw: InProcessGateway, body: dict[str, Any], **kwargs: Any) -> str:
    """The worker that answered a request, as its journal says (relays say it in a header too)."""
    reply = await gw.post(body, **kwargs)
    assert reply.status_code == 200, reply.text
    events = await gw.events(reply.headers["x-request-id"])
    worker = [e.worker for e in events if isinstance(e, Routed)][-1]
    assert worker is not None
    return worker


def _engines(n: int = 3) -> dict[str, PlaybackEngine]:
    return {url: engine() for url in URLS[:n]}


async def _until_ready(gw: InProcessGateway, worker_id: str) -> None:
    async with asyncio.timeout(15):
        while (await gw.client.get(f"/workers/{worker_id}", headers=KEY)).json()["status"] != "ready":
            await asyncio.sleep(0.02)


async def _held(playback: PlaybackEngine) -> None:
    async with asyncio.timeout(15):
        await playback.held.wait()


# --- the worker API ----------------------------------------------------------------------------


async def test_workers_added_at_run_time_are_discovered_routed_to_and_removed(tmp_path: Path) -> None:
    first, second = URLS[:2]
    engines = _engines(2)
    settings: dict[str, Any] = {"api_key": "admin-key", "router": RouterConfig(policy="round_robin")}
    async with gateway(tmp_path, engines, static=[first], **settings) as gw:
        client = gw.client
        assert (await client.get("/workers")).status_code == 401
        listed = (await client.get("/workers", headers=KEY)).json()
        assert listed["total"] == 1 and listed["stats"] == {"prefill_count": 0, "decode_count": 0, "regular_count": 1}
        (static,) = listed["workers"]
        assert (static["url"], static["model_id"], static["status"]) == (first, engines[first].info.model_id, "ready")
        assert static["connection_mode"] == "grpc" and static["worker_type"] == "regular"

        added = await client.post("/workers", json={"url": second}, headers=KEY)
        assert added.status_code == 202, added.text
        worker_id = added.json()["worker_id"]
        assert added.headers["location"] == f"/workers/{worker_id}" == added.json()["location"]
        await _until_ready(gw, worker_id)
        seen = {await _served_by(gw, {"max_tokens": 8}, headers=KEY) for _ in range(4)}
        assert seen == {first, second}

        duplicate = await client.post("/workers", json={"url": second}, headers=KEY)
        assert duplicate.status_code == 409 and duplicate.json()["code"] == "WORKER_ALREADY_EXISTS"
        bad = await client.post("/workers", content=b"{", headers={"content-type": "application/json", **KEY})
        assert bad.json()["code"] == "BAD_REQUEST"
        assert (await client.post("/workers", json={"url": "ftp://x"}, headers=KEY)).status_code == 400
        assert (await client.get("/workers/not-a-uuid", headers=KEY)).status_code == 400
        missing = await client.get("/workers/00000000-0000-7000-8000-000000000000", headers=KEY)
        assert missing.status_code == 404 and missing.json()["code"] == "WORKER_NOT_FOUND"

        removed = await client.delete(f"/workers/{worker_id}", headers=KEY)
        assert removed.status_code == 202 and removed.json()["worker_id"] == worker_id
        assert (await client.delete(f"/workers/{worker_id}", headers=KEY)).status_code == 404
        assert {await _served_by(gw, {"max_tokens": 8}, headers=KEY) for _ in range(4)} == {first}


async def test_a_removed_worker_finishes_its_stream_and_gets_no_new_request(tmp_path: Path) -> None:
    first, second = URLS[:2]
    engines = _engines(2)
    held = engines[first]
    held.script({"text": "a stream that outlives its worker", "hold_after": 2})
    settings: dict[str, Any] = {"router": RouterConfig(policy="round_robin")}
    async with gateway(tmp_path, engines, static=[first], **settings) as gw:
        stream = asyncio.create_task(gw.post({"stream": True}))
        await _held(held)
        worker_id = (await gw.client.get("/workers")).json()["workers"][0]["id"]
        added = await gw.client.post("/workers", json={"url": second})
        await _until_ready(gw, added.json()["worker_id"])
        assert (await gw.client.delete(f"/workers/{worker_id}")).status_code == 202
        assert all([await _served_by(gw, {}) == second for _ in range(3)])
        held.release()
        assert "event: message_stop" in (await stream).text
        assert len(held.received) == 1


# --- policies on real requests -------------------------------------------------------------------


async def test_least_load_sends_nothing_to_a_worker_holding_a_long_stream(tmp_path: Path) -> None:
    busy, idle = URLS[:2]
    engines = _engines(2)
    engines[busy].script({"text": "a long stream", "hold_after": 1})
    settings: dict[str, Any] = {"router": RouterConfig(policy="least_load")}
    async with gateway(tmp_path, engines, static=[busy], **settings) as gw:
        stream = asyncio.create_task(gw.post({"stream": True}))
        await _held(engines[busy])
        added = await gw.client.post("/workers", json={"url": idle})
        await _until_ready(gw, added.json()["worker_id"])
        loads = {w["url"]: w["load"] for w in (await gw.client.get("/workers")).json()["workers"]}
        assert loads == {busy: 1, idle: 0}
        routed = [await _served_by(gw, {"max_tokens": 8}) for _ in range(8)]
        assert routed == [idle] * 8
        engines[busy].release()
        await stream


async def test_consistent_hashing_keeps_a_routing_key_on_one_worker(tmp_path: Path) -> None:
    async with gateway(tmp_path, _engines(), router=RouterConfig(policy="consistent_hashing")) as gw:
        by_key: dict[str, set[str]] = {}
        for n in range(30):
            key = f"session-{n % 6}"
            by_key.setdefault(key, set()).add(
                await _served_by(gw, {"max_tokens": 8}, headers={"x-smg-routing-key": key})
            )
        assert all(len(urls) == 1 for urls in by_key.values())
        assert len({next(iter(urls)) for urls in by_key.values()}) > 1  # the keys spread over workers
        reply = await gw.post({"max_tokens": 8}, headers={"x-smg-routing-key": "session-0"})
        (routed,) = [e for e in await gw.events(reply.headers["x-request-id"]) if isinstance(e, Routed)]
        assert routed.policy == "consistent_hashing" and routed.reason
        assert sorted(routed.candidates or []) == sorted(URLS)


async def test_cache_aware_sends_a_repeated_prefix_to_the_same_worker(tmp_path: Path) -> None:
    async with gateway(tmp_path, _engines()) as gw:  # cache_aware is the default
        seen = set()
        for turn in range(5):
            messages = [{"role": "user", "content": "A long shared system of instructions. " * 20 + str(turn)}]
            seen.add(await _served_by(gw, {"max_tokens": 8, "messages": messages}))
        assert len(seen) == 1


# --- failover and the breaker ---------------------------------------------------------------------


async def test_an_engine_gone_costs_no_client_an_error(tmp_path: Path) -> None:
    engines = _engines()
    async with gateway(tmp_path, engines, router=RouterConfig(policy="round_robin")) as gw:
        assert (await gw.post({"max_tokens": 8})).status_code == 200
        engines[URLS[1]].down = True
        statuses = [(await gw.post({"max_tokens": 8, "stream": n % 2 == 1})).status_code for n in range(40)]
        assert statuses == [200] * 40
        worker = next(w for w in (await gw.client.get("/workers")).json()["workers"] if w["url"] == URLS[1])
        assert worker["is_healthy"] is False


async def test_an_open_breaker_takes_a_failing_worker_out(tmp_path: Path) -> None:
    failing, good = URLS[:2]
    engines = _engines(2)
    engines[failing].script({"error": {"code": "INTERNAL", "message": "broken"}, "repeat": True})
    router = RouterConfig(
        policy="round_robin", breaker=BreakerConfig(failure_threshold=2), health=HealthConfig(enabled=False)
    )
    async with gateway(tmp_path, engines, router=router) as gw:
        for _ in range(4):
            await gw.post({"max_tokens": 8})
        routed = {await _served_by(gw, {"max_tokens": 8}) for _ in range(6)}
        assert routed == {good}
        state = {w["url"]: w["circuit_breaker"] for w in (await gw.client.get("/workers")).json()["workers"]}
        assert state == {failing: "open", good: "closed"}
