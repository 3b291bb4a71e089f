"""The gateway in front of a real vLLM EngineCore over ZMQ: `smg launch --worker-urls ipc://…`
binds, then `vllm serve --headless` dials its handshake port, as the reference gateway pairs them.

Opt-in (``make test-vllm``), like `test_vllm.py`: ``SMG_VLLM_PYTHON`` names a vLLM CPU venv's
python and ``SMG_VLLM_MODEL`` the tiny random Qwen3 directory; without them every test is
skipped. Over ZMQ the model id is the `--model-path` string (EngineCore reports no name), so
the gateway is given the alias `tiny-qwen3` for it. The weights are random: the tests check
shapes, counts, finish reasons, gateway-matched stops, the window and aborts, never the text.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam

from smg.backends.zmq.addresses import zmq_addresses
from tests.interop.tool_choice import ask, check_answer
from tools.spawn import REPO_ROOT, Spawned, spawn_gateway

PYTHON_ENV = "SMG_VLLM_PYTHON"
MODEL_ENV = "SMG_VLLM_MODEL"
ALIAS = "tiny-qwen3"
WINDOW = 2048
ENGINE_START_TIMEOUT = 240.0  # ~20 s alone; much more when the cores are shared
USER: list[MessageParam] = [{"role": "user", "content": "Tell me something about foxes."}]
SAMPLED: dict[str, Any] = {"extra_body": {"temperature": 1.0}}

pytestmark = pytest.mark.skipif(
    not (os.environ.get(PYTHON_ENV) and os.environ.get(MODEL_ENV)),
    reason=f"real-engine interop test, opt-in: run `make test-vllm` (it sets {PYTHON_ENV} and {MODEL_ENV})",
)


def start_headless_vllm(python: str, model: Path, url: str, scratch: Path) -> Spawned:
    """`vllm serve --headless` dialling the handshake port the gateway derived from `url`."""
    port = zmq_addresses(url).handshake.rsplit(":", 1)[1]
    vllm = str(Path(python).parent / "vllm")
    args = [python, vllm, "serve", str(model), "--headless", "--data-parallel-size", "1",
            "--data-parallel-size-local", "1", "--data-parallel-address", "127.0.0.1",
            "--data-parallel-rpc-port", port, "--max-model-len", str(WINDOW), "--enforce-eager",
            "--dtype", "bfloat16"]
    env = {**os.environ, "TMPDIR": str(scratch), "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
           "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}
    log_path = scratch / "vllm-zmq.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Spawned(proc, url, log_path)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(os.environ[MODEL_ENV]).resolve()


@pytest.fixture(scope="module")
def deployment(model_dir: Path) -> Iterator[tuple[Spawned, Spawned]]:
    """The gateway first (it binds), then the engine; both stopped together, as they must be."""
    scratch = Path(tempfile.mkdtemp(prefix="smg-vllm-zmq-"))
    url = f"ipc://{scratch}/zmq/w0"
    extra = ["--backend", "vllm", "--model-path", str(model_dir), "--model-alias", f"{ALIAS}={model_dir}",
             "--disable-retries"]
    gateway = spawn_gateway([url], extra=extra, timeout=60.0)
    engine = start_headless_vllm(os.environ[PYTHON_ENV], model_dir, url, scratch)
    try:
        deadline = time.monotonic() + ENGINE_START_TIMEOUT
        while httpx.get(f"{gateway.url}/readiness", timeout=5.0).status_code != 200:
            if engine.proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {engine.proc.returncode}:\n{engine.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"the ZMQ worker never became ready:\n{gateway.log()[-3000:]}")
            time.sleep(0.5)
        yield gateway, engine
    finally:
        gateway.stop()
        engine.stop(timeout=15.0)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture
def gateway(deployment: tuple[Spawned, Spawned]) -> Spawned:
    return deployment[0]


@pytest.fixture
def sdk(gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="unused", base_url=gateway.url, max_retries=0, timeout=60.0)


def _text(content: list[Any]) -> str:
    return "".join(block.text for block in content if block.type == "text")


def test_the_model_id_is_the_model_path_and_the_window_the_engines(gateway: Spawned, model_dir: Path) -> None:
    models = httpx.get(f"{gateway.url}/v1/models", timeout=10.0).json()["data"]
    ids = {m["id"]: m for m in models}
    assert str(model_dir) in ids and ALIAS in ids
    assert "engine 0 registered" in gateway.log() and f"max_model_len {WINDOW}" in gateway.log()


def test_json_answer(sdk: anthropic.Anthropic) -> None:
    message = sdk.messages.create(model=ALIAS, max_tokens=24, messages=USER, **SAMPLED)
    counted = sdk.messages.count_tokens(model=ALIAS, messages=USER)
    assert message.type == "message" and message.stop_reason in ("max_tokens", "end_turn")
    assert message.usage.input_tokens == counted.input_tokens > 0
    assert 0 < message.usage.output_tokens <= 24
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == 24


def test_sse_answer(sdk: anthropic.Anthropic) -> None:
    with sdk.messages.stream(model=ALIAS, max_tokens=32, messages=USER, **SAMPLED) as stream:
        events = list(stream)
        final = stream.get_final_message()
    kinds = [e.type for e in events if e.type not in ("text", "signature", "thinking", "input_json", "citation")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert "".join(deltas) == _text(final.content)
    assert final.stop_reason in ("max_tokens", "end_turn") and 0 < final.usage.output_tokens <= 32


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_stop_strings_are_matched_by_the_gateway(sdk: anthropic.Anthropic, stream: bool) -> None:
    stops = ["e", "a", "o"]  # the engine never sees them; 200 random tokens all but surely hold one
    kwargs: dict[str, Any] = {"model": ALIAS, "max_tokens": 200, "messages": USER, "stop_sequences": stops, **SAMPLED}
    if stream:
        with sdk.messages.stream(**kwargs) as s:
            message = s.get_final_message()
    else:
        message = sdk.messages.create(**kwargs)
    assert message.stop_reason == "stop_sequence" and message.stop_sequence in stops, message
    assert not any(s in _text(message.content) for s in stops)
    assert message.usage.output_tokens < 200


def test_an_over_long_prompt_is_refused_and_the_engine_lives_on(
    sdk: anthropic.Anthropic, deployment: tuple[Spawned, Spawned]
) -> None:
    messages: list[MessageParam] = [{"role": "user", "content": "fox dog " * 1200}]
    with pytest.raises(anthropic.BadRequestError) as refused:
        sdk.messages.create(model=ALIAS, max_tokens=8, messages=messages)
    assert refused.value.response.headers.get("x-smg-error-code") == "context_length_exceeded"
    # Sent to EngineCore this prompt would kill it (the reference gateway sends it); it never was.
    message = sdk.messages.create(model=ALIAS, max_tokens=8, messages=USER, **SAMPLED)
    assert 0 < message.usage.output_tokens <= 8
    assert deployment[1].proc.poll() is None


def test_client_disconnect_sends_an_abort_and_the_next_request_is_unharmed(
    gateway: Spawned, sdk: anthropic.Anthropic
) -> None:
    body = {"model": ALIAS, "max_tokens": 1500, "messages": USER, "stream": True, "temperature": 1.0}
    deltas, message_id = 0, ""
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        with client.stream("POST", "/v1/messages", json=body) as reply:
            for line in reply.iter_lines():
                if line.startswith("data: ") and '"message_start"' in line:
                    message_id = json.loads(line[6:])["message"]["id"]
                if line.startswith("event: content_block_delta"):
                    deltas += 1
                    if deltas == 3:
                        break
    assert deltas == 3 and message_id
    # EngineCore never acknowledges an abort (and was seen to ignore some): what is checked is
    # that the gateway closed the request and sent the ABORT, unless the engine, faster than a
    # gateway sharing its cores, had already finished it; and that the engine still serves.
    deadline = time.monotonic() + 10.0
    closed = f"request {message_id} closed after "
    while closed not in gateway.log():
        assert time.monotonic() < deadline, "the gateway never closed the abandoned request"
        time.sleep(0.1)
    line = next(line for line in gateway.log().splitlines() if closed in line)
    if line.endswith("ABORT follows"):
        while f"ABORT of {message_id} sent" not in gateway.log():
            assert time.monotonic() < deadline, "the gateway never sent the ABORT"
            time.sleep(0.1)
    else:
        assert line.endswith("the engine had finished it"), line
    message = sdk.messages.create(model=ALIAS, max_tokens=16, messages=USER, **SAMPLED)
    assert 0 < message.usage.output_tokens <= 16


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("choice", ["any", "tool", "none"])
def test_tool_choice_is_answered_and_the_engine_lives_on(
    sdk: anthropic.Anthropic, deployment: tuple[Spawned, Spawned], choice: str, stream: bool
) -> None:
    # EngineCore builds no structured-output backend of its own: the frontend names it in the
    # request, as vLLM's own frontend does, or the engine fails the request (and used to die).
    check_answer(ask(sdk, ALIAS, choice, stream), choice)
    assert deployment[1].proc.poll() is None, deployment[1].log()[-3000:]


def test_last_an_engine_killed_under_a_stream_ends_it_with_an_error_event(
    gateway: Spawned, deployment: tuple[Spawned, Spawned]
) -> None:
    """Last in the module: it kills the module's engine. EngineCore and its server die at once
    (SIGKILL) while a stream is being answered: the stream ends with an `error` event, and the
    worker is out."""
    body = {"model": ALIAS, "max_tokens": 1500, "messages": USER, "stream": True, "temperature": 1.0}
    kinds: list[str] = []
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        with client.stream("POST", "/v1/messages", json=body) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line.startswith("event: "):
                    kinds.append(line[7:])
                    if kinds.count("content_block_delta") == 3:
                        deployment[1].kill()
                elif line.startswith("data: ") and kinds[-1] == "error":
                    error = json.loads(line[6:])["error"]
        assert kinds[0] == "message_start" and kinds[-1] == "error", kinds
        assert "message_stop" not in kinds and error["type"] == "api_error", error
        refused = client.post("/v1/messages", json={**body, "stream": False, "max_tokens": 8})
        assert refused.status_code == 503 and refused.headers["x-smg-error-code"] == "no_available_workers"
