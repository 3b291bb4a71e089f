"""Credentials never reach the journal in clear, by rule: every header named for a credential
and the credentials of URLs in the body, through the suite's gateway and its journal file; the
redacted forms still export as curl (a variable per secret header) and keep their fingerprints."""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path

import httpx
from typer.testing import CliRunner

from journal.events import Received
from smg.cli.main import app
from tests.conftest import MODEL, Scripted, wait_for_events

HEADERS = {
    "api-key": "hdr-secret-api-key",
    "x-goog-api-key": "hdr-secret-goog",
    "x-auth-token": "hdr-secret-auth-token",
    "anthropic-api-key": "hdr-secret-anthropic",
    "x-amz-security-token": "hdr-secret-amz",
}
URL_SECRETS = ("url-user", "url-password", "url-query-token", "url-image-sig")
BODY = {
    "model": MODEL,
    "max_tokens": 8,
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is in it?"},
                {
                    "type": "image",
                    "source": {"type": "url", "url": "https://img.example/a.png?sig=url-image-sig&w=1"},
                },
            ],
        }
    ],
    "mcp_servers": [
        {"type": "url", "name": "tools", "url": "https://url-user:url-password@mcp.example/sse?token=url-query-token"}
    ],
}


def _fingerprint(secret: str, journal_path: Path) -> str:
    # Keyed with the deployment's secret beside the journal, as the tenant names are: a bare
    # SHA-256 of a weak key is an offline oracle for it.
    key = (journal_path.parent / "smg-tenant.key").read_bytes()
    return hmac.new(key, secret.encode(), hashlib.sha256).hexdigest()[:12]


def test_credential_headers_and_url_credentials_are_journaled_redacted(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    response = client.post("/v1/messages", json=BODY, headers={**HEADERS, "x-request-id": "redact-by-rule"})
    assert response.status_code < 500, response.text
    received = wait_for_events(journal_path, "redact-by-rule")[0]
    assert isinstance(received, Received)
    for name, secret in HEADERS.items():
        fingerprint = _fingerprint(secret, journal_path)
        assert fingerprint != hashlib.sha256(secret.encode()).hexdigest()[:12]
        assert received.headers[name] == f"[redacted sha256:{fingerprint}]"  # as for Authorization
    assert received.body is not None and "mcp.example/sse?token=[redacted%20sha256:" in received.body
    for file in journal_path.parent.glob(journal_path.name + "*"):  # the WAL too
        data = file.read_bytes()
        for secret in (*HEADERS.values(), *URL_SECRETS):
            assert secret.encode() not in data, (secret, file.name)

    curl = CliRunner().invoke(app, ["journal", "export", "redact-by-rule", "--as", "curl", "-j", str(journal_path)])
    assert curl.exit_code == 0, curl.output
    assert '-H "x-goog-api-key: ${SMG_X_GOOG_API_KEY}"' in curl.stdout
    assert '-H "api-key: ${SMG_API_KEY}"' in curl.stdout
    assert not any(secret in curl.stdout for secret in (*HEADERS.values(), *URL_SECRETS))


def test_key_queries_take_the_callers_key_or_its_keyed_fingerprint(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    key = "sk-ant-operator-test-key-1"
    response = client.post("/v1/messages", json=body, headers={"x-api-key": key, "x-request-id": "keyed-fp"})
    assert response.status_code < 500, response.text
    wait_for_events(journal_path, "keyed-fp")
    fingerprint = _fingerprint(key, journal_path)
    for query in (f"key:{key}", f"key:{fingerprint}"):
        listed = CliRunner().invoke(app, ["journal", "ls", query, "-j", str(journal_path), "--json"])
        assert listed.exit_code == 0, listed.output
        assert [row["client_id"] for row in json.loads(listed.stdout)] == ["keyed-fp"], query
    bare = hashlib.sha256(key.encode()).hexdigest()[:12]  # what the journal stored before
    listed = CliRunner().invoke(app, ["journal", "ls", f"key:{bare}", "-j", str(journal_path), "--json"])
    assert listed.exit_code == 0 and json.loads(listed.stdout) == []


ROUTING_HEADERS = {
    "x-smg-routing-key": "user-42",
    "x-session-affinity": "sess-7",
    "x-cache-key": "prompt-cache-1",
    "x-stainless-session": "stainless-3",
}


def test_routing_and_cache_keys_are_journaled_as_sent(
    client: httpx.Client, scripted: Scripted, journal_path: Path
) -> None:
    body = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    response = client.post("/v1/messages", json=body, headers={**ROUTING_HEADERS, "x-request-id": "routing-kept"})
    assert response.status_code < 500, response.text
    received = wait_for_events(journal_path, "routing-kept")[0]
    assert isinstance(received, Received)
    for name, value in ROUTING_HEADERS.items():
        assert received.headers[name] == value  # a replay or a re-sent curl routes as the original did

    curl = CliRunner().invoke(app, ["journal", "export", "routing-kept", "--as", "curl", "-j", str(journal_path)])
    assert curl.exit_code == 0, curl.output
    assert "-H 'x-smg-routing-key: user-42'" in curl.stdout and "SMG_X_SMG_ROUTING_KEY" not in curl.stdout
