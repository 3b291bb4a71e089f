"""Tenant token budgets over loopback: gateways with `--tenant-rate-limit-*` in front of the
scripted engine, each tenant a key of its own, the budgets in a SQLite state file the test
reads back."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from journal.events import Admission, Completed, Rejected, Settled
from tests.admission.conftest import MODEL, QWEN3, events_until, new_id
from tests.conftest import MODEL as RELAY_MODEL
from tests.conftest import Scripted, wait_for_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_gateway

USER = [{"role": "user", "content": "Say hello."}]
LONG = " ".join(["word"] * 100)  # 200 output tokens
POLICY = """
default_policy: {tokens_per_minute: 6000, requests_per_minute: 600}
tenants:
  - {tenant_key: "auth:debtor", tokens_per_minute: 60, requests_per_minute: 600}
  - {tenant_key: "auth:tiny", tokens_per_minute: 5, requests_per_minute: 600}
  - {tenant_key: "auth:onereq", tokens_per_minute: 6000, requests_per_minute: 1}
  - {tenant_key: "auth:shared", tokens_per_minute: 60, requests_per_minute: 600}
"""
TENANTS = ("debtor", "tiny", "onereq", "shared", "streamer", "cutter", "other")


def key(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer key-{tenant}"}


def _flags(config: Path, state: Path) -> list[str]:
    keys = [arg for t in TENANTS for arg in ("--tenant-api-key", f"{t}:key-{t}")]
    return [
        "--model-path",
        str(QWEN3),
        *keys,
        "--tenant-rate-limit-enabled",
        "--tenant-rate-limit-config",
        str(config),
        "--tenant-rate-limit-state",
        str(state),
    ]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("adm-budgets")
    (root / "limits.yaml").write_text(POLICY)
    return root / "limits.yaml", root / "state.db"


@pytest.fixture(scope="module")
def budgeted(adm_engine: Spawned, files: tuple[Path, Path]) -> Iterator[tuple[Spawned, Path]]:
    journal = files[0].parent / "journal.db"
    proc = spawn_gateway([adm_engine.url], journal=journal, extra=_flags(*files))
    try:
        yield proc, journal
    finally:
        proc.stop()


def bucket(state: Path, tenant: str) -> tuple[float, float]:
    """(tokens, requests) the state file holds for the tenant's scope."""
    with sqlite3.connect(state) as db:
        row = db.execute("SELECT tokens, requests FROM buckets WHERE key = ?", (f"tenant\x1fauth:{tenant}",)).fetchone()
    assert row is not None, f"no bucket for {tenant}"
    return float(row[0]), float(row[1])


def _gates(events: list[object]) -> list[Admission]:
    return [e for e in events if isinstance(e, Admission) and e.gate == "tenant_rate_limit"]


def test_the_real_usage_is_settled_into_debt_and_the_next_request_is_refused(
    budgeted: tuple[Spawned, Path], engine_control: EngineControl
) -> None:
    gateway, journal = budgeted
    engine_control.script({"text": LONG})
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        body = {"model": MODEL, "max_tokens": 400, "messages": USER}
        first = client.post("/v1/messages", json=body, headers={**key("debtor"), "x-request-id": (one := new_id())})
        assert first.status_code == 200, first.text
        usage = first.json()["usage"]
        second = client.post("/v1/messages", json=body, headers={**key("debtor"), "x-request-id": (two := new_id())})
        # Another tenant's budget is its own.
        engine_control.script({"text": "ok"})
        assert client.post("/v1/messages", json=body, headers=key("other")).status_code == 200
    events = wait_for_events(journal, one)
    [gate] = _gates(events)
    assert gate.decision == "admitted" and gate.tenant == "auth:debtor"
    assert gate.reserved_tokens == usage["input_tokens"]
    [settled] = [e for e in events if isinstance(e, Settled)]
    assert (settled.input_tokens, settled.output_tokens) == (usage["input_tokens"], usage["output_tokens"])
    assert settled.delta == usage["output_tokens"]
    # 60 tokens a minute, ~200 used beyond the reservation: the tenant is in debt for minutes.
    assert second.status_code == 429, second.text
    assert second.json()["error"] == {
        "type": "rate_limit_error",
        "message": "Tenant rate limit exceeded for this request",
    }
    assert second.headers["x-smg-error-code"] == "tenant_rate_limit_exceeded"
    assert int(second.headers["retry-after"]) > 60
    refused = wait_for_events(journal, two)
    [denied] = _gates(refused)
    assert denied.decision == "denied" and denied.retry_after == int(second.headers["retry-after"])
    assert [(r.status, r.code) for r in refused if isinstance(r, Rejected)] == [(429, "tenant_rate_limit_exceeded")]
    assert not any(e.kind == "routed" for e in refused)
    assert [e.kind for e in events if e.kind in ("routed", "rendered", "admission")] == [
        "routed",
        "rendered",
        "admission",
    ]
    assert len(engine_control.received()) == 2  # the refused request never reached the engine


def test_a_streamed_request_is_settled_when_its_stream_ends(
    budgeted: tuple[Spawned, Path], files: tuple[Path, Path], engine_control: EngineControl
) -> None:
    gateway, journal = budgeted
    engine_control.script({"text": LONG})
    start = time.time()
    body = {"model": MODEL, "max_tokens": 400, "messages": USER, "stream": True}
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        streamed = client.post(
            "/v1/messages", json=body, headers={**key("streamer"), "x-request-id": (rid := new_id())}
        )
        assert streamed.status_code == 200 and "event: message_stop" in streamed.text
    elapsed = time.time() - start
    events = wait_for_events(journal, rid)
    [gate] = _gates(events)
    [settled] = [e for e in events if isinstance(e, Settled)]
    assert settled.reserved_tokens == gate.reserved_tokens and settled.output_tokens > 150
    tokens, requests = bucket(files[1], "streamer")
    charged = settled.input_tokens + settled.output_tokens
    # The default policy's 6000 a minute, less what was charged, plus at most the refill since.
    assert 6000 - charged <= tokens <= 6000 - charged + elapsed * 100 + 1
    assert requests <= 600 - 1 + elapsed * 10 + 0.01


def test_a_stream_cut_off_by_the_client_keeps_only_its_reservation(
    budgeted: tuple[Spawned, Path], files: tuple[Path, Path], engine_control: EngineControl
) -> None:
    gateway, journal = budgeted
    engine_control.script({"text": LONG, "hold_after": 5})
    body = {"model": MODEL, "max_tokens": 400, "messages": USER, "stream": True}
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        headers = {**key("cutter"), "x-request-id": (rid := new_id())}
        with client.stream("POST", "/v1/messages", json=body, headers=headers) as response:
            assert response.status_code == 200
            assert next(response.iter_lines()).startswith("event: message_start")
    events = wait_for_events(journal, rid)
    assert isinstance(events[-1], Completed) and events[-1].disconnected
    [gate] = _gates(events)
    assert gate.reserved_tokens is not None and not any(isinstance(e, Settled) for e in events)
    # Reserved from a full bucket and never written again: exactly the prompt was charged.
    assert bucket(files[1], "cutter") == (6000 - gate.reserved_tokens, 599)


def test_max_tokens_zero_and_count_tokens_reserve_nothing(
    budgeted: tuple[Spawned, Path], engine_control: EngineControl
) -> None:
    gateway, journal = budgeted
    engine_control.script({"text": "ok"})
    zero = {"model": MODEL, "max_tokens": 0, "messages": USER}
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        free = []
        for _ in range(2):
            for path, body in (
                ("/v1/messages", zero),
                ("/v1/messages/count_tokens", {"model": MODEL, "messages": USER}),
            ):
                free.append(rid := new_id())
                answer = client.post(path, json=body, headers={**key("onereq"), "x-request-id": rid})
                assert answer.status_code == 200, answer.text
        # One request a minute, still unspent: the first real request is admitted, the next is not.
        assert client.post("/v1/messages", json={**zero, "max_tokens": 8}, headers=key("onereq")).status_code == 200
        again = client.post("/v1/messages", json={**zero, "max_tokens": 8}, headers=key("onereq"))
    assert again.status_code == 429 and again.headers["x-smg-error-code"] == "tenant_rate_limit_exceeded"
    assert int(again.headers["retry-after"]) > 30
    for rid in free:
        assert not _gates(wait_for_events(journal, rid))


def test_a_prompt_larger_than_the_whole_budget_is_refused_without_retry_after(
    budgeted: tuple[Spawned, Path],
) -> None:
    gateway, journal = budgeted
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        body = {"model": MODEL, "max_tokens": 8, "messages": USER}
        refused = client.post("/v1/messages", json=body, headers={**key("tiny"), "x-request-id": (rid := new_id())})
    assert refused.status_code == 429 and "retry-after" not in refused.headers
    [gate] = _gates(events_until(journal, rid, "completed"))
    assert gate.decision == "denied" and gate.retry_after is None


def test_gateways_sharing_a_state_file_and_a_restarted_one_draw_from_one_budget(
    adm_engine: Spawned, files: tuple[Path, Path], engine_control: EngineControl
) -> None:
    config, _ = files
    state = config.parent / "shared-state.db"
    engine_control.script({"text": LONG})
    body = {"model": MODEL, "max_tokens": 400, "messages": USER}
    first = spawn_gateway([adm_engine.url], extra=_flags(config, state))
    second = spawn_gateway([adm_engine.url], extra=_flags(config, state))
    try:
        spent = httpx.post(f"{first.url}/v1/messages", json=body, headers=key("shared"), timeout=30.0)
        assert spent.status_code == 200, spent.text
        other = httpx.post(f"{second.url}/v1/messages", json=body, headers=key("shared"), timeout=30.0)
        assert other.status_code == 429 and int(other.headers["retry-after"]) > 60
    finally:
        first.stop()
        second.stop()
    restarted = spawn_gateway([adm_engine.url], extra=_flags(config, state))
    try:
        again = httpx.post(f"{restarted.url}/v1/messages", json=body, headers=key("shared"), timeout=30.0)
        assert again.status_code == 429 and int(again.headers["retry-after"]) > 60
    finally:
        restarted.stop()
    assert len(engine_control.received()) == 1


def test_relayed_requests_are_not_charged(worker: Spawned, scripted: Scripted, files: tuple[Path, Path]) -> None:
    """As the reference: the budgets cover what the gateway generates itself, not an HTTP worker's answers."""
    journal = files[0].parent / "relay-journal.db"
    proc = spawn_gateway([worker.url], journal=journal, extra=_flags(*files)[2:])
    try:
        body = {"model": RELAY_MODEL, "max_tokens": 8, "messages": USER}
        for _ in range(2):
            rid = new_id()
            answer = httpx.post(f"{proc.url}/v1/messages", json=body, headers={**key("tiny"), "x-request-id": rid})
            assert answer.status_code == 200, answer.text
            assert not _gates(wait_for_events(journal, rid))
    finally:
        proc.stop()
