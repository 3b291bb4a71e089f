"""A bounded Hypothesis run of hostile bodies and header bytes against a live gateway on each
backend (HTTP relay, gRPC with the scripted engine, Anthropic API with the scripted worker):
never a 5xx, every refusal in the Messages envelope, and afterwards, checked in SQL, one
complete event sequence per request in the journal."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from journal.reader import JournalReader
from tools.spawn import Spawned, spawn_engine, spawn_gateway

QWEN3 = Path(__file__).resolve().parents[1] / "fixtures" / "qwen3"
GRPC_MODEL = "qwen3-fixture"
HTTP_MODEL = "scripted-model"
EXAMPLES = 100  # per backend: 300 in all, about 15 s

HEADER_BYTES = st.binary(max_size=24).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip(b" "))
HEADERS = ["x-request-id", "traceparent", "anthropic-beta", "anthropic-version", "authorization", "x-api-key"]
BIG = "123456789012345678901234"


def _valid(model: str) -> dict[str, Any]:
    return {"model": model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}


def _schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=10,
)


@st.composite
def bodies(draw: st.DrawFn, model: str) -> bytes:
    kind = draw(st.sampled_from(["binary", "mutated", "surrogate", "deep", "schema", "tool_turn"]))
    if kind == "binary":
        return draw(st.binary(max_size=120))
    body = _valid(model)
    if kind == "mutated":
        fields = ["model", "max_tokens", "messages", "tools", "system", "stop_sequences", "stream"]
        field = draw(st.sampled_from(fields))
        body[field] = draw(json_values)
        return json.dumps(body).encode()
    if kind == "surrogate":
        return json.dumps(body).replace('"hi"', '"\\ud800"').replace('"max_tokens": 8', f'"max_tokens": {BIG}').encode()
    if kind == "deep":
        depth = draw(st.sampled_from([10, 900, 1100, 10_000]))
        raw = json.dumps(body)
        return (raw[:-1] + f', "metadata": {{"x": {"[" * depth}{BIG}{"]" * depth}}}}}').encode()
    if kind == "schema":
        body["tools"] = [{"name": "t", "input_schema": _schema(draw(st.sampled_from([1, 64, 128])))}]
        body["stream"] = draw(st.booleans())
        return json.dumps(body).encode()
    body["messages"] = [
        {"role": "user", "content": "w?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"},
                {"type": "text", "text": draw(st.text(min_size=1, max_size=8))},
            ],
        },
    ]
    body["tools"] = [{"name": "t", "input_schema": {"type": "object"}}]
    return json.dumps(body).encode()


@pytest.fixture(scope="module")
def engine() -> Iterator[Spawned]:
    proc = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", GRPC_MODEL])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module", params=["http", "grpc", "anthropic"])
def backend(
    request: pytest.FixtureRequest, worker: Spawned, engine: Spawned, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Spawned, Path, str]]:
    name: str = request.param
    journal = tmp_path_factory.mktemp(f"fuzz-{name}") / "journal.db"
    if name == "grpc":
        proc = spawn_gateway([engine.url], journal=journal, extra=["--model-path", str(QWEN3)])
    elif name == "anthropic":
        proc = spawn_gateway([worker.url], journal=journal, extra=["--backend", "anthropic"])
    else:
        proc = spawn_gateway([worker.url], journal=journal, extra=["--disable-retries"])
    try:
        yield name, proc, journal, GRPC_MODEL if name == "grpc" else HTTP_MODEL
    finally:
        proc.stop()


def _check(response: httpx.Response) -> None:
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        body = response.json()
        assert body["type"] == "error" and set(body["error"]) == {"type", "message"}, body
        assert body["request_id"] == response.headers["x-request-id"]


def test_hostile_requests_on_each_backend(backend: tuple[str, Spawned, Path, str]) -> None:
    name, gateway, journal, model = backend
    paths = ["/v1/messages"] if name == "anthropic" else ["/v1/messages", "/v1/messages/count_tokens"]
    sent: list[int] = []

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(body=bodies(model), header=st.sampled_from(HEADERS), value=HEADER_BYTES, path=st.sampled_from(paths))
    def one(body: bytes, header: str, value: bytes, path: str) -> None:
        headers = {"content-type": b"application/json", header: value}
        response = httpx.post(gateway.url + path, content=body, headers=headers, timeout=60)
        _check(response)
        sent.append(response.status_code)

    one()
    assert len(sent) >= EXAMPLES
    _assert_complete(journal, len(sent))


def _assert_complete(journal: Path, expected: int) -> None:
    conn = sqlite3.connect(f"file:{journal}?mode=ro", uri=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            pending = conn.execute("SELECT count(*) FROM requests WHERE completed = 0").fetchone()[0]
            total = conn.execute("SELECT count(*) FROM requests WHERE path LIKE '/v1/messages%'").fetchone()[0]
            if (pending == 0 and total >= expected) or time.monotonic() > deadline:
                break
            time.sleep(0.1)
        assert pending == 0 and total == expected
        # Each request's events through the reader (a packed row holds several): numbered
        # 1..n, one `received` first and one `completed` last.
        broken = []
        with JournalReader(journal) as reader:
            for (request_id,) in conn.execute("SELECT id FROM requests"):
                raw = reader.raw_events(request_id)
                kinds = [kind for _, kind, _, _ in raw]
                if (
                    [seq for seq, _, _, _ in raw] != list(range(1, len(raw) + 1))
                    or kinds.count("received") != 1
                    or kinds.count("completed") != 1
                    or kinds[0] != "received"
                    or kinds[-1] != "completed"
                ):
                    broken.append((request_id, kinds))
        assert broken == []
        server_errors = conn.execute("SELECT count(*) FROM requests WHERE status >= 500").fetchone()[0]
        assert server_errors == 0
    finally:
        conn.close()
