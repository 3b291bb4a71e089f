"""Prefill/decode pools behind the app, in process over playback engines: which pool and pair a
request reaches (a PD pool beside a regular one, another pair when a decode leg does not
answer) and readiness by role. What each leg is sent and how each runtime's legs meet is
proven against the scripted engines on loopback (`test_pd.py`)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from journal.events import Routed
from smg.backends.base import Connector
from smg.backends.grpc.engines.playback import PlaybackEngine, Playbook
from smg.backends.grpc.pd import GrpcPdConnector
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.routing.config import RouterConfig
from smg.routing.router import Router, WorkerSpec
from smg.routing.workers import HealthConfig
from tests.inprocess import InProcessGateway, config, connector, engine

MODEL = "pd-fixture"
PREFILL, DECODE, OTHER_DECODE, REGULAR = (f"grpc://127.0.0.1:5200{i}" for i in range(4))
BODY = {"model": MODEL, "max_tokens": 32}


def _pd_gateway(
    tmp_path: Path,
    engines: dict[str, PlaybackEngine],
    specs: list[WorkerSpec],
    router: RouterConfig,
) -> InProcessGateway:
    book = Playbook()
    for url, playback in engines.items():
        book.add(url, playback)
    settings = config(journal_path=tmp_path / "journal.db", router=router)
    grpc = connector(settings, book, TokenizerRegistry(bundle_dir=str(tmp_path / "bundles")))
    connectors: dict[str, Connector] = {"grpc-pd": GrpcPdConnector(grpc)}
    if router.igw:
        connectors["grpc"] = grpc
    return InProcessGateway(
        settings, Router(router, connectors), tmp_path / "journal.db", static=specs, engines=engines
    )


def _pair(*decodes: str) -> list[WorkerSpec]:
    return [WorkerSpec(url=PREFILL, role="prefill", bootstrap_port=9123)] + [
        WorkerSpec(url=url, role="decode") for url in decodes
    ]


async def _eventually(check: Callable[[], Awaitable[bool]]) -> None:
    async with asyncio.timeout(15):
        while not await check():
            await asyncio.sleep(0.02)


async def test_igw_serves_a_pd_pool_beside_a_regular_pool(tmp_path: Path) -> None:
    engines = {PREFILL: engine(MODEL), DECODE: engine(MODEL), REGULAR: engine("regular-fixture")}
    specs = [*_pair(DECODE), WorkerSpec(url=REGULAR)]
    async with _pd_gateway(tmp_path, engines, specs, RouterConfig(igw=True, pd=True)) as gw:
        engines[REGULAR].script({"text": "Regular answer."})
        engines[DECODE].script({"text": "Pair answer."})
        pair = await gw.post(BODY)
        single = await gw.post({**BODY, "model": "regular-fixture"})
        assert pair.status_code == 200 and single.status_code == 200, (pair.text, single.text)
        assert pair.json()["content"][0]["text"] == "Pair answer."
        assert single.json()["content"][0]["text"] == "Regular answer."
        [regular_call] = engines[REGULAR].received
        assert regular_call.bootstrap is None  # a regular worker's request has no rendezvous
        [prefill_call] = engines[PREFILL].received
        [decode_call] = engines[DECODE].received
        assert prefill_call.bootstrap is not None and prefill_call.bootstrap == decode_call.bootstrap
        counted = await gw.post({"model": MODEL}, path="/v1/messages/count_tokens")
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0


async def test_an_unreachable_decode_leg_gives_way_to_another_pair(tmp_path: Path) -> None:
    engines = {PREFILL: engine(MODEL), DECODE: engine(MODEL), OTHER_DECODE: engine(MODEL)}
    router = RouterConfig(pd=True, decode_policy="round_robin", health=HealthConfig(interval_secs=3600))
    async with _pd_gateway(tmp_path, engines, _pair(DECODE, OTHER_DECODE), router) as gw:
        gone = engines[OTHER_DECODE]
        gone.down = True  # discovered, then gone: only a request finds out
        engines[DECODE].script(default={"text": "Still answered."})
        replies = [await gw.post(BODY) for _ in range(2)]
        assert [r.status_code for r in replies] == [200, 200], [r.text for r in replies]
        assert all(r.json()["content"][0]["text"] == "Still answered." for r in replies)
        assert len(engines[DECODE].received) == 2
        journaled = [await gw.events(r.headers["x-request-id"]) for r in replies]
        routed = [[(e.worker, e.attempt) for e in events if isinstance(e, Routed)] for events in journaled]
        retried = [attempts for attempts in routed if len(attempts) == 4]
        assert retried == [[(PREFILL, 1), (OTHER_DECODE, 1), (PREFILL, 2), (DECODE, 2)]], routed


async def test_readiness_needs_a_healthy_worker_in_each_role(tmp_path: Path) -> None:
    engines = {PREFILL: engine(MODEL), DECODE: engine(MODEL)}
    fast = HealthConfig(interval_secs=0.05, failure_threshold=1, success_threshold=1)
    async with _pd_gateway(tmp_path, engines, _pair(DECODE), RouterConfig(pd=True, health=fast)) as gw:

        async def readiness(status: int) -> bool:
            return (await gw.client.get("/readiness")).status_code == status

        await _eventually(lambda: readiness(200))
        engines[PREFILL].healthy = False
        await _eventually(lambda: readiness(503))
        assert "grpc-pd workers not ready" in (await gw.client.get("/readiness")).json()["reason"]
        engines[PREFILL].healthy = True
        await _eventually(lambda: readiness(200))
