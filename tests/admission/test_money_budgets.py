"""Budgets stated in money: a model rule's `dollars_per_minute`, spent at the `--price-table`
prices, over loopback in front of the scripted engine with the budgets in a SQLite state file;
the policy checks that refuse a money limit nothing prices; the bucket arithmetic in dollars."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Admission, Settled
from journal.prices import parse
from journal.reader import JournalReader
from smg.admission.ledger import Bucket, MemoryLedger, SqliteLedger, decide
from smg.admission.policy import Limits, PolicyError, Scope, compile_policy
from tests.admission.conftest import MODEL, QWEN3, new_id
from tests.conftest import wait_for_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_gateway

USER = [{"role": "user", "content": "Say hello."}]
LONG = " ".join(["word"] * 100)  # 200 output tokens
BODY = {"model": MODEL, "max_tokens": 400, "messages": USER}
INPUT_USD, OUTPUT_USD = 0.001, 0.002  # a token of each, by PRICES
PRICES = f'[models."{MODEL}"]\ninput = 1000.0\noutput = 2000.0\n'
BUDGET_USD = 0.1  # a minute, for each tenant's rule below
TENANTS = ("spender", "debtor")
POLICY = "default_policy: {tokens_per_minute: 1000000, requests_per_minute: 6000}\ntenants:\n" + "".join(
    f"""  - tenant_key: "auth:{tenant}"
    tokens_per_minute: 1000000
    requests_per_minute: 6000
    model_rules:
      - rule_id: spend
        matcher: {{type: exact, value: "{MODEL}"}}
        tokens_per_minute: 1000000
        requests_per_minute: 6000
        dollars_per_minute: {BUDGET_USD}
"""
    for tenant in TENANTS
)


def key(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant}"}


def cost(usage: dict[str, Any]) -> float:
    return usage["input_tokens"] * INPUT_USD + usage["output_tokens"] * OUTPUT_USD


def write_files(root: Path, prices: str = PRICES, policy: str = POLICY) -> tuple[Path, Path]:
    (root / "prices.toml").write_text(prices)
    (root / "limits.yaml").write_text(policy)
    return root / "prices.toml", root / "limits.yaml"


def gateway_flags(prices: Path, limits: Path, state: str) -> list[str]:
    keys = [arg for t in (*TENANTS, "other") for arg in ("--tenant-api-key", f"{t}:key-{t}")]
    return [
        "--model-path", str(QWEN3), *keys, "--price-table", str(prices),
        "--tenant-rate-limit-enabled", "--tenant-rate-limit-config", str(limits),
        "--tenant-rate-limit-state", state,
    ]  # fmt: skip


def spend_until_refused(urls: list[str], tenant: str) -> tuple[list[dict[str, Any]], httpx.Response]:
    """Requests (round robin over `urls`) until one is refused: the usages served, and the refusal."""
    served: list[dict[str, Any]] = []
    with httpx.Client(timeout=30.0) as client:
        for i in range(60):
            answer = client.post(f"{urls[i % len(urls)]}/v1/messages", json=BODY, headers=key(tenant))
            if answer.status_code != 200:
                return served, answer
            served.append(answer.json()["usage"])
    raise AssertionError(f"60 requests costing {sum(map(cost, served))} all admitted")


def assert_tenant_refusal(refused: httpx.Response) -> int:
    assert refused.status_code == 429, refused.text
    envelope = refused.json()
    assert envelope["type"] == "error"
    assert envelope["error"] == {"type": "rate_limit_error", "message": "Tenant rate limit exceeded for this request"}
    assert refused.headers["x-smg-error-code"] == "tenant_rate_limit_exceeded"
    return int(refused.headers["retry-after"])


@pytest.fixture(scope="module")
def money(adm_engine: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spawned, Path, Path]]:
    root = tmp_path_factory.mktemp("adm-money")
    state, journal = root / "state.db", root / "journal.db"
    proc = spawn_gateway([adm_engine.url], journal=journal, extra=gateway_flags(*write_files(root), str(state)))
    try:
        yield proc, state, journal
    finally:
        proc.stop()


def dollars_left(state: Path, tenant: str) -> float:
    with sqlite3.connect(state) as db:
        row = db.execute("SELECT dollars FROM buckets WHERE key = ?", (f"rule\x1fauth:{tenant}\x1fspend",)).fetchone()
    assert row is not None, f"no money bucket for {tenant}"
    return float(row[0])


def test_requests_are_admitted_until_the_money_is_spent(
    money: tuple[Spawned, Path, Path], engine_control: EngineControl
) -> None:
    gateway, state, _ = money
    engine_control.script(default={"text": "ok"})
    start = time.time()
    served, refused = spend_until_refused([gateway.url], "spender")
    elapsed = time.time() - start
    assert_tenant_refusal(refused) >= 1
    assert len(served) >= 2 and len(engine_control.received()) == len(served)
    spent = sum(map(cost, served))
    prompt = served[0]["input_tokens"] * INPUT_USD
    # Each admission needed its prompt's cost still in the bucket; only the answers go past it.
    assert (
        BUDGET_USD - prompt < spent <= BUDGET_USD + elapsed * BUDGET_USD / 60 + served[-1]["output_tokens"] * OUTPUT_USD
    )
    # The bucket holds the budget less each request's actual cost (plus the refill since),
    # and less than the next prompt's cost.
    left = dollars_left(state, "spender")
    assert BUDGET_USD - spent - 1e-9 <= left <= BUDGET_USD - spent + elapsed * BUDGET_USD / 60 + 1e-9
    assert left < prompt


def test_a_long_answer_settles_the_money_into_debt(
    money: tuple[Spawned, Path, Path], engine_control: EngineControl
) -> None:
    gateway, state, journal = money
    engine_control.script({"text": LONG})
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        start = time.time()
        first = client.post("/v1/messages", json=BODY, headers={**key("debtor"), "x-request-id": (rid := new_id())})
        assert first.status_code == 200, first.text
        engine_control.script({"text": "ok"})
        second = client.post(
            "/v1/messages", json=BODY, headers={**key("debtor"), "x-request-id": (refused := new_id())}
        )
        elapsed = time.time() - start
        # Tokens were plenty: the money refused it, and another tenant's money is its own.
        assert client.post("/v1/messages", json=BODY, headers=key("other")).status_code == 200
    usage = first.json()["usage"]
    charged = cost(usage)
    assert charged > 2 * BUDGET_USD  # 200 output tokens
    left = dollars_left(state, "debtor")
    assert BUDGET_USD - charged - 1e-9 <= left <= BUDGET_USD - charged + elapsed * BUDGET_USD / 60 + 1e-9
    # In debt: the next prompt waits for the refill to pay it back first.
    wait = assert_tenant_refusal(second)
    assert wait >= (usage["input_tokens"] * INPUT_USD - left) / (BUDGET_USD / 60) - elapsed - 1 > 60
    events = wait_for_events(journal, rid)
    [settled] = [e for e in events if isinstance(e, Settled)]
    assert settled.delta == usage["output_tokens"]
    # The journal says what was reserved and settled in dollars too, and what the refusal asked.
    [admitted] = [e for e in events if isinstance(e, Admission)]
    prompt_usd = usage["input_tokens"] * INPUT_USD
    assert admitted.decision == "admitted" and admitted.prompt_usd == pytest.approx(prompt_usd)
    assert settled.reserved_usd == pytest.approx(prompt_usd) and settled.cost_usd == pytest.approx(charged)
    assert settled.delta_usd == pytest.approx(charged - prompt_usd)
    [denied] = [e for e in wait_for_events(journal, refused) if isinstance(e, Admission)]
    assert denied.decision == "denied" and denied.reserved_tokens is None
    assert denied.prompt_usd == pytest.approx(prompt_usd)
    with JournalReader(journal) as reader:
        row = reader.get_request(refused)
    assert row is not None and row["model"] == MODEL and row["status"] == 429  # the model it asked for
    shown = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "show", "-j", str(journal), refused],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert f"tenant_rate_limit denied asked=${prompt_usd:.6f}" in shown.stdout
    shown = subprocess.run(
        [sys.executable, "-m", "smg", "journal", "show", "-j", str(journal), rid],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert f"+${charged - prompt_usd:.6f} (cost=${charged:.6f} reserved=${prompt_usd:.6f})" in shown.stdout


def test_a_money_rule_for_a_model_without_a_price_stops_the_launch(tmp_path: Path) -> None:
    prices, limits = write_files(tmp_path, prices='[models."some-other-model"]\ninput = 1.0\n')
    launched = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--no-journal",
         *gateway_flags(prices, limits, str(tmp_path / "state.db"))],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert launched.returncode == 2, launched.stderr
    assert f"dollars_per_minute needs a price for model '{MODEL}' in the price table" in launched.stderr
    assert str(limits) in launched.stderr


def _rule(matcher: dict[str, str], **extra: object) -> dict[str, object]:
    return {
        "default_policy": {"tokens_per_minute": 100, "requests_per_minute": 10},
        "tenants": [
            {
                "tenant_key": "auth:red",
                "tokens_per_minute": 100,
                "requests_per_minute": 10,
                "model_rules": [
                    {"rule_id": "r", "matcher": matcher, "tokens_per_minute": 100, "requests_per_minute": 10, **extra}
                ],
            }
        ],
    }


TABLE = parse({"models": {"qwen3-8b": {"input": 1.0}, "llama-*": {"input": 2.0}}})


@pytest.mark.parametrize(
    ("data", "prices", "message"),
    [
        (_rule({"type": "exact", "value": "qwen3-8b"}, dollars_per_minute=1), None, "needs --price-table"),
        (_rule({"type": "exact", "value": "qwen3-4b"}, dollars_per_minute=1), TABLE, "price for model 'qwen3-4b'"),
        # An exact price for one model of the prefix does not price the others.
        (_rule({"type": "prefix", "value": "qwen3-"}, dollars_per_minute=1), TABLE, "starting with 'qwen3-'"),
        (_rule({"type": "exact", "value": "qwen3-8b"}, dollars_per_minute=0), TABLE, "must be > 0"),
        (_rule({"type": "exact", "value": "qwen3-8b"}, dollars_per_minute="1"), TABLE, "number of dollars"),
        (
            {"default_policy": {"tokens_per_minute": 1, "requests_per_minute": 1, "dollars_per_minute": 1}},
            TABLE,
            "dollars_per_minute belongs in a model rule",
        ),
    ],
)
def test_a_money_limit_is_refused_where_nothing_prices_it(data: Any, prices: Any, message: str) -> None:
    with pytest.raises(PolicyError, match=message.replace("(", r"\(").replace("-", r"\-")):
        compile_policy(data, prices=prices)


def test_a_money_limit_is_accepted_where_every_model_it_matches_has_a_price() -> None:
    for matcher in ({"type": "exact", "value": "qwen3-8b"}, {"type": "prefix", "value": "llama-3"}):
        policy = compile_policy(_rule(matcher, dollars_per_minute=0.5), prices=TABLE)
        [_, rule] = policy.scopes("auth:red", "llama-3-8b" if matcher["type"] == "prefix" else "qwen3-8b")
        assert rule.limits == Limits(100, 10, 0.5)


def test_the_money_bucket_arithmetic() -> None:
    limits = Limits(1000, 100, 0.6)  # a hundredth of a dollar a second
    assert decide(Bucket(1000.0, 100.0, 0.0, 0.05), limits, 10, 0.05).allowed
    assert decide(Bucket(1000.0, 100.0, 0.0, 0.05), limits, 10, 0.08).retry_after == 3
    assert decide(Bucket(1000.0, 100.0, 0.0, 0.6), limits, 10, 0.7).retry_after is None  # never fits
    # A scope without a money limit never looks at dollars.
    assert decide(Bucket(1000.0, 100.0, 0.0, 0.0), Limits(1000, 100), 10, 5.0).allowed

    async def spend() -> None:
        scopes = [Scope("tenant\x1fauth:red", Limits(1000, 100)), Scope("rule\x1fauth:red\x1fr", limits)]
        memory = MemoryLedger()
        assert (await memory.reserve(scopes, 10, 0.0, 0.5)).allowed
        await memory.settle(scopes, 5, 0.0, 0.4)  # the answer cost 0.4 more: 0.3 in debt
        assert (await memory.reserve(scopes, 10, 0.0, 0.01)).retry_after in (31, 32)  # 0.31 at 0.01 a second

    asyncio.run(spend())


def test_a_state_file_from_before_money_budgets_gains_them(tmp_path: Path) -> None:
    path = tmp_path / "old-state.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE buckets (key TEXT PRIMARY KEY, tokens REAL NOT NULL, requests REAL NOT NULL,"
            " updated REAL NOT NULL, token_cap REAL NOT NULL, request_cap REAL NOT NULL)"
        )
        db.execute("INSERT INTO buckets VALUES ('rule\x1fauth:red\x1fr', 40.0, 5.0, 1000.0, 100.0, 10.0)")
    scopes = [Scope("rule\x1fauth:red\x1fr", Limits(100, 10, 0.6))]

    async def spend() -> None:
        ledger = SqliteLedger(path)
        try:
            # The old bucket keeps its tokens, and none of its new money is spent yet.
            assert (await ledger.reserve(scopes, 10, 1000.0, 0.5)).allowed
            assert (await ledger.reserve(scopes, 10, 1000.0, 0.5)).retry_after == 40
        finally:
            ledger.close()

    asyncio.run(spend())
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT tokens, requests, dollars, dollar_cap FROM buckets").fetchall() == [
            (30.0, 4.0, pytest.approx(0.1), 0.6)
        ]
