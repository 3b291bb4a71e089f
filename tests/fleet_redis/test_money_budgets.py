"""Budgets stated in money in Redis (`--tenant-rate-limit-state redis://…`): two replicas in
front of the scripted engine, sharing one real redis-server, spend one tenant's dollars: the
prompts' costs are reserved and the answers' trued up by the same scripts as the tokens."""

from __future__ import annotations

import time
from collections.abc import Iterator
from functools import partial

import httpx
import pytest
import redis

from tests.admission.test_money_budgets import (
    BODY,
    BUDGET_USD,
    INPUT_USD,
    LONG,
    assert_tenant_refusal,
    cost,
    gateway_flags,
    key,
    spend_until_refused,
    write_files,
)
from tools.engine_control import EngineControl
from tools.servers.redis import RedisServer
from tools.spawn import Spawned, spawn_gateway, spawn_together


@pytest.fixture
def replicas(
    adm_engine: Spawned, redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Spawned]]:
    files = write_files(tmp_path_factory.mktemp("redis-money"))
    flags = gateway_flags(*files, redis_server.url)
    started = spawn_together([partial(spawn_gateway, [adm_engine.url], extra=flags)] * 2)
    try:
        yield started
    finally:
        for each in started:
            each.stop()


def dollars_left(client: redis.Redis, tenant: str) -> float:
    held = client.hget(f"smg:budget:rule\x1fauth:{tenant}\x1fspend", "dollars")
    assert held is not None, f"no money bucket for {tenant}"
    return float(held)


def test_two_replicas_spend_one_tenants_money(
    replicas: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    engine_control.script(default={"text": "ok"})
    start = time.time()
    served, refused = spend_until_refused([r.url for r in replicas], "spender")
    elapsed = time.time() - start
    assert assert_tenant_refusal(refused) >= 1
    assert len(served) >= 2
    spent = sum(map(cost, served))
    left = dollars_left(redis_client, "spender")
    assert BUDGET_USD - spent - 1e-9 <= left <= BUDGET_USD - spent + elapsed * BUDGET_USD / 60 + 1e-9
    assert left < served[0]["input_tokens"] * INPUT_USD  # the refused prompt did not fit
    assert 0 < redis_client.pttl("smg:budget:rule\x1fauth:spender\x1fspend") <= 61_000


def test_a_long_answer_on_one_replica_leaves_the_tenant_in_debt_on_the_other(
    replicas: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    first, second = replicas
    engine_control.script({"text": LONG})
    start = time.time()
    spent = httpx.post(f"{first.url}/v1/messages", json=BODY, headers=key("debtor"), timeout=30)
    assert spent.status_code == 200, spent.text
    engine_control.script({"text": "ok"})
    refused = httpx.post(f"{second.url}/v1/messages", json=BODY, headers=key("debtor"), timeout=30)
    elapsed = time.time() - start
    charged = cost(spent.json()["usage"])
    left = dollars_left(redis_client, "debtor")
    assert left < 0 and BUDGET_USD - charged - 1e-9 <= left <= BUDGET_USD - charged + elapsed * BUDGET_USD / 60
    assert assert_tenant_refusal(refused) > 60  # minutes of refill to pay the debt back
    # The debt is written with the expiry of a bucket that is full only once it is paid back.
    assert redis_client.pttl("smg:budget:rule\x1fauth:debtor\x1fspend") > 60_000
