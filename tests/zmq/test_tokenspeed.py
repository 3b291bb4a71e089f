"""`--backend tokenspeed` over ZMQ: TokenSpeed's native messages on the same transport, served
by the same pipeline."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smg.backends.zmq.tokenspeed import TOP_K_DISABLED
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from tests.zmq.conftest import MODEL, QWEN3, WINDOW, socket_dir, target_of, wait_ready
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_gateway, spawn_zmq_engine

USER = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def deployed() -> Iterator[tuple[Spawned, Spawned]]:
    directory = socket_dir()
    path: Path = directory / "w0"
    gateway = spawn_gateway([f"ipc://{path}"], extra=["--backend", "tokenspeed", "--model-path", MODEL])
    engine = spawn_zmq_engine(path, QWEN3, ["--max-model-len", str(WINDOW), "--runtime", "tokenspeed"])
    try:
        yield gateway, engine
    finally:
        gateway.stop()
        engine.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def http(deployed: tuple[Spawned, Spawned]) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=deployed[0].url, timeout=30.0) as client:
        wait_ready(client)
        yield client


@pytest.fixture
def control(deployed: tuple[Spawned, Spawned]) -> Iterator[EngineControl]:
    with EngineControl(target_of(deployed[1].url)) as ctl:
        ctl.reset()
        yield ctl


def test_json_answer_and_the_native_request(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "Foxes are quick."})
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 30, "messages": USER, "top_k": 5})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["content"] == [{"type": "text", "text": "Foxes are quick."}]
    assert body["stop_reason"] == "end_turn"
    # The EOS was trimmed from the ids, and still counted.
    assert body["usage"]["output_tokens"] == len(Tokenizer.load(QWEN3).encode("Foxes are quick.")) + 1
    [sent] = control.received()
    assert sent["tag"] == "TokenizedGenerateReqInput" and sent["fields"] == 11
    assert sent["request_id"] == body["id"] and sent["stream"] is True
    params = sent["sampling_params"]
    assert len(params) == 29 and params[-1] is True  # normalized
    assert params[0] == 30 and params[5] == 5 and params[1] is None and params[26] == []


def test_greedy_and_unset_top_k_are_normalized(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "A."}, {"text": "B."})
    http.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": USER, "temperature": 0})
    http.post("/v1/messages", json={"model": MODEL, "max_tokens": 5, "messages": USER, "temperature": 0.5})
    greedy, sampled = (r["sampling_params"] for r in control.received())
    assert (greedy[3], greedy[5]) == (1.0, 1)
    assert (sampled[3], sampled[5]) == (0.5, TOP_K_DISABLED)


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_the_gateways(http: httpx.Client, control: EngineControl, stream: bool) -> None:
    control.script({"text": "Dens and burrows. END of it and more", "delay_ms": 10})
    reply = http.post(
        "/v1/messages",
        json={"model": MODEL, "max_tokens": 40, "stream": stream, "stop_sequences": ["END"], "messages": USER},
    )
    assert reply.status_code == 200
    if stream:
        assert '"stop_sequence":"END"' in reply.text.replace(" ", "")
        assert "END" not in "".join(
            line for line in reply.text.splitlines() if line.startswith("data: ") and "text_delta" in line
        )
    else:
        answer = reply.json()
        assert answer["content"][0]["text"] == "Dens and burrows. "
        assert (answer["stop_reason"], answer["stop_sequence"]) == ("stop_sequence", "END")
    assert control.received()[-1]["sampling_params"][1] is None  # no stop string reaches the engine
