"""The whole app in process: `build_app` over the router and an engine connector whose engines
are played back, driven through its ASGI interface. What the client is told (status, envelope,
machine code, SSE events) and what the journal keeps, for engine answers and engine failures.
The wire (TCP, SSE framing as sent, the gRPC client) is proven by the loopback tests."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from journal.events import Completed, Rendered, Routed, Tokens
from smg.backends.grpc.engines.playback import PlaybackEngine
from smg.projection import reconstruct
from smg.routing.config import RouterConfig
from smg.routing.retry import RetryConfig
from tests.conftest import journaled_failure
from tests.inprocess import MODEL, WINDOW, InProcessGateway, engine, gateway

A, B = "grpc://127.0.0.1:50001", "grpc://127.0.0.1:50002"


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.split("\n\n"):
        if frame.strip():
            name, data = frame.split("\n")
            out.append((name.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


@pytest.fixture
async def gw(tmp_path: Path) -> AsyncIterator[InProcessGateway]:
    async with gateway(tmp_path, {A: engine()}) as running:
        yield running


def _engine(gw: InProcessGateway, url: str = A) -> PlaybackEngine:
    return gw.engines[url]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_an_answer_is_journaled_and_the_journal_rebuilds_the_response(gw: InProcessGateway, stream: bool) -> None:
    _engine(gw).script({"text": "Journaled answer.", "chunk_size": 2})
    reply = await gw.post({"stream": stream})
    assert reply.status_code == 200
    events = await gw.events(reply.headers["x-request-id"])
    kinds = [e.kind for e in events]
    assert kinds[:4] == ["received", "validated", "routed", "rendered"] and kinds[-1] == "completed"
    rendered = next(e for e in events if isinstance(e, Rendered))
    [sent] = _engine(gw).received
    assert rendered.prompt_tokens == len(sent.input_ids)
    assert rendered.settings and rendered.settings["message_id"].startswith("msg_")
    tokens = [e for e in events if isinstance(e, Tokens)]
    assert tokens and tokens[-1].finish_reason == "stop"
    rebuilt = reconstruct(events)
    assert rebuilt.status == 200 and rebuilt.body == reply.content
    if stream:
        kinds = [k for k, _ in sse_events(reply.text)]
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    else:
        assert reply.json()["content"] == [{"type": "text", "text": "Journaled answer."}]
        assert reply.json()["usage"]["input_tokens"] == len(sent.input_ids)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_complete_with_finish_reason_error_is_an_error_response(gw: InProcessGateway, stream: bool) -> None:
    # The vLLM servicer's answer for a request the engine failed: an empty `complete`, "error".
    _engine(gw).script({"token_ids": [], "eos": False, "finish_reason": "error"})
    reply = await gw.post({"max_tokens": 16, "stream": stream})
    assert reply.status_code == 500, reply.text
    assert reply.headers["content-type"].startswith("application/json")
    assert reply.headers["x-smg-error-code"] == "engine_error"
    assert reply.json()["error"]["type"] == "api_error"
    await gw.journal.flush()
    journaled_failure(gw.journal_path, reply.headers["x-request-id"], 500, "engine_error")


async def test_an_engine_that_dies_before_answering_is_a_502(gw: InProcessGateway) -> None:
    _engine(gw).script({"text": "never sent", "exit_after": 0})
    reply = await gw.post({"max_tokens": 16})
    assert reply.status_code == 502, reply.text
    assert reply.headers["x-smg-error-code"] == "engine_unavailable"
    assert reply.json()["type"] == "error"
    await gw.journal.flush()
    journaled_failure(gw.journal_path, reply.headers["x-request-id"], 502, "engine_unavailable")


async def test_an_engine_error_after_output_ends_the_stream_with_an_error_event(gw: InProcessGateway) -> None:
    oom = {"code": "INTERNAL", "message": "oom", "after_tokens": 2}
    _engine(gw).script({"text": "partial answer that breaks", "error": oom})
    reply = await gw.post({"stream": True})
    assert reply.status_code == 200
    events = sse_events(reply.text)
    assert events[0][0] == "message_start"
    assert events[-1] == ("error", {"type": "error", "error": {"type": "api_error", "message": "Stream error: oom"}})
    assert "message_stop" not in [k for k, _ in events]
    await gw.journal.flush()
    journaled_failure(gw.journal_path, reply.headers["x-request-id"], 500, "engine_stream_error", answered=200)


async def test_an_engine_that_does_not_answer_costs_the_client_nothing(tmp_path: Path) -> None:
    down, up = engine(), engine()
    async with gateway(tmp_path, {A: down, B: up}, router=RouterConfig(policy="round_robin")) as gw:
        down.down = True  # after discovery: the router takes it for up until an attempt fails
        routed = []
        for _ in range(3):
            reply = await gw.post({})
            assert reply.status_code == 200, reply.text
            events = await gw.events(reply.headers["x-request-id"])
            assert isinstance(events[-1], Completed) and events[-1].status == 200
            routed.append([e.worker for e in events if isinstance(e, Routed)])
        assert routed == [[A, B], [B], [B]]  # round robin tried A first, once
        assert len(up.received) == 3 and down.received == []
        workers = (await gw.client.get("/workers")).json()["workers"]
        assert {w["url"]: w["status"] for w in workers}[A] != "ready"


async def test_the_models_and_readiness_follow_what_the_engines_said(gw: InProcessGateway) -> None:
    ready = await gw.client.get("/readiness")
    assert ready.status_code == 200 and ready.json()["healthy_workers"] == 1
    models = (await gw.client.get("/v1/models")).json()["data"]
    assert [m["id"] for m in models] == [MODEL]
    assert (await gw.client.get(f"/v1/models/{MODEL}")).status_code == 200
    counted = await gw.post({}, path="/v1/messages/count_tokens")
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
    assert _engine(gw).received == []
    assert WINDOW > counted.json()["input_tokens"]


# --- engines that go away (moved from loopback: the wire's part, a dead engine's connection
# refused or its stream cut, is `tests/engines/test_wire.py`'s) --------------------------------


async def test_a_dead_engine_is_retried_on_the_other_and_taken_out(tmp_path: Path) -> None:
    first, second = engine(), engine()
    async with gateway(tmp_path, {A: first, B: second}, router=RouterConfig(policy="round_robin")) as gw:
        assert all([(await gw.post({"max_tokens": 16})).status_code == 200 for _ in range(2)])
        assert len(first.received) == len(second.received) == 1
        second.down = True
        for stream in (False, True, False, True):
            reply = await gw.post({"max_tokens": 16, "stream": stream})
            assert reply.status_code == 200, reply.text
            assert "event: message_stop" in reply.text if stream else reply.json()["content"][0]["text"]
        assert len(first.received) == 5
        workers = (await gw.client.get("/workers")).json()["workers"]
        assert {w["url"]: w["status"] for w in workers}[B] != "ready"
        assert (await gw.client.get("/readiness")).status_code == 200


async def test_no_engine_left_is_an_error_response_not_a_hang(tmp_path: Path) -> None:
    only = engine()
    async with gateway(tmp_path, {A: only}, router=RouterConfig(retry=RetryConfig(enabled=False))) as gw:
        only.down = True
        first = await gw.post({"max_tokens": 8, "stream": True})
        assert first.status_code in (502, 503)
        assert first.headers["content-type"].startswith("application/json")
        assert first.json()["type"] == "error"
        second = await gw.post({"max_tokens": 8})
        assert second.status_code == 503 and second.headers["x-smg-error-code"] == "no_available_workers"
        # count_tokens needs no engine: the tokenizer is still here.
        counted = await gw.post({}, path="/v1/messages/count_tokens")
        assert counted.status_code == 200
