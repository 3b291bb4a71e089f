"""Tenant budgets in Redis (`--tenant-rate-limit-state redis://…`): replicas in front of the
scripted engine, sharing one real redis-server, draw from one budget; the buckets outlive a
replica's restart and Redis's own (it persists with appendonly); with Redis stopped the
gates fail closed or open as `--redis-failure-mode` says, never with a 500."""

from __future__ import annotations

import concurrent.futures
import math
import re
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import redis

from journal.events import Admission, Rejected
from tests.admission.conftest import MODEL, QWEN3, events_until, new_id
from tests.fleet_redis.conftest import eventually
from tools.engine_control import EngineControl
from tools.servers.redis import RedisServer
from tools.spawn import Spawned, free_port, spawn_gateway, spawn_together

USER = [{"role": "user", "content": "Say hello."}]
LONG = " ".join(["word"] * 100)  # 200 output tokens
POLICY = """
default_policy: {tokens_per_minute: 100000, requests_per_minute: 6000}
tenants:
  - {tenant_key: "auth:three", tokens_per_minute: 100000, requests_per_minute: 3}
  - {tenant_key: "auth:debtor", tokens_per_minute: 60, requests_per_minute: 600}
  - {tenant_key: "auth:tokens", tokens_per_minute: 100, requests_per_minute: 6000}
"""
TENANTS = ("three", "debtor", "tokens", "other")
BODY = {"model": MODEL, "max_tokens": 400, "messages": USER}


def key(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant}"}


@pytest.fixture(scope="module")
def limits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("redis-budgets") / "limits.yaml"
    path.write_text(POLICY)
    return path


def replica(engine: Spawned, limits: Path, state: str, *flags: str, journal: Path | None = None) -> Spawned:
    keys = [arg for t in TENANTS for arg in ("--tenant-api-key", f"{t}:key-{t}")]
    return spawn_gateway(
        [engine.url],
        journal=journal,
        extra=[
            "--model-path", str(QWEN3), *keys,
            "--tenant-rate-limit-enabled", "--tenant-rate-limit-config", str(limits),
            "--tenant-rate-limit-state", state, *flags,
        ],
    )  # fmt: skip


@pytest.fixture
def replicas(adm_engine: Spawned, limits: Path, redis_server: RedisServer) -> Iterator[list[Spawned]]:
    started = spawn_together([partial(replica, adm_engine, limits, redis_server.url)] * 3)
    try:
        yield started
    finally:
        for each in started:
            each.stop()


def test_three_replicas_give_a_tenant_one_budget(
    replicas: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    engine_control.script(default={"text": "ok"})
    start = time.monotonic()
    # 12 requests at once, 4 on each replica: the tenant's 3 requests a minute are one budget.
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(
            pool.map(
                lambda i: httpx.post(f"{replicas[i % 3].url}/v1/messages", json=BODY, headers=key("three"), timeout=30),
                range(12),
            )
        )
    elapsed = time.monotonic() - start
    served = [a for a in answers if a.status_code == 200]
    refused = [a for a in answers if a.status_code != 200]
    # The bucket refills 3 a minute: one more request could fit each 20 s the burst took.
    assert 3 <= len(served) <= 3 + math.floor(elapsed / 20), [a.status_code for a in answers]
    assert all(a.status_code == 429 for a in refused)
    assert {a.headers["x-smg-error-code"] for a in refused} == {"tenant_rate_limit_exceeded"}
    assert len(engine_control.received()) == len(served)
    bucket = redis_client.hgetall("smg:budget:tenant\x1fauth:three")
    assert float(bucket["requests"]) < 1
    assert 0 < redis_client.pttl("smg:budget:tenant\x1fauth:three") <= 61_000  # expires once full again


def test_concurrent_reservations_on_three_replicas_never_spend_more_than_the_budget(
    replicas: list[Spawned], engine_control: EngineControl, redis_client: redis.Redis
) -> None:
    engine_control.script(default={"text": "ok"})
    measured = httpx.post(f"{replicas[0].url}/v1/messages", json=BODY, headers=key("other"), timeout=30)
    prompt = measured.json()["usage"]["input_tokens"]
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(
            pool.map(
                lambda i: httpx.post(
                    f"{replicas[i % 3].url}/v1/messages", json=BODY, headers=key("tokens"), timeout=30
                ),
                range(12),
            )
        )
    elapsed = time.monotonic() - start
    served = [a for a in answers if a.status_code == 200]
    # Each admission debits its prompt from the one bucket (100 a minute, refilling): the
    # prompts admitted fit in it; only the answers' few output tokens can go past it.
    assert 1 <= len(served) <= (100 + elapsed * 100 / 60) // prompt, [a.status_code for a in answers]
    assert all(a.status_code == 429 for a in answers if a.status_code != 200)
    output = sum(a.json()["usage"]["output_tokens"] for a in served)
    tokens = float(redis_client.hget("smg:budget:tenant\x1fauth:tokens", "tokens") or "nan")
    assert tokens >= 100 - len(served) * prompt - output


def test_debt_settled_on_one_replica_is_seen_by_the_others_and_survives_restarts(
    adm_engine: Spawned,
    limits: Path,
    replicas: list[Spawned],
    engine_control: EngineControl,
    redis_server: RedisServer,
    redis_client: redis.Redis,
) -> None:
    first, second, _ = replicas
    engine_control.script({"text": LONG})
    spent = httpx.post(f"{first.url}/v1/messages", json=BODY, headers=key("debtor"), timeout=30)
    assert spent.status_code == 200, spent.text
    usage = spent.json()["usage"]
    tokens = float(redis_client.hget("smg:budget:tenant\x1fauth:debtor", "tokens") or "nan")
    # 60 tokens a minute, the whole usage charged: in debt by about what the answer used.
    assert 60 - usage["input_tokens"] - usage["output_tokens"] <= tokens < 60 - usage["output_tokens"]
    other = httpx.post(f"{second.url}/v1/messages", json=BODY, headers=key("debtor"), timeout=30)
    assert other.status_code == 429 and int(other.headers["retry-after"]) > 60, other.text
    # A restarted replica resumes the buckets.
    first.stop()
    replicas[0] = first = replica(adm_engine, limits, redis_server.url)
    again = httpx.post(f"{first.url}/v1/messages", json=BODY, headers=key("debtor"), timeout=30)
    assert again.status_code == 429 and int(again.headers["retry-after"]) > 60
    # So does a restarted Redis that persists, whose script cache is empty (EVALSHA → NOSCRIPT → load).
    redis_server.restart()
    assert redis_client.script_exists("0" * 40) == [False]
    after = httpx.post(f"{first.url}/v1/messages", json=BODY, headers=key("debtor"), timeout=30)
    assert after.status_code == 429 and int(after.headers["retry-after"]) > 60, after.text
    assert len(engine_control.received()) == 1


def _metric(url: str, name: str) -> float:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    found = re.search(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, f"{name} not in metrics:\n{text}"
    return float(found.group(1))


def test_redis_down_fails_closed_with_one_log_line_and_resumes_when_it_returns(
    adm_engine: Spawned,
    limits: Path,
    engine_control: EngineControl,
    redis_server: RedisServer,
    tmp_path: Path,
) -> None:
    engine_control.script(default={"text": "ok"})
    metrics = free_port()
    journal = tmp_path / "journal.db"
    gateway = replica(adm_engine, limits, redis_server.url, "--prometheus-port", str(metrics), journal=journal)
    try:
        metrics_url = f"http://127.0.0.1:{metrics}"
        assert httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=key("other"), timeout=30).status_code == 200
        assert _metric(metrics_url, "smg_redis_up") == 1
        redis_server.stop()
        ids = [new_id() for _ in range(3)]
        for rid in ids:
            down = httpx.post(
                f"{gateway.url}/v1/messages", json=BODY, headers={**key("other"), "x-request-id": rid}, timeout=30
            )
            assert down.status_code == 503, down.text
            assert down.headers["x-smg-error-code"] == "shared_state_unavailable"
            assert down.headers["retry-after"] == "2"
            assert down.json()["error"]["type"] == "overloaded_error"
        assert gateway.log().count("is unreachable") == 1, gateway.log()
        assert _metric(metrics_url, "smg_redis_up") == 0
        assert _metric(metrics_url, "smg_redis_errors_total") >= 3
        events = events_until(journal, ids[0], "completed")
        [gate] = [e for e in events if isinstance(e, Admission)]
        assert gate.decision == "unavailable"
        assert [(r.status, r.code) for r in events if isinstance(r, Rejected)] == [(503, "shared_state_unavailable")]
        redis_server.start()
        # The link's probe notices the server back; until then requests are refused at once.
        eventually(lambda: "is reachable again" in gateway.log(), what="Redis seen back")
        back = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=key("other"), timeout=30)
        assert back.status_code == 200, back.text
        assert _metric(metrics_url, "smg_redis_up") == 1
    finally:
        gateway.stop()


def test_redis_down_fails_open_when_told(
    adm_engine: Spawned, limits: Path, engine_control: EngineControl, redis_server: RedisServer
) -> None:
    engine_control.script(default={"text": "ok"})
    gateway = replica(adm_engine, limits, redis_server.url, "--redis-failure-mode", "open")
    try:
        redis_server.stop()
        for _ in range(2):
            answer = httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=key("three"), timeout=30)
            assert answer.status_code == 200, answer.text
        assert gateway.log().count("is unreachable") == 1
        assert "admit uncharged" in gateway.log()
        redis_server.start()
        eventually(
            lambda: (
                httpx.post(f"{gateway.url}/v1/messages", json=BODY, headers=key("three"), timeout=30).status_code == 200
            ),
            what="served with Redis back",
        )
    finally:
        gateway.stop()
