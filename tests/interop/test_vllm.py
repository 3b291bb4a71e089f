"""The gateway in front of a real vLLM engine: the anthropic SDK → `smg launch` → vLLM's gRPC server.

Opt-in (``make test-vllm``): it needs a vLLM CPU venv and a tiny random Qwen3 model directory,
named by ``SMG_VLLM_PYTHON`` and ``SMG_VLLM_MODEL``; without them every test is skipped. The
engine is ``vllm.entrypoints.launchers.grpc_server`` (smg-grpc-servicer's Python servicer) with a
2,048-token window; the gateway is started without ``--backend``, so it must find out by itself
that the engine speaks the vLLM protocol, and with the same model directory.

The weights are random, so the text is gibberish: the tests check the protocol's shape, counts,
finish reasons, stop matching, the context window and aborts, never what the text says.
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
import grpc
import httpx
import pytest
from anthropic.types import MessageParam
from smg_grpc_proto.generated import vllm_engine_pb2, vllm_engine_pb2_grpc

from smg.backends.grpc.engines import connect
from smg.backends.grpc.engines.detect import detect_runtime
from tests.interop.tool_choice import ask, check_answer
from tools.spawn import REPO_ROOT, Spawned, free_port, spawn_gateway

PYTHON_ENV = "SMG_VLLM_PYTHON"
MODEL_ENV = "SMG_VLLM_MODEL"
MODEL = "tiny-qwen3"
WINDOW = 2048
ENGINE_START_TIMEOUT = 180.0  # ~20 s on an idle machine; several times that when the cores are shared
USER: list[MessageParam] = [{"role": "user", "content": "Tell me something about foxes."}]
# Sampled, not greedy: greedy decoding of random weights repeats one token. This SDK has no
# `temperature` argument, so it travels in the body.
SAMPLED: dict[str, Any] = {"extra_body": {"temperature": 1.0}}

pytestmark = pytest.mark.skipif(
    not (os.environ.get(PYTHON_ENV) and os.environ.get(MODEL_ENV)),
    reason=f"real-engine interop test, opt-in: run `make test-vllm` (it sets {PYTHON_ENV} to a vLLM CPU venv's "
    f"python and {MODEL_ENV} to a tiny model directory)",
)


def _engine_healthy(target: str) -> bool:
    with grpc.insecure_channel(target) as channel:
        stub = vllm_engine_pb2_grpc.VllmEngineStub(channel)
        try:
            return bool(stub.HealthCheck(vllm_engine_pb2.HealthCheckRequest(), timeout=2.0).healthy)
        except grpc.RpcError:
            return False


def start_vllm(
    python: str,
    model: Path,
    scratch: Path,
    *,
    served_name: str = MODEL,
    window: int = WINDOW,
    env: dict[str, str] | None = None,
    timeout: float = ENGINE_START_TIMEOUT,
) -> Spawned:
    """vLLM's gRPC server on a free port, in its own process group, once HealthCheck says healthy
    (`env`: variables added to the engine's environment)."""
    port = free_port()
    args = [
        python,
        "-m",
        "vllm.entrypoints.launchers.grpc_server",
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-model-len",
        str(window),
        "--enforce-eager",
        "--dtype",
        "bfloat16",
        "--served-model-name",
        served_name,
    ]
    # vLLM leaves ipc sockets and caches behind in TMPDIR and its cache root: keep them in scratch.
    environment = {
        **os.environ,
        "TMPDIR": str(scratch),
        "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
        "HF_HUB_OFFLINE": "1",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "PYTHONUNBUFFERED": "1",
        **(env or {}),
    }
    log_path = scratch / "vllm.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            args,
            cwd=REPO_ROOT,
            env=environment,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    engine = Spawned(proc, f"grpc://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + timeout
    try:
        while not _engine_healthy(f"127.0.0.1:{port}"):
            if proc.poll() is not None:
                raise RuntimeError(f"vLLM exited with {proc.returncode} before serving:\n{engine.log()[-4000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"vLLM did not serve within {timeout:g}s:\n{engine.log()[-4000:]}")
            time.sleep(0.5)
    except BaseException:
        engine.stop(timeout=15.0)
        raise
    return engine


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(os.environ[MODEL_ENV]).resolve()


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Spawned]:
    scratch = Path(tempfile.mkdtemp(prefix="smg-vllm-"))
    spawned = start_vllm(os.environ[PYTHON_ENV], model_dir, scratch)
    try:
        yield spawned
    finally:
        spawned.stop(timeout=15.0)
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="module")
def gateway(engine: Spawned, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    journal = tmp_path_factory.mktemp("vllm-journal") / "smg-journal.db"
    extra = ["--model-path", str(model_dir), "--disable-retries"]
    spawned = spawn_gateway([engine.url], journal=journal, extra=extra, timeout=60.0)
    try:
        yield spawned
    finally:
        spawned.stop()


@pytest.fixture
def sdk(gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-interop", base_url=gateway.url, max_retries=0, timeout=60.0)


def _text(content: list[Any]) -> str:
    return "".join(block.text for block in content if block.type == "text")


def test_models_lists_the_engines_served_name(gateway: Spawned) -> None:
    models = httpx.get(f"{gateway.url}/v1/models", timeout=10.0).json()
    assert MODEL in [m["id"] for m in models["data"]]


def test_the_gateway_detected_the_vllm_protocol(gateway: Spawned, engine: Spawned) -> None:
    assert f"worker {engine.url} speaks the vllm engine protocol" in gateway.log()


async def test_detection_and_loads_from_the_real_servicer(engine: Spawned) -> None:
    assert await detect_runtime(engine.url) == "vllm"
    client = connect("vllm", engine.url)
    try:
        load = await client.loads()
    finally:
        await client.close()
    assert load is not None and load.dp_ranks == 1
    assert load.running_requests == load.waiting_requests == 0  # no request has been sent yet
    assert load.max_total_tokens > 0 and load.max_running_requests > 0
    assert 0.0 <= load.token_usage < 1.0


def test_non_streaming_answer(sdk: anthropic.Anthropic) -> None:
    message = sdk.messages.create(model=MODEL, max_tokens=24, messages=USER, **SAMPLED)
    counted = sdk.messages.count_tokens(model=MODEL, messages=USER)

    assert message.type == "message" and message.role == "assistant" and message.model == MODEL
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert all(block.type == "text" for block in message.content)
    assert message.usage.input_tokens == counted.input_tokens > 0
    assert 0 < message.usage.output_tokens <= 24
    if message.stop_reason == "max_tokens":
        assert message.usage.output_tokens == 24


def test_streaming_answer(sdk: anthropic.Anthropic) -> None:
    with sdk.messages.stream(model=MODEL, max_tokens=32, messages=USER, **SAMPLED) as stream:
        events = list(stream)
        final = stream.get_final_message()
        final_text = stream.get_final_text()

    kinds = [e.type for e in events if e.type not in ("text", "signature", "thinking", "input_json", "citation")]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    blocks = kinds[1:-2]
    assert blocks.count("content_block_start") == blocks.count("content_block_stop")
    assert set(blocks) <= {"content_block_start", "content_block_delta", "content_block_stop"}
    deltas = [e.delta.text for e in events if e.type == "content_block_delta" and e.delta.type == "text_delta"]
    assert "".join(deltas) == final_text == _text(final.content)
    assert final.stop_reason in ("max_tokens", "end_turn")
    assert 0 < final.usage.output_tokens <= 32
    assert final.usage.input_tokens == sdk.messages.count_tokens(model=MODEL, messages=USER).input_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_max_tokens_zero(gateway: Spawned, stream: bool) -> None:
    body = {"model": MODEL, "max_tokens": 0, "messages": USER, "stream": stream}
    reply = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=30.0)

    assert reply.status_code == 200, reply.text
    if not stream:
        message = reply.json()
        assert message["content"] == [] and message["stop_reason"] == "max_tokens"
        assert message["usage"]["output_tokens"] == 0 and message["usage"]["input_tokens"] > 0
    else:
        kinds = [line[7:] for line in reply.text.splitlines() if line.startswith("event: ")]
        assert kinds == ["message_start", "message_delta", "message_stop"]
        assert '"stop_reason":"max_tokens"' in reply.text.replace(" ", "")


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_one_character_stop_sequence(sdk: anthropic.Anthropic, stream: bool) -> None:
    seen = []
    for _ in range(3):  # random weights: "e" is likely within 64 tokens, never certain
        kwargs: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": USER, **SAMPLED}
        if stream:
            with sdk.messages.stream(**kwargs, stop_sequences=["e"]) as s:
                message = s.get_final_message()
        else:
            message = sdk.messages.create(**kwargs, stop_sequences=["e"])
        text = _text(message.content)
        seen.append(message.stop_reason)
        assert message.stop_reason in ("stop_sequence", "max_tokens", "end_turn")
        if message.stop_reason == "stop_sequence":
            assert message.stop_sequence == "e"
        else:
            assert message.stop_sequence is None
        assert "e" not in text, (message.stop_reason, text)
        assert 0 < message.usage.output_tokens <= 64
    print("stop reasons seen:", seen)


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_prompt_over_the_window_is_refused_by_the_gateway(sdk: anthropic.Anthropic, stream: bool) -> None:
    messages: list[MessageParam] = [{"role": "user", "content": "fox dog " * 1200}]
    assert sdk.messages.count_tokens(model=MODEL, messages=messages).input_tokens > WINDOW

    with pytest.raises(anthropic.BadRequestError) as refused:
        if stream:
            with sdk.messages.stream(model=MODEL, max_tokens=8, messages=messages) as s:
                s.get_final_message()
        else:
            sdk.messages.create(model=MODEL, max_tokens=8, messages=messages)

    assert refused.value.status_code == 400
    assert refused.value.response.headers.get("x-smg-error-code") == "context_length_exceeded"
    body = refused.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    assert f"maximum context length is {WINDOW} tokens" in body["error"]["message"]


def test_client_disconnect_mid_stream_leaves_the_next_request_unharmed(
    gateway: Spawned, engine: Spawned, sdk: anthropic.Anthropic
) -> None:
    body = {"model": MODEL, "max_tokens": 1500, "messages": USER, "stream": True, "temperature": 1.0}
    deltas = 0
    message_id = ""
    with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
        with client.stream("POST", "/v1/messages", json=body) as reply:
            assert reply.status_code == 200
            for line in reply.iter_lines():
                if line.startswith("data: ") and '"message_start"' in line:
                    message_id = json.loads(line[6:])["message"]["id"]
                if line.startswith("event: content_block_delta"):
                    deltas += 1
                    if deltas == 3:
                        break
    assert deltas == 3 and message_id

    # The gateway names the engine request after the message; vLLM's servicer logs each Abort.
    deadline = time.monotonic() + 10.0
    while f"Abort requests: ['{message_id}']" not in engine.log():
        assert time.monotonic() < deadline, "vLLM never logged the gateway's Abort of the abandoned stream"
        time.sleep(0.1)

    message = sdk.messages.create(model=MODEL, max_tokens=16, messages=USER, **SAMPLED)
    assert message.stop_reason in ("max_tokens", "end_turn") and 0 < message.usage.output_tokens <= 16
    with sdk.messages.stream(model=MODEL, max_tokens=16, messages=USER, **SAMPLED) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("max_tokens", "end_turn") and 0 < final.usage.output_tokens <= 16


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
@pytest.mark.parametrize("choice", ["any", "tool", "none"])
def test_tool_choice_is_answered_with_what_the_constraint_allows(
    sdk: anthropic.Anthropic, engine: Spawned, choice: str, stream: bool
) -> None:
    check_answer(ask(sdk, MODEL, choice, stream), choice)
    assert engine.proc.poll() is None
