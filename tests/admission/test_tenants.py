"""Tenant keys on every route, over loopback: a gateway with a shared key and two tenant keys
in front of the scripted HTTP worker, and one with tenant keys only."""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from journal.events import Received
from smg.admission.tenants import TENANT_SECRET_FILE, shared_tenant
from tests.admission.conftest import new_id
from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, free_port, spawn_gateway

SHARED, RED, BLUE = "shared-secret", "red-secret", "secret:with:colons"  # a key may hold colons
BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
COUNT = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
KEYS = ["--tenant-api-key", f"red:{RED}", "--tenant-api-key", f"blue:{BLUE}"]

# (method, path, json body or None, admin?)
ROUTES: list[tuple[str, str, dict[str, object] | None, bool]] = [
    ("POST", "/v1/messages", BODY, False),
    ("POST", "/v1/messages/count_tokens", COUNT, False),
    ("GET", "/v1/models", None, False),
    ("GET", f"/v1/models/{MODEL}", None, False),
    ("GET", "/workers", None, True),
    ("GET", "/workers/no-such-worker", None, True),
    ("POST", "/workers", {"url": "http://127.0.0.1:9"}, True),
    ("GET", "/v1/tokenizers", None, True),
    ("GET", "/v1/tokenizers/no-such-tokenizer", None, True),
]


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.fixture(scope="module")
def keyed(worker: Spawned, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spawned, Path]]:
    journal = tmp_path_factory.mktemp("adm-keys") / "journal.db"
    proc = spawn_gateway([worker.url], journal=journal, extra=["--api-key", SHARED, *KEYS])
    try:
        yield proc, journal
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def tenants_only(worker: Spawned) -> Iterator[Spawned]:
    proc = spawn_gateway([worker.url], extra=KEYS)
    try:
        yield proc
    finally:
        proc.stop()


def _send(
    client: httpx.Client, method: str, path: str, body: dict[str, object] | None, headers: dict[str, str]
) -> httpx.Response:
    return client.request(method, path, json=body, headers={"anthropic-version": "2023-06-01", **headers})


def _assert_401(response: httpx.Response, challenge: str) -> None:
    assert response.status_code == 401, (response.request.url, response.text)
    assert response.headers["www-authenticate"] == challenge
    assert response.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(("method", "path", "body", "admin"), ROUTES, ids=[f"{m} {p}" for m, p, _, _ in ROUTES])
def test_every_route_with_each_kind_of_key(
    keyed: tuple[Spawned, Path], scripted: Scripted, method: str, path: str, body: dict[str, object] | None, admin: bool
) -> None:
    gateway, _ = keyed
    scripted.script(*[{"json": {"input_tokens": 3}}] * 4, path="/v1/messages/count_tokens")
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        _assert_401(_send(client, method, path, body, {}), 'Bearer realm="data-plane"')
        wrong = 'Bearer realm="data-plane", error="invalid_token"'
        _assert_401(_send(client, method, path, body, bearer("not-a-key")), wrong)
        # x-api-key is never read, even when it holds a gateway key.
        _assert_401(_send(client, method, path, body, {"x-api-key": SHARED}), 'Bearer realm="data-plane"')
        for key in (RED, BLUE):
            answer = _send(client, method, path, body, bearer(key))
            if admin:
                _assert_401(answer, wrong)
            else:
                assert answer.status_code == 200, answer.text
        shared = _send(client, method, path, body, bearer(SHARED))
        assert shared.status_code != 401, shared.text
        if not admin:
            assert shared.status_code == 200, shared.text


def test_admin_routes_deny_every_key_when_only_tenant_keys_are_configured(tenants_only: Spawned) -> None:
    with httpx.Client(base_url=tenants_only.url, timeout=30.0) as client:
        for method, path, body, admin in ROUTES:
            if not admin:
                continue
            for headers in ({}, bearer(RED), bearer(SHARED)):
                assert _send(client, method, path, body, headers).status_code == 401
        assert client.get("/v1/models", headers=bearer(RED)).status_code == 200


def test_the_tenant_is_journaled_on_every_request(keyed: tuple[Spawned, Path], scripted: Scripted) -> None:
    gateway, journal = keyed
    scripted.script({"json": {"input_tokens": 3}}, path="/v1/messages/count_tokens")
    sent: dict[str, str] = {}
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        for label, headers, path, body in (
            ("red", bearer(RED), "/v1/messages", BODY),
            ("blue", bearer(BLUE), "/v1/messages/count_tokens", COUNT),
            ("shared", bearer(SHARED), "/v1/messages", BODY),
            ("nobody", bearer("wrong"), "/v1/messages", BODY),
            ("refused", bearer(RED), "/v1/messages", {**BODY, "max_tokens": "many"}),
        ):
            sent[label] = rid = new_id()
            client.post(path, json=body, headers={**headers, "x-request-id": rid})
    tenants = {}
    for label, rid in sent.items():
        received = wait_for_events(journal, rid)[0]
        assert isinstance(received, Received)
        tenants[label] = received.tenant
    assert tenants == {
        "red": "auth:red",
        "blue": "auth:blue",
        "shared": shared_tenant(SHARED, (journal.parent / TENANT_SECRET_FILE).read_bytes()),
        "nobody": "ip:127.0.0.1",
        "refused": "auth:red",
    }


def test_the_shared_keys_tenant_is_a_keyed_hash_stable_across_restarts(
    worker: Spawned, scripted: Scripted, tmp_path: Path
) -> None:
    """Not the bare SHA-256 of the key (an offline oracle for a weak key): an HMAC keyed with the
    deployment's secret beside the journal, the same for every gateway started on it."""
    journal = tmp_path / "journal.db"
    tenants = []
    for _ in range(2):  # a restart
        proc = spawn_gateway([worker.url], journal=journal, extra=["--api-key", SHARED])
        try:
            rid = new_id()
            httpx.post(
                f"{proc.url}/v1/messages", json=BODY, headers={**bearer(SHARED), "x-request-id": rid}, timeout=30
            )
            received = wait_for_events(journal, rid)[0]
            assert isinstance(received, Received)
            tenants.append(received.tenant)
        finally:
            proc.stop()
    secret = journal.parent / TENANT_SECRET_FILE
    assert secret.stat().st_mode & 0o777 == 0o600 and len(secret.read_bytes()) == 32
    assert tenants[0] == tenants[1] == shared_tenant(SHARED, secret.read_bytes())
    assert hashlib.sha256(SHARED.encode()).hexdigest() not in tenants[0]


def test_replicas_with_their_own_journals_share_the_tenant_secret_from_the_environment(
    worker: Spawned, scripted: Scripted, tmp_path: Path
) -> None:
    """A fleet's replicas each keep a journal of their own: with `$SMG_TENANT_SECRET` set alike the
    shared key is one tenant on all of them (one budget, one name in the fleet journal), and no
    secret file is made."""
    fleet_secret = "f" * 32
    tenants = []
    for name in ("a", "b"):
        journal = tmp_path / name / "journal.db"
        journal.parent.mkdir()
        proc = spawn_gateway(
            [worker.url], journal=journal, extra=["--api-key", SHARED], env={"SMG_TENANT_SECRET": fleet_secret}
        )
        try:
            rid = new_id()
            httpx.post(
                f"{proc.url}/v1/messages", json=BODY, headers={**bearer(SHARED), "x-request-id": rid}, timeout=30
            )
            received = wait_for_events(journal, rid)[0]
            assert isinstance(received, Received)
            tenants.append(received.tenant)
        finally:
            proc.stop()
        assert not (journal.parent / TENANT_SECRET_FILE).exists()
    assert tenants[0] == tenants[1] == shared_tenant(SHARED, fleet_secret.encode())


def test_a_short_tenant_secret_in_the_environment_is_refused_at_start(tmp_path: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "SMG_TENANT_SECRET": "short"}
    proc = subprocess.run(
        [sys.executable, "-m", "smg", "launch", "--worker-urls", "http://127.0.0.1:9", "--api-key", SHARED,
         "--journal", str(tmp_path / "j.db"), "--port", "0"],
        env=env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    assert "SMG_TENANT_SECRET is too short" in proc.stderr


_OLD_NAME_WARNING = "the budget policy names 1 tenant(s) by an unkeyed SHA-256 of a key"
_UNSHARED_WARNING = "but $SMG_TENANT_SECRET is not set"


def test_start_up_warns_of_an_unkeyed_policy_tenant_and_of_replicas_without_a_shared_secret(
    worker: Spawned, tmp_path: Path
) -> None:
    old_name = "auth:" + hashlib.sha256(SHARED.encode()).hexdigest()  # the shared key's name before keying
    (tmp_path / "limits.yaml").write_text(
        "default_policy: {tokens_per_minute: 6000, requests_per_minute: 600}\n"
        f"tenants:\n  - tenant_key: {old_name}\n    tokens_per_minute: 10\n    requests_per_minute: 5\n"
    )
    flags = [
        "--api-key", SHARED, "--tenant-rate-limit-enabled", "--tenant-rate-limit-config", str(tmp_path / "limits.yaml"),
        "--tenant-rate-limit-state", "memory", "--worker-registry", f"redis://127.0.0.1:{free_port()}/0",
    ]  # fmt: skip
    journal = tmp_path / "journal.db"
    assert "SMG_TENANT_SECRET" not in os.environ
    proc = spawn_gateway([worker.url], journal=journal, extra=flags)
    proc.stop()
    log = proc.log()
    assert log.count(_OLD_NAME_WARNING) == 1 and "(the shared key's old name)" in log
    new_name = shared_tenant(SHARED, (tmp_path / TENANT_SECRET_FILE).read_bytes())
    assert f"the shared key's tenant is {new_name}" in log
    assert log.count(_UNSHARED_WARNING) == 1 and "--api-key with --worker-registry but" in log


def test_no_tenant_name_warning_when_names_agree(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from smg.admission import build_admission
    from smg.admission.startup import warn_about_tenant_names

    caplog.set_level(logging.WARNING)
    gates = build_admission(SHARED, tenant_secret=b"s" * 32)
    warn_about_tenant_names(SHARED, gates, worker_registry=None, journal_sink=None)  # one replica: nothing shared
    monkeypatch.setenv("SMG_TENANT_SECRET", "f" * 32)  # the replicas share it
    warn_about_tenant_names(SHARED, gates, worker_registry="redis://127.0.0.1:1/0", journal_sink="postgresql://x")
    monkeypatch.delenv("SMG_TENANT_SECRET")
    warn_about_tenant_names(None, None, worker_registry=None, journal_sink="postgresql://x")  # no shared key
    assert not caplog.records
