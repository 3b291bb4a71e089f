"""Every refusal leaves in the Messages envelope with the right status, type, request id and
headers: authentication, CORS, content type, malformed JSON, unknown routes, methods, size."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import MODEL, Scripted, wait_for_events
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}]}
KEY = "gateway-secret-key"
ORIGIN = "https://app.example"


@pytest.fixture(scope="module")
def guarded_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("guarded") / "journal.db"


@pytest.fixture(scope="module")
def guarded(worker: Spawned, guarded_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway(
        [worker.url],
        journal=guarded_journal,
        extra=["--api-key", KEY, "--cors-allowed-origins", ORIGIN, "--max-payload-size", "4096", "--disable-retries"],
    )
    try:
        yield proc
    finally:
        proc.stop()


def assert_envelope(response: httpx.Response, status: int, error_type: str) -> dict:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) == {"type", "error", "request_id"}
    assert body["type"] == "error"
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == error_type
    assert body["request_id"] == response.headers["x-request-id"]
    return body


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_missing_bearer_is_401_with_challenge(guarded: Spawned, path: str) -> None:
    response = httpx.post(guarded.url + path, json=BODY)
    body = assert_envelope(response, 401, "authentication_error")
    assert response.headers["www-authenticate"] == 'Bearer realm="data-plane"'
    assert "Authorization: Bearer" in body["error"]["message"]
    assert "x-smg-error-code" not in response.headers


def test_x_api_key_alone_is_not_read_and_the_message_says_where_the_key_goes(guarded: Spawned) -> None:
    response = httpx.post(guarded.url + "/v1/messages", json=BODY, headers={"x-api-key": KEY})
    body = assert_envelope(response, 401, "authentication_error")
    assert "x-api-key" in body["error"]["message"]
    assert "Authorization: Bearer" in body["error"]["message"]


def test_wrong_bearer_is_401_invalid_token(guarded: Spawned) -> None:
    response = httpx.post(guarded.url + "/v1/messages", json=BODY, headers={"Authorization": "Bearer nope"})
    assert_envelope(response, 401, "authentication_error")
    assert response.headers["www-authenticate"] == 'Bearer realm="data-plane", error="invalid_token"'


def test_right_bearer_passes_case_insensitive_scheme(guarded: Spawned, scripted: Scripted) -> None:
    response = httpx.post(guarded.url + "/v1/messages", json=BODY, headers={"Authorization": f"bearer {KEY}"})
    assert response.status_code == 200


def test_cors_preflight_for_allowed_origin(guarded: Spawned) -> None:
    response = httpx.options(
        guarded.url + "/v1/messages",
        headers={
            "Origin": ORIGIN,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type, x-api-key",
        },
    )
    assert response.status_code == 204
    assert response.headers["access-control-allow-origin"] == ORIGIN
    allowed = {h.strip().lower() for h in response.headers["access-control-allow-headers"].split(",")}
    assert {"content-type", "authorization", "anthropic-version", "anthropic-beta"} <= allowed
    assert "x-api-key" not in allowed
    assert response.headers["access-control-max-age"] == "3600"


def test_cors_other_origin_gets_no_allow_header(guarded: Spawned) -> None:
    response = httpx.options(
        guarded.url + "/v1/messages",
        headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
    )
    assert "access-control-allow-origin" not in response.headers


def test_cors_on_an_actual_request_exposes_request_id(guarded: Spawned, scripted: Scripted) -> None:
    response = httpx.post(
        guarded.url + "/v1/messages", json=BODY, headers={"Authorization": f"Bearer {KEY}", "Origin": ORIGIN}
    )
    assert response.headers["access-control-allow-origin"] == ORIGIN
    assert response.headers["access-control-expose-headers"] == "x-request-id"


def test_cors_without_the_flag_allows_any_origin(gateway: Spawned) -> None:
    response = httpx.options(
        gateway.url + "/v1/messages",
        headers={
            "Origin": "https://anything.example",
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "x-api-key",
        },
    )
    assert response.headers["access-control-allow-origin"] == "*"
    assert "x-api-key" in response.headers["access-control-allow-headers"]


def test_body_over_the_payload_limit_is_413(guarded: Spawned) -> None:
    big = {**BODY, "messages": [{"role": "user", "content": "x" * 10_000}]}
    response = httpx.post(guarded.url + "/v1/messages", json=big, headers={"Authorization": f"Bearer {KEY}"})
    assert_envelope(response, 413, "request_too_large")
    assert response.headers["x-smg-error-code"] == "request_body_too_large"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_malformed_json_is_400(client: httpx.Client, path: str) -> None:
    response = client.post(path, content=b'{"model": "x", ', headers={"content-type": "application/json"})
    body = assert_envelope(response, 400, "invalid_request_error")
    assert "JSON" in body["error"]["message"]
    assert "x-smg-error-code" not in response.headers


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"null", b"42", b""])
def test_non_object_bodies_are_400(client: httpx.Client, body: bytes) -> None:
    response = client.post("/v1/messages", content=body, headers={"content-type": "application/json"})
    assert_envelope(response, 400, "invalid_request_error")


def test_missing_content_type_is_400(client: httpx.Client) -> None:
    response = client.post("/v1/messages", content=b'{"model":"m"}', headers={"content-type": ""})
    body = assert_envelope(response, 400, "invalid_request_error")
    assert "Content-Type" in body["error"]["message"]


def test_wrong_content_type_is_400(client: httpx.Client) -> None:
    response = client.post(
        "/v1/messages/count_tokens", content=b"model=m", headers={"content-type": "application/x-www-form-urlencoded"}
    )
    body = assert_envelope(response, 400, "invalid_request_error")
    assert "application/json" in body["error"]["message"]


def test_json_with_charset_is_accepted(client: httpx.Client, scripted: Scripted) -> None:
    import orjson

    response = client.post(
        "/v1/messages", content=orjson.dumps(BODY), headers={"content-type": "application/json; charset=utf-8"}
    )
    assert response.status_code == 200


def test_unknown_route_under_messages_is_404_envelope(client: httpx.Client) -> None:
    response = client.post("/v1/messages/batches/foo", json=BODY)
    assert_envelope(response, 404, "not_found_error")


@pytest.mark.parametrize("method", ["GET", "PUT", "DELETE", "PATCH"])
def test_wrong_method_is_405_envelope(client: httpx.Client, method: str) -> None:
    response = client.request(method, "/v1/messages")
    assert_envelope(response, 405, "invalid_request_error")
    assert "POST" in response.headers["allow"]


def test_client_request_id_is_the_envelope_request_id(client: httpx.Client) -> None:
    response = client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": "trace-123"})
    body = assert_envelope(response, 400, "invalid_request_error")
    assert body["request_id"] == "trace-123"


def test_refusals_are_journaled_completely(guarded: Spawned, guarded_journal: Path) -> None:
    response = httpx.post(
        guarded.url + "/v1/messages",
        json=BODY,
        headers={"x-api-key": "sk-ant-do-not-store", "x-request-id": "auth-refused-1"},
    )
    assert response.status_code == 401
    events = wait_for_events(guarded_journal, "auth-refused-1")
    assert [e.kind for e in events] == ["received", "rejected", "error", "completed"]
    assert events[-1].status == 401
    for file in guarded_journal.parent.glob(guarded_journal.name + "*"):  # the database and its WAL
        assert b"sk-ant-do-not-store" not in file.read_bytes()
    assert events[0].headers["x-api-key"].startswith("[redacted")


def test_models_need_the_gateway_key_too(guarded: Spawned) -> None:
    anthropic_style = httpx.get(guarded.url + "/v1/models", headers={"anthropic-version": "2023-06-01"})
    assert_envelope(anthropic_style, 401, "authentication_error")
    assert anthropic_style.headers["www-authenticate"].startswith("Bearer")
    assert httpx.get(guarded.url + "/v1/models").status_code == 401
    allowed = httpx.get(guarded.url + "/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert allowed.status_code == 200 and allowed.json()["data"]
    assert httpx.get(guarded.url + "/health").status_code == 200  # probes stay open


def test_unknown_route_elsewhere_is_an_envelope_for_anthropic_clients(client: httpx.Client) -> None:
    response = client.get("/v1/nothing-here", headers={"anthropic-version": "2023-06-01"})
    assert_envelope(response, 404, "not_found_error")
