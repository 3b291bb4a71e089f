"""Property tests against the live gateway: whatever the body, the answer is a success or a 4xx
in the Messages envelope, never a 5xx and never a dropped connection."""

from __future__ import annotations

from typing import Any

import httpx
import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg.protocol import codec
from tests.conftest import MODEL

VALID = {
    "model": MODEL,
    "max_tokens": 16,
    "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "tools": [{"name": "get_weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto"},
    "system": [{"type": "text", "text": "sys"}],
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=20,
)
FIELDS = [
    "model",
    "max_tokens",
    "messages",
    "tools",
    "tool_choice",
    "system",
    "thinking",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "metadata",
    "service_tier",
    "mcp_servers",
    "stream",
]


@st.composite
def mutated_bodies(draw: st.DrawFn) -> dict[str, Any]:
    body = orjson.loads(orjson.dumps(VALID))
    for _ in range(draw(st.integers(1, 3))):
        field = draw(st.sampled_from(FIELDS))
        action = draw(st.sampled_from(["drop", "replace", "nest"]))
        if action == "drop":
            body.pop(field, None)
        elif action == "replace":
            body[field] = draw(json_values)
        else:
            body["messages"] = [
                {"role": draw(st.sampled_from(["user", "assistant", "system", "tool"])), "content": draw(json_values)}
            ]
    body["stream"] = False  # a streamed success is fine too, but keeps this test simple to check
    return body


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text
    if response.status_code >= 400:
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}
        assert body["request_id"] == response.headers["x-request-id"]


SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@SETTINGS
@given(body=mutated_bodies())
def test_mutated_bodies_never_5xx(client: httpx.Client, body: dict[str, Any]) -> None:
    _check(client.post("/v1/messages", json=body))


@SETTINGS
@given(value=json_values)
def test_arbitrary_json_never_5xx(client: httpx.Client, value: Any) -> None:
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        _check(client.post(path, content=codec.dumps(value), headers={"content-type": "application/json"}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_arbitrary_bytes_never_5xx(client: httpx.Client, raw: bytes) -> None:
    _check(client.post("/v1/messages", content=raw, headers={"content-type": "application/json"}))
