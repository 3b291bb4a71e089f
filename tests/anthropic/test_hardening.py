"""The Anthropic API backend against hostile headers, over loopback: a credential or version
header that cannot be sent as given is a 400 envelope (never a 500, never sent without it), and
the gateway's own `--api-key` never reaches the API."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import MODEL, Scripted
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
KEY = "gateway-own-key"


@pytest.mark.parametrize("name", ["x-api-key", "authorization", "anthropic-beta", "anthropic-version"])
def test_a_non_ascii_credential_or_version_is_a_400(api: httpx.Client, scripted: Scripted, name: str) -> None:
    response = api.post(
        "/v1/messages",
        json=BODY,
        headers={name: b"sk-\xe9\xff", "anthropic-version": "2023-06-01"}
        if name != "anthropic-version"
        else {name: b"2023-\xe9"},
    )
    assert response.status_code == 400, response.text
    body = response.json()
    assert body["type"] == "error" and name in body["error"]["message"]
    assert scripted.received() == []


def test_a_non_ascii_request_id_is_served(api: httpx.Client, scripted: Scripted) -> None:
    response = api.post("/v1/messages", json=BODY, headers={"x-request-id": b"id-\xe9\xff", "x-api-key": "sk-ant"})
    assert response.status_code == 200, response.text


@pytest.fixture(scope="module")
def keyed_anthropic(worker: Spawned) -> Iterator[Spawned]:
    proc = spawn_gateway([worker.url], extra=["--backend", "anthropic", "--api-key", KEY])
    try:
        yield proc
    finally:
        proc.stop()


def test_the_gateway_key_never_reaches_the_api(keyed_anthropic: Spawned, scripted: Scripted) -> None:
    headers = {"authorization": f"Bearer {KEY}", "x-api-key": "sk-ant-client", "anthropic-version": "2023-06-01"}
    response = httpx.post(keyed_anthropic.url + "/v1/messages", json=BODY, headers=headers, timeout=30)
    assert response.status_code == 200, response.text
    seen = scripted.received()[-1]["headers"]
    assert "authorization" not in seen and seen["x-api-key"] == "sk-ant-client"
