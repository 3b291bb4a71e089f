"""The real model on the real vLLM CPU engine: the anthropic SDK → `smg launch` → vLLM's gRPC server.

Opt-in (``make test-vllm``), next to the tiny random Qwen3 of `test_vllm.py`: SmolLM2-135M-Instruct,
converted from the demo's GGUF to a bf16 safetensors directory (`tools/convert_gguf.py`; vLLM 0.32
has no CPU GGUF loader), with the tokenizer `smg engine export-tokenizer` wrote. This is the tier
where a third party's protocol code (smg-grpc-servicer's vLLM servicer) talks to the gateway with
a model that answers sensibly. The servicer's own warm-up is switched off to keep the start near
20 s. As with the llama.cpp engine, only structure is asserted, never the words.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest

from tests.interop.test_vllm import PYTHON_ENV, start_vllm
from tools.spawn import Spawned, spawn_gateway

REAL_MODEL_ENV = "SMG_VLLM_REAL_MODEL"
MODEL = "smollm2-135m-instruct"
WINDOW = 4096
HELLO: list[Any] = [{"role": "user", "content": "Say hello in one short sentence."}]
GREEDY: dict[str, Any] = {"extra_body": {"temperature": 0}}
WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}

pytestmark = pytest.mark.skipif(
    not (os.environ.get(PYTHON_ENV) and os.environ.get(REAL_MODEL_ENV)),
    reason=f"real-engine interop test, opt-in: run `make test-vllm` (it sets {PYTHON_ENV} and {REAL_MODEL_ENV})",
)


@pytest.fixture(scope="module")
def model_dir() -> Path:
    return Path(os.environ[REAL_MODEL_ENV]).resolve()


@pytest.fixture(scope="module")
def engine(model_dir: Path) -> Iterator[Spawned]:
    scratch = Path(tempfile.mkdtemp(prefix="smg-vllm-real-"))
    try:
        # The servicer's own warm-up is off: it would add a minute to the start on this CPU.
        spawned = start_vllm(
            os.environ[PYTHON_ENV],
            model_dir,
            scratch,
            served_name=MODEL,
            window=WINDOW,
            env={"SMG_VLLM_SERVICER_WARMUP": "off"},
        )
        try:
            yield spawned
        finally:
            spawned.stop(timeout=15.0)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.fixture(scope="module")
def gateway(engine: Spawned, model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Spawned]:
    journal = tmp_path_factory.mktemp("vllm-real-journal") / "smg-journal.db"
    extra = ["--backend", "vllm", "--model-path", str(model_dir), "--tool-call-parser", "qwen", "--disable-retries"]
    spawned = spawn_gateway([engine.url], journal=journal, extra=extra, timeout=60.0)
    try:
        yield spawned
    finally:
        spawned.stop()


@pytest.fixture
def sdk(gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-interop", base_url=gateway.url, max_retries=0, timeout=60.0)


def test_a_short_answer_ends_its_turn_and_counts_agree(sdk: anthropic.Anthropic) -> None:
    message = sdk.messages.create(model=MODEL, max_tokens=48, messages=HELLO, **GREEDY)
    assert message.stop_reason == "end_turn" and 0 < message.usage.output_tokens < 48
    assert message.content[0].type == "text" and message.content[0].text.strip()
    assert message.usage.input_tokens == sdk.messages.count_tokens(model=MODEL, messages=HELLO).input_tokens


def test_the_greedy_stream_equals_the_greedy_json(sdk: anthropic.Anthropic) -> None:
    user: list[Any] = [{"role": "user", "content": "Write one sentence about the sea."}]
    plain = sdk.messages.create(model=MODEL, max_tokens=40, messages=user, **GREEDY)
    with sdk.messages.stream(model=MODEL, max_tokens=40, messages=user, **GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].type == plain.content[0].type == "text"
    assert streamed.content[0].text == plain.content[0].text
    assert (streamed.stop_reason, streamed.usage.output_tokens) == (plain.stop_reason, plain.usage.output_tokens)


def test_a_stop_sequence_stops(gateway: Spawned) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 40,
        "temperature": 0,
        "messages": [{"role": "user", "content": "Write one sentence about the sea."}],
    }
    full = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=60).json()["content"][0]["text"]
    # Three characters from the middle of the greedy answer: wherever they first occur, it stops there.
    middle = len(full) // 2
    stop = full[middle : middle + 3]
    assert len(stop) == 3 and stop.strip(), full
    stopped = httpx.post(f"{gateway.url}/v1/messages", json={**body, "stop_sequences": [stop]}, timeout=60).json()
    assert (stopped["stop_reason"], stopped["stop_sequence"]) == ("stop_sequence", stop)
    assert "".join(b.get("text", "") for b in stopped["content"]) == full[: full.index(stop)]


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_forced_tool_choice_gives_a_valid_tool_use(sdk: anthropic.Anthropic, stream: bool) -> None:
    request: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "What is the weather like in Paris?"}],
        **GREEDY,
    }
    if stream:
        with sdk.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = sdk.messages.create(**request)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    json.dumps(call.input)
