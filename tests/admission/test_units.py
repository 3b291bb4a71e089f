"""The admission gates' logic without sockets: the policy file's rules, the bucket arithmetic,
two ledgers on one SQLite file, the key table, and the wait queue's order."""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import re
from pathlib import Path

import pytest

from journal.prices import load as load_prices
from smg.admission.concurrency import ConcurrencyConfig, Limiter
from smg.admission.ledger import Bucket, MemoryLedger, SqliteLedger, decide, refill
from smg.admission.policy import Limits, PolicyError, Scope, compile_policy, load_policy
from smg.admission.refusal import Refused
from smg.admission.tenants import Keys, TenantConfig, parse_tenant_keys
from smg.protocol.errors import ApiError

BASE = {"default_policy": {"tokens_per_minute": 100, "requests_per_minute": 10}}


def _tenant(**extra: object) -> dict[str, object]:
    return {"tenant_key": "auth:red", "tokens_per_minute": 50, "requests_per_minute": 5, **extra}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({**BASE, "tenant": []}, "unknown key(s) tenant"),
        ({"default_policy": {"tokens_per_minute": 0, "requests_per_minute": 1}}, "tokens_per_minute must be > 0"),
        ({"default_policy": {**BASE["default_policy"], "tenant_key": "auth:x"}}, "must not set tenant_key"),
        ({**BASE, "tenants": [{"tokens_per_minute": 1, "requests_per_minute": 1}]}, "missing tenant_key"),
        ({**BASE, "tenants": [_tenant(tenant_key="red")]}, "is not a tenant key a request can have"),
        ({**BASE, "tenants": [_tenant(tenant_key="ip:010.0.0.1")]}, "is not a tenant key"),
        ({**BASE, "tenants": [_tenant(tenant_key=" auth:red")]}, "surrounding whitespace"),
        ({**BASE, "tenants": [_tenant(), _tenant()]}, "duplicate tenant_key"),
        ({**BASE, "tenants": [_tenant(tenant_key="header:team")]}, "--trust-tenant-header"),
        (
            {**BASE, "tenants": [_tenant(model_rules=[{"rule_id": "a b", "matcher": {}}])]},
            "must match [A-Za-z0-9._-]+",
        ),
        (
            {
                **BASE,
                "tenants": [
                    _tenant(
                        model_rules=[
                            {
                                "rule_id": r,
                                "matcher": {"type": "prefix", "value": "q"},
                                "tokens_per_minute": 1,
                                "requests_per_minute": 1,
                            }
                            for r in ("one", "two")
                        ]
                    )
                ],
            },
            "matcher duplicates rule 'one'",
        ),
    ],
)
def test_a_config_that_cannot_mean_what_it_says_is_refused(data: dict[str, object], message: str) -> None:
    with pytest.raises(PolicyError, match=re.escape(message)):
        compile_policy(data)


def test_scopes_exact_rule_beats_prefix_and_the_longest_prefix_wins(tmp_path: Path) -> None:
    rule = {"tokens_per_minute": 5, "requests_per_minute": 1}
    path = tmp_path / "limits.yaml"
    path.write_text(
        "default_policy: {tokens_per_minute: 100, requests_per_minute: 10}\n"
        "tenants:\n"
        "  - tenant_key: auth:red\n    tokens_per_minute: 50\n    requests_per_minute: 5\n    model_rules:\n"
        + "".join(
            f"      - {{rule_id: {rid}, matcher: {{type: {kind}, value: {value}}}, tokens_per_minute: "
            f"{rule['tokens_per_minute']}, requests_per_minute: {rule['requests_per_minute']}}}\n"
            for rid, kind, value in (
                ("short", "prefix", "qwen"),
                ("long", "prefix", "qwen3-"),
                ("exact", "exact", "qwen3-8b"),
            )
        )
    )
    policy = load_policy(path)
    assert [s.key.split("\x1f")[-1] for s in policy.scopes("auth:red", "qwen3-8b")] == ["auth:red", "exact"]
    assert [s.key.split("\x1f")[-1] for s in policy.scopes("auth:red", "qwen3-32b")] == ["auth:red", "long"]
    assert [s.key.split("\x1f")[-1] for s in policy.scopes("auth:red", "llama")] == ["auth:red"]
    assert [s.limits for s in policy.scopes("auth:blue", "qwen3-8b")] == [Limits(100, 10)]


def test_the_example_config_loads() -> None:
    prices = load_prices(Path(__file__).with_name("prices-example.toml"))
    policy = load_policy(Path(__file__).with_name("limits-example.yaml"), prices=prices)
    assert [s.limits for s in policy.scopes("auth:team-red", "qwen3-8b")] == [Limits(500000, 3000), Limits(50000, 100)]
    assert policy.scopes("auth:team-red", "qwen3-32b")[1].limits == Limits(200000, 600, 0.5)


def test_bucket_arithmetic() -> None:
    limits = Limits(60, 6)  # one token and a tenth of a request per second
    assert refill(Bucket(-30.0, 0.0, 100.0), limits, 130.0) == Bucket(0.0, 3.0, 130.0)
    assert refill(Bucket(50.0, 6.0, 100.0), limits, 200.0) == Bucket(60.0, 6.0, 200.0)  # capped
    assert refill(Bucket(10.0, 1.0, 100.0), limits, 90.0) == Bucket(10.0, 1.0, 100.0)  # clock stepped back
    assert decide(Bucket(10.0, 1.0, 0.0), limits, 10).allowed
    assert decide(Bucket(10.0, 1.0, 0.0), limits, 25).retry_after == 15
    assert decide(Bucket(10.0, 0.5, 0.0), limits, 5).retry_after == 5  # waiting for the request
    assert decide(Bucket(60.0, 6.0, 0.0), limits, 61).retry_after is None  # never fits


def test_two_ledgers_on_one_file_share_the_buckets(tmp_path: Path) -> None:
    scopes = [Scope("tenant\x1fauth:red", Limits(100, 10))]

    async def run() -> None:
        one, two = SqliteLedger(tmp_path / "state.db"), SqliteLedger(tmp_path / "state.db")
        try:
            assert (await one.reserve(scopes, 60, now=1000.0)).allowed
            assert not (await two.reserve(scopes, 60, now=1000.0)).allowed
            await two.settle(scopes, -30, now=1000.0)  # a response used less than reserved
            assert (await one.reserve(scopes, 60, now=1000.0)).allowed
        finally:
            one.close()
            two.close()
        again = SqliteLedger(tmp_path / "state.db")  # a restart resumes the buckets
        try:
            assert (await again.reserve(scopes, 10, now=1000.0)).allowed
            assert (await again.reserve(scopes, 10, now=1000.0)).allowed is False
        finally:
            again.close()
        memory = MemoryLedger()
        assert (await memory.reserve(scopes, 100, now=0.0)).allowed
        await memory.settle(scopes, 50, now=0.0)
        assert (await memory.reserve(scopes, 1, now=0.0)).retry_after == 31

    asyncio.run(run())


def test_keys_tenants_and_admin() -> None:
    keys = Keys("shared", parse_tenant_keys(("red:r-key", "blue:b:key"), "shared"), TenantConfig(), b"s" * 32)
    assert keys.caller({"authorization": "bearer r-key"}, "1.2.3.4").tenant == "auth:red"
    assert keys.caller({"authorization": "Bearer b:key"}, None).tenant == "auth:blue"
    assert (
        keys.caller({"authorization": "Bearer shared"}, None).tenant
        == "auth:" + hmac.new(b"s" * 32, b"shared", hashlib.sha256).hexdigest()
    )
    keys.admin({"authorization": "Bearer shared"})
    with pytest.raises(ApiError) as refused:
        keys.admin({"authorization": "Bearer r-key"})
    assert refused.value.status == 401
    assert keys.tenant({"authorization": "Bearer nope"}, "1.2.3.4") == "ip:1.2.3.4"
    for bad, said in (
        ("nocolon", "missing ':'"),
        (":k", "tenant id is empty"),
        ("t:", "key is empty"),
        ("t:shared", "the shared --api-key"),
    ):
        with pytest.raises(ValueError, match=re.escape(said)):
            parse_tenant_keys((bad,), "shared")
    with pytest.raises(ValueError, match="the same key as tenant a"):
        parse_tenant_keys(("a:k", "b:k"), None)
    header = Keys(None, {}, TenantConfig(trust_header=True))
    assert header.caller({"x-smg-tenant-id": " team "}, "1.2.3.4").tenant == "header:team"
    assert header.caller({}, None).tenant == "anonymous"


def test_the_queue_serves_waiters_in_order_and_a_cancelled_waiter_loses_its_place() -> None:
    async def run() -> list[str]:
        limiter = Limiter(ConcurrencyConfig(max_concurrent_requests=1, queue_size=3, queue_timeout_secs=30))
        order: list[str] = []
        await limiter.acquire()

        async def waiter(name: str) -> None:
            await limiter.acquire()
            order.append(name)
            limiter.release()

        tasks = {name: asyncio.create_task(waiter(name)) for name in ("a", "b", "c")}
        while limiter.waiting < 3:
            await asyncio.sleep(0)
        with pytest.raises(Refused) as full:
            await limiter.acquire()
        assert full.value.code == "admission_queue_full"
        tasks["b"].cancel()
        limiter.release()
        await asyncio.gather(*tasks.values(), return_exceptions=True)
        assert limiter.in_use == 0 and limiter.waiting == 0
        return order

    assert asyncio.run(run()) == ["a", "c"]


def test_the_timeline_describes_admission_events() -> None:
    from journal.events import Admission, Settled
    from journal.summary import describe

    assert (
        describe(Admission(gate="concurrency", decision="admitted", queued_ms=12.5))
        == "concurrency admitted queued=12.5ms"
    )
    denied = Admission(gate="tenant_rate_limit", decision="denied", tenant="auth:red", retry_after=30)
    assert describe(denied) == "tenant_rate_limit denied retry_after=30s tenant=auth:red"
    settled = Settled(tenant="auth:red", reserved_tokens=13, input_tokens=13, output_tokens=40, delta=40)
    assert describe(settled) == "+40 tokens (input=13 output=40 reserved=13) tenant=auth:red"
