"""Tokenizer states, the tokenizer admin API and the context window, on the gRPC path.

Each state is produced the way an operator would meet it: a tokenizer removed or registered
through the admin API, a worker whose tokenizer cannot be fetched, autoload disabled, a load
that has not finished (the worker holds its tokenizer bundle, or the load reads its chat
template from a FIFO the test feeds). The gateway runs in process over playback engines
(`tests.inprocess`); fetching the bundle over gRPC (`GetTokenizer`) is proven on loopback.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from smg.backends.grpc.config import EngineConfig
from smg.backends.grpc.engines.playback import PlaybackEngine
from smg.routing.config import RouterConfig
from tests.grpc.conftest import MODEL, QWEN3
from tests.inprocess import InProcessGateway, bundle, engine, gateway
from tools.spawn import Spawned, spawn_engine, spawn_gateway

USER: list[dict[str, object]] = [{"role": "user", "content": "Count me."}]
URL = "grpc://127.0.0.1:50001"
# A request never waits for a loading tokenizer here: the tests see its states at once.
NO_WAIT = EngineConfig(tokenizer_wait_secs=0)


def autoloading(**kwargs: Any) -> PlaybackEngine:
    """An engine whose tokenizer path is not on this machine: its tokenizer comes from its bundle."""
    kwargs.setdefault("bundle", bundle())
    return engine(tokenizer_path="/nonexistent/qwen3", model_path="/nonexistent/qwen3", **kwargs)


async def count(gw: InProcessGateway, model: str = MODEL, messages: list[dict[str, object]] = USER) -> httpx.Response:
    return await gw.client.post("/v1/messages/count_tokens", json={"model": model, "messages": messages})


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait for a state the gateway reaches on its own (a load in a thread of its own)."""
    async with asyncio.timeout(15):
        while not await check():
            await asyncio.sleep(0.02)


async def wait_ready(gw: InProcessGateway) -> None:
    async def ready() -> bool:
        return (await gw.client.get("/readiness")).status_code == 200

    await until(ready, "readiness")


async def wait_status(gw: InProcessGateway, key: str, status: str) -> dict[str, object]:
    body: dict[str, object] = {}

    async def reached() -> bool:
        nonlocal body
        body = (await gw.client.get(f"/v1/tokenizers/{key}/status")).json()
        return body.get("status") == status

    await until(reached, f"tokenizer {key} {status}")
    return body


@pytest.fixture
async def private(tmp_path: Path) -> AsyncIterator[InProcessGateway]:
    """A gateway of the test's own (its tokenizers are changed), its tokenizer autoloaded from
    the engine's bundle (no --model-path)."""
    async with gateway(tmp_path, {URL: autoloading()}, model_path=None, engine=NO_WAIT) as gw:
        await wait_ready(gw)  # the gateway serves while the tokenizer autoloads
        yield gw


async def test_the_gateway_serves_while_a_tokenizer_autoloads(tmp_path: Path) -> None:
    """Discovery does not wait for the tokenizer fetched from the worker: until it is loaded
    (and past `--tokenizer-wait-secs`), its model's requests are 503 `tokenizer_not_ready` and
    the gateway is not ready."""
    held = autoloading()
    held.hold_bundle = True
    async with gateway(tmp_path, {URL: held}, model_path=None, engine=NO_WAIT) as gw:
        refused = await count(gw)
        assert refused.status_code == 503, refused.text
        assert refused.headers["x-smg-error-code"] == "tokenizer_not_ready"
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "overloaded_error"
        assert (await gw.client.get("/readiness")).status_code == 503
        held.release()
        await wait_ready(gw)
        assert (await count(gw)).status_code == 200


async def test_removed_tokenizer_is_load_failed_until_one_registers(private: InProcessGateway) -> None:
    client = private.client
    assert (await count(private)).status_code == 200
    assert (await client.delete(f"/v1/tokenizers/{MODEL}")).status_code == 200
    refused = await count(private)
    assert refused.status_code == 503
    assert refused.headers["x-smg-error-code"] == "tokenizer_load_failed"
    assert "retry-after" not in refused.headers
    assert "removed" in refused.json()["error"]["message"]
    assert refused.json()["error"]["type"] == "overloaded_error"
    posted = await client.post("/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3)})
    assert posted.status_code == 202 and posted.json()["status"] == "pending"
    assert posted.json()["message"] == f"Tokenizer '{MODEL}' registration job submitted. Loading from: {QWEN3}"
    await wait_status(private, posted.json()["id"], "completed")
    assert (await count(private)).status_code == 200
    again = await client.post("/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3)})
    assert again.status_code == 409 and again.json()["status"] == "failed"


async def test_failed_load_is_load_failed_naming_the_reason(private: InProcessGateway, tmp_path: Path) -> None:
    client = private.client
    await client.delete(f"/v1/tokenizers/{MODEL}")
    empty = tmp_path / "empty"
    empty.mkdir()
    posted = await client.post("/v1/tokenizers", json={"name": MODEL, "source": str(empty)})
    await wait_status(private, posted.json()["id"], "failed")
    refused = await count(private)
    assert refused.status_code == 503 and refused.headers["x-smg-error-code"] == "tokenizer_load_failed"
    assert str(empty) in refused.json()["error"]["message"]
    # The same refusal on /v1/messages.
    generate = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": USER})
    assert generate.status_code == 503 and generate.headers["x-smg-error-code"] == "tokenizer_load_failed"


async def test_loading_tokenizer_is_not_ready_with_retry_after(private: InProcessGateway, tmp_path: Path) -> None:
    client = private.client
    await client.delete(f"/v1/tokenizers/{MODEL}")
    # The load reads its chat template from a pipe, and cannot finish before the test writes it.
    template = tmp_path / "template.jinja"
    os.mkfifo(template)
    feeder = threading.Thread(target=lambda: template.write_text((QWEN3 / "chat_template.jinja").read_text()))
    try:
        posted = await client.post(
            "/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3), "chat_template_path": str(template)}
        )
        assert posted.status_code == 202
        refused = await count(private)
        assert refused.status_code == 503
        assert refused.headers["x-smg-error-code"] == "tokenizer_not_ready"
        assert refused.headers["retry-after"] == "1"
        status = (await client.get(f"/v1/tokenizers/{MODEL}/status")).json()["status"]
        assert status in ("pending", "processing")
        assert (await client.get("/readiness")).status_code == 503
    finally:
        feeder.start()  # the load's thread is never left blocked on the pipe
    await wait_status(private, MODEL, "completed")
    feeder.join()
    assert (await count(private)).status_code == 200


async def test_unknown_model_is_404_even_with_a_tokenizer_of_that_name(private: InProcessGateway) -> None:
    posted = await private.client.post("/v1/tokenizers", json={"name": "ghost-model", "source": str(QWEN3)})
    await wait_status(private, posted.json()["id"], "completed")
    reply = await count(private, model="ghost-model")
    assert reply.status_code == 404 and reply.headers["x-smg-error-code"] == "model_not_found"


async def test_worker_without_a_usable_tokenizer_is_load_failed(tmp_path: Path) -> None:
    no_bundle = engine(tokenizer_path="/nonexistent/qwen3", model_path="/nonexistent/qwen3")
    async with gateway(tmp_path, {URL: no_bundle}, model_path=None) as gw:
        reply = await count(gw)
        assert reply.status_code == 503
        assert reply.headers["x-smg-error-code"] == "tokenizer_load_failed"
        assert "retry-after" not in reply.headers
        assert "no path" in reply.json()["error"]["message"]
        assert (await gw.client.get("/readiness")).status_code == 503


async def test_autoload_disabled_without_a_tokenizer_is_500_not_found(tmp_path: Path) -> None:
    async with gateway(tmp_path, {URL: engine()}, model_path=None, tokenizer_autoload=False) as gw:
        reply = await count(gw)
        assert reply.status_code == 500
        assert reply.headers["x-smg-error-code"] == "tokenizer_not_found"
        assert reply.json()["error"]["message"] == f"Tokenizer not found for model: {MODEL}"
        # An operator registers one: served from then on.
        posted = await gw.client.post("/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3)})
        await wait_status(gw, posted.json()["id"], "completed")
        assert (await count(gw)).status_code == 200


async def test_admin_api_is_behind_the_api_key(tmp_path: Path) -> None:
    async with gateway(tmp_path, {URL: engine()}, api_key="sekret") as gw:
        client = gw.client
        assert (await client.get("/v1/tokenizers")).status_code == 401
        assert (await client.post("/v1/tokenizers", json={"name": "x", "source": "y"})).status_code == 401
        ok = await client.get("/v1/tokenizers", headers={"authorization": "Bearer sekret"})
        assert ok.status_code == 200 and ok.json()["tokenizers"][0]["name"] == MODEL


# --- the context window -------------------------------------------------------------------


async def _messages_with(
    count_of: Callable[[list[dict[str, object]]], Awaitable[int]], target: int
) -> list[dict[str, object]]:
    """A conversation whose rendered prompt is exactly `target` tokens."""

    def convo(text: str) -> list[dict[str, object]]:
        return [{"role": "user", "content": text}]

    text = "hi"
    while (n := await count_of(convo(text))) < target - 1:
        text += " a"
    for filler in ("", " a", " b", ".", "!", " 1", ",", " a a", " b b", "?!"):
        if await count_of(convo(text + filler)) == target:
            return convo(text + filler)
    raise AssertionError(f"no conversation of exactly {target} tokens near {n}")


async def test_context_window_edge(tmp_path: Path) -> None:
    window = 64
    small = engine(max_context_length=window)
    async with gateway(tmp_path, {URL: small}) as gw:
        client = gw.client

        async def count_of(messages: list[dict[str, object]]) -> int:
            return int((await count(gw, messages=messages)).json()["input_tokens"])

        fits = await _messages_with(count_of, window)
        over = await _messages_with(count_of, window + 1)
        for stream in (False, True):
            ok = await client.post(
                "/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": fits, "stream": stream}
            )
            assert ok.status_code == 200
            refused = await client.post(
                "/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": over, "stream": stream}
            )
            assert refused.status_code == 400
            assert refused.headers["content-type"].startswith("application/json")
            assert refused.headers["x-smg-error-code"] == "context_length_exceeded"
            assert refused.json()["error"]["message"] == (
                f"This model's maximum context length is {window} tokens. However, your request has "
                f"{window + 1} input tokens. Please reduce the length of the input."
            )
        # max_tokens 0 uses the smallest advertised window too, without the engine.
        before = len(small.received)
        zero = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": over})
        assert zero.status_code == 400 and zero.headers["x-smg-error-code"] == "context_length_exceeded"
        fitting = await client.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": fits})
        assert fitting.status_code == 200
        assert len(small.received) == before


async def test_the_admin_api_answers_in_the_references_shapes(private: InProcessGateway) -> None:
    """TokenizerInfo, AddTokenizerResponse and RemoveTokenizerResponse of the reference
    (`routers/tokenize/handlers.rs`); `vocab_size` is the base vocabulary, added tokens left out."""
    from tokenizers import Tokenizer as RustTokenizer

    client = private.client
    base = RustTokenizer.from_file(str(QWEN3 / "tokenizer.json")).get_vocab_size(with_added_tokens=False)
    [listed] = (await client.get("/v1/tokenizers")).json()["tokenizers"]
    assert set(listed) == {"id", "name", "source", "vocab_size"} and listed["vocab_size"] == base
    assert (await client.get(f"/v1/tokenizers/{listed['id']}")).json() == listed
    assert (await client.get(f"/v1/tokenizers/{MODEL}/status")).json() == {
        "id": listed["id"],
        "status": "completed",
        "message": f"Tokenizer '{MODEL}' is loaded and ready",
        "vocab_size": base,
    }
    removed = await client.delete(f"/v1/tokenizers/{listed['id']}")
    assert removed.status_code == 200
    assert removed.json() == {"success": True, "message": f"Tokenizer '{MODEL}' removed successfully"}
    again = await client.delete(f"/v1/tokenizers/{listed['id']}")
    assert again.status_code == 404
    assert again.json() == {"success": False, "message": f"Tokenizer '{listed['id']}' not found"}
    missing = await client.get(f"/v1/tokenizers/{listed['id']}")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "tokenizer_not_found"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
async def test_a_request_right_after_post_workers_is_answered(tmp_path: Path, stream: bool) -> None:
    """A worker added at run time is discovered and its tokenizer fetched and loaded while the
    first request for its model waits: that request is answered, not 503."""
    added_engine = {URL: autoloading(runtime="vllm")}
    # A cold start: the bundle directory (in tmp_path) holds no tokenizer left by an earlier run.
    async with gateway(tmp_path, added_engine, static=[], model_path=None, router=RouterConfig(igw=True)) as gw:
        added = await gw.client.post("/workers", json={"url": URL})
        assert added.status_code == 202, added.text
        reply = await gw.client.post(
            "/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": USER, "stream": stream}
        )
        assert reply.status_code == 200, reply.text
        assert ("event: message_stop" in reply.text) if stream else reply.json()["content"][0]["text"]
        assert (await count(gw)).status_code == 200


# --- over loopback: the bundle fetched with GetTokenizer -----------------------------------


@pytest.fixture
def loopback(tmp_path: Path) -> Iterator[httpx.Client]:
    """A scripted engine whose tokenizer path is not on this machine, and a gateway that
    autoloads the tokenizer from its `GetTokenizer` stream (no --model-path)."""
    engine = spawn_engine(
        "sglang", model_path=QWEN3, extra=["--served-model-name", MODEL, "--reported-model-path", "/nonexistent/qwen3"]
    )
    gateway: Spawned | None = None
    try:
        gateway = spawn_gateway(
            [engine.url],
            journal=tmp_path / "j.db",
            extra=["--tokenizer-wait-secs", "0"],
        )
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            yield client
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()


def test_autoload_fetches_the_tokenizer_bundle_from_the_worker(loopback: httpx.Client) -> None:
    deadline = time.monotonic() + 15
    while loopback.get("/readiness").status_code != 200:  # the gateway serves while it autoloads
        assert time.monotonic() < deadline, loopback.get("/readiness").text
        time.sleep(0.05)
    reply = loopback.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER})
    assert reply.status_code == 200 and reply.json()["input_tokens"] > 0
    listed = loopback.get("/v1/tokenizers").json()["tokenizers"]
    assert [t["name"] for t in listed] == [MODEL]
    assert listed[0]["vocab_size"] > 0 and listed[0]["id"]
    assert loopback.get("/readiness").status_code == 200
