"""Tokenizer states, the tokenizer admin API and the context window, on the gRPC path.

Each state is produced the way an operator would meet it: a tokenizer removed or
registered through the admin API, a worker whose tokenizer cannot be fetched, autoload
disabled, a load that has not finished (its tokenizer.json is a FIFO the test feeds).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.grpc.conftest import MODEL, QWEN3, target_of
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

USER = [{"role": "user", "content": "Count me."}]


def count(client: httpx.Client, model: str = MODEL, messages: list[dict[str, object]] = USER) -> httpx.Response:
    return client.post("/v1/messages/count_tokens", json={"model": model, "messages": messages})


@pytest.fixture
def private(tmp_path: Path) -> Iterator[tuple[Spawned, httpx.Client]]:
    """A gateway of the test's own (its tokenizers are changed), in front of the shared engine
    but started with autoload from the engine's bundle (no --model-path)."""
    engine = spawn_engine(
        "sglang", model_path=QWEN3, extra=["--served-model-name", MODEL, "--reported-model-path", "/nonexistent/qwen3"]
    )
    # A request never waits for a loading tokenizer here: the tests see its states at once.
    gateway = spawn_gateway([engine.url], journal=tmp_path / "j.db", extra=["--tokenizer-wait-secs", "0"])
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            wait_ready(client)  # the gateway serves while the tokenizer autoloads
            yield engine, client
    finally:
        gateway.stop()
        engine.stop()


def wait_ready(client: httpx.Client) -> None:
    deadline = time.monotonic() + 15
    while client.get("/readiness").status_code != 200:
        assert time.monotonic() < deadline, client.get("/readiness").text
        time.sleep(0.05)


def test_the_gateway_serves_while_a_tokenizer_autoloads(tmp_path: Path) -> None:
    """Discovery does not wait for the tokenizer fetched from the worker: until it is loaded
    (and past `--tokenizer-wait-secs`), its model's requests are 503 `tokenizer_not_ready` and
    the gateway is not ready."""
    engine = spawn_engine(
        "sglang",
        model_path=QWEN3,
        extra=["--served-model-name", MODEL, "--reported-model-path", "/nonexistent/qwen3", "--hold-tokenizer"],
    )
    try:
        with spawn_gateway([engine.url], journal=tmp_path / "j.db", extra=["--tokenizer-wait-secs", "0"]) as gateway:
            with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
                refused = count(client)
                assert refused.status_code == 503, refused.text
                assert refused.headers["x-smg-error-code"] == "tokenizer_not_ready"
                assert refused.headers["retry-after"] == "1"
                assert refused.json()["error"]["type"] == "overloaded_error"
                assert client.get("/readiness").status_code == 503
                with EngineControl(engine.url.split("://", 1)[1]) as control:
                    control.release()
                wait_ready(client)
                assert count(client).status_code == 200
    finally:
        engine.stop()


def wait_status(client: httpx.Client, key: str, status: str) -> dict[str, object]:
    deadline = time.monotonic() + 15
    while True:
        body = client.get(f"/v1/tokenizers/{key}/status").json()
        if body.get("status") == status:
            return body
        assert time.monotonic() < deadline, body
        time.sleep(0.05)


def test_autoload_fetches_the_tokenizer_bundle_from_the_worker(private: tuple[Spawned, httpx.Client]) -> None:
    _, client = private
    reply = count(client)
    assert reply.status_code == 200 and reply.json()["input_tokens"] > 0
    listed = client.get("/v1/tokenizers").json()["tokenizers"]
    assert [t["name"] for t in listed] == [MODEL]
    assert listed[0]["vocab_size"] > 0 and listed[0]["id"]
    assert client.get("/readiness").status_code == 200


def test_removed_tokenizer_is_load_failed_until_one_registers(private: tuple[Spawned, httpx.Client]) -> None:
    _, client = private
    assert count(client).status_code == 200
    assert client.delete(f"/v1/tokenizers/{MODEL}").status_code == 200
    refused = count(client)
    assert refused.status_code == 503
    assert refused.headers["x-smg-error-code"] == "tokenizer_load_failed"
    assert "retry-after" not in refused.headers
    assert "removed" in refused.json()["error"]["message"]
    assert refused.json()["error"]["type"] == "overloaded_error"
    posted = client.post("/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3)})
    assert posted.status_code == 202 and posted.json()["status"] == "pending"
    assert posted.json()["message"] == f"Tokenizer '{MODEL}' registration job submitted. Loading from: {QWEN3}"
    wait_status(client, posted.json()["id"], "completed")
    assert count(client).status_code == 200
    again = client.post("/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3)})
    assert again.status_code == 409 and again.json()["status"] == "failed"


def test_failed_load_is_load_failed_naming_the_reason(private: tuple[Spawned, httpx.Client], tmp_path: Path) -> None:
    _, client = private
    client.delete(f"/v1/tokenizers/{MODEL}")
    empty = tmp_path / "empty"
    empty.mkdir()
    posted = client.post("/v1/tokenizers", json={"name": MODEL, "source": str(empty)})
    wait_status(client, posted.json()["id"], "failed")
    refused = count(client)
    assert refused.status_code == 503 and refused.headers["x-smg-error-code"] == "tokenizer_load_failed"
    assert str(empty) in refused.json()["error"]["message"]
    # The same refusal on /v1/messages.
    generate = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": USER})
    assert generate.status_code == 503 and generate.headers["x-smg-error-code"] == "tokenizer_load_failed"


def test_loading_tokenizer_is_not_ready_with_retry_after(
    private: tuple[Spawned, httpx.Client], tmp_path: Path
) -> None:
    _, client = private
    client.delete(f"/v1/tokenizers/{MODEL}")
    # The load reads its chat template from a pipe, and cannot finish before the test writes it.
    template = tmp_path / "template.jinja"
    os.mkfifo(template)
    posted = client.post(
        "/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3), "chat_template_path": str(template)}
    )
    assert posted.status_code == 202
    refused = count(client)
    assert refused.status_code == 503
    assert refused.headers["x-smg-error-code"] == "tokenizer_not_ready"
    assert refused.headers["retry-after"] == "1"
    assert client.get(f"/v1/tokenizers/{MODEL}/status").json()["status"] in ("pending", "processing")
    assert client.get("/readiness").status_code == 503
    feeder = threading.Thread(target=lambda: template.write_text((QWEN3 / "chat_template.jinja").read_text()))
    feeder.start()
    wait_status(client, MODEL, "completed")
    feeder.join()
    assert count(client).status_code == 200


def test_unknown_model_is_404_even_with_a_tokenizer_of_that_name(private: tuple[Spawned, httpx.Client]) -> None:
    _, client = private
    posted = client.post("/v1/tokenizers", json={"name": "ghost-model", "source": str(QWEN3)})
    wait_status(client, posted.json()["id"], "completed")
    reply = count(client, model="ghost-model")
    assert reply.status_code == 404 and reply.headers["x-smg-error-code"] == "model_not_found"


def test_worker_without_a_usable_tokenizer_is_load_failed(tmp_path: Path) -> None:
    engine = spawn_engine(
        "sglang",
        model_path=QWEN3,
        extra=["--served-model-name", MODEL, "--reported-model-path", "/nonexistent/qwen3", "--no-tokenizer-bundle"],
    )
    gateway = spawn_gateway([engine.url], journal=tmp_path / "j.db")
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            reply = count(client)
            assert reply.status_code == 503
            assert reply.headers["x-smg-error-code"] == "tokenizer_load_failed"
            assert "retry-after" not in reply.headers
            assert "no path" in reply.json()["error"]["message"]
            assert client.get("/readiness").status_code == 503
    finally:
        gateway.stop()
        engine.stop()


def test_autoload_disabled_without_a_tokenizer_is_500_not_found(engine: Spawned, tmp_path: Path) -> None:
    gateway = spawn_gateway([engine.url], journal=tmp_path / "j.db", extra=["--disable-tokenizer-autoload"])
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            reply = count(client)
            assert reply.status_code == 500
            assert reply.headers["x-smg-error-code"] == "tokenizer_not_found"
            assert reply.json()["error"]["message"] == f"Tokenizer not found for model: {MODEL}"
            # An operator registers one: served from then on.
            posted = client.post("/v1/tokenizers", json={"name": MODEL, "source": str(QWEN3)})
            wait_status(client, posted.json()["id"], "completed")
            assert count(client).status_code == 200
    finally:
        gateway.stop()


def test_admin_api_is_behind_the_api_key(engine: Spawned, tmp_path: Path) -> None:
    gateway = spawn_gateway(
        [engine.url], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3), "--api-key", "sekret"]
    )
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            assert client.get("/v1/tokenizers").status_code == 401
            assert client.post("/v1/tokenizers", json={"name": "x", "source": "y"}).status_code == 401
            ok = client.get("/v1/tokenizers", headers={"authorization": "Bearer sekret"})
            assert ok.status_code == 200 and ok.json()["tokenizers"][0]["name"] == MODEL
    finally:
        gateway.stop()


# --- the context window -------------------------------------------------------------------


def _messages_with(count_of: Callable[[list[dict[str, object]]], int], target: int) -> list[dict[str, object]]:
    """A conversation whose rendered prompt is exactly `target` tokens."""

    def convo(text: str) -> list[dict[str, object]]:
        return [{"role": "user", "content": text}]

    text = "hi"
    while (n := count_of(convo(text))) < target - 1:
        text += " a"
    for filler in ("", " a", " b", ".", "!", " 1", ",", " a a", " b b", "?!"):
        if count_of(convo(text + filler)) == target:
            return convo(text + filler)
    raise AssertionError(f"no conversation of exactly {target} tokens near {n}")


def test_context_window_edge(tmp_path: Path) -> None:
    window = 64
    engine = spawn_engine(
        "sglang", model_path=QWEN3, extra=["--served-model-name", MODEL, "--max-context-length", str(window)]
    )
    gateway = spawn_gateway([engine.url], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3)])
    control = EngineControl(target_of(engine.url))
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:

            def count_of(messages: list[dict[str, object]]) -> int:
                return int(count(client, messages=messages).json()["input_tokens"])

            fits = _messages_with(count_of, window)
            over = _messages_with(count_of, window + 1)
            for stream in (False, True):
                ok = client.post(
                    "/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": fits, "stream": stream}
                )
                assert ok.status_code == 200
                refused = client.post(
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
            before = len(control.received())
            zero = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": over})
            assert zero.status_code == 400 and zero.headers["x-smg-error-code"] == "context_length_exceeded"
            assert (
                client.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": fits}).status_code == 200
            )
            assert len(control.received()) == before
    finally:
        control.close()
        gateway.stop()
        engine.stop()


def test_the_admin_api_answers_in_the_references_shapes(private: tuple[Spawned, httpx.Client]) -> None:
    """TokenizerInfo, AddTokenizerResponse and RemoveTokenizerResponse of the reference
    (`routers/tokenize/handlers.rs`); `vocab_size` is the base vocabulary, added tokens left out."""
    from tokenizers import Tokenizer as RustTokenizer

    _, client = private
    base = RustTokenizer.from_file(str(QWEN3 / "tokenizer.json")).get_vocab_size(with_added_tokens=False)
    [listed] = client.get("/v1/tokenizers").json()["tokenizers"]
    assert set(listed) == {"id", "name", "source", "vocab_size"} and listed["vocab_size"] == base
    assert client.get(f"/v1/tokenizers/{listed['id']}").json() == listed
    assert client.get(f"/v1/tokenizers/{MODEL}/status").json() == {
        "id": listed["id"],
        "status": "completed",
        "message": f"Tokenizer '{MODEL}' is loaded and ready",
        "vocab_size": base,
    }
    removed = client.delete(f"/v1/tokenizers/{listed['id']}")
    assert removed.status_code == 200
    assert removed.json() == {"success": True, "message": f"Tokenizer '{MODEL}' removed successfully"}
    again = client.delete(f"/v1/tokenizers/{listed['id']}")
    assert again.status_code == 404
    assert again.json() == {"success": False, "message": f"Tokenizer '{listed['id']}' not found"}
    missing = client.get(f"/v1/tokenizers/{listed['id']}")
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "tokenizer_not_found"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_request_right_after_post_workers_is_answered(tmp_path: Path, stream: bool) -> None:
    """A worker added at run time is discovered and its tokenizer fetched and loaded while the
    first request for its model waits: that request is answered, not 503."""
    engine = spawn_engine(
        "vllm", model_path=QWEN3, extra=["--served-model-name", MODEL, "--reported-model-path", "/nonexistent/qwen3"]
    )
    # XDG_CACHE_HOME: a cold start, no tokenizer bundle left by an earlier run.
    gateway = spawn_gateway(
        [], journal=tmp_path / "j.db", extra=["--enable-igw"], env={"XDG_CACHE_HOME": str(tmp_path / "cache")}
    )
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            added = client.post("/workers", json={"url": engine.url})
            assert added.status_code == 202, added.text
            reply = client.post(
                "/v1/messages", json={"model": MODEL, "max_tokens": 16, "messages": USER, "stream": stream}
            )
            assert reply.status_code == 200, reply.text
            assert ("event: message_stop" in reply.text) if stream else reply.json()["content"][0]["text"]
            assert count(client).status_code == 200
    finally:
        gateway.stop()
        engine.stop()
