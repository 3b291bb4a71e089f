"""Messages over a ZMQ worker: the gateway binds, the scripted EngineCore dials in on the real
wire, and requests run through the same pipeline as gRPC (render, gateway-matched stops,
blocks, journal `tokens` events, offline replay)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from typer.testing import CliRunner

from journal.events import Rendered, Routed, Tokens
from journal.reader import JournalReader
from smg.cli.main import app
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from tests.conftest import wait_for_events
from tests.zmq.conftest import ALIAS, MODEL, QWEN3, WINDOW
from tools.engine_control import EngineControl
from tools.spawn import Spawned

USER = [{"role": "user", "content": "Tell me about foxes."}]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return Tokenizer.load(QWEN3)


def sse_events(body: str) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for frame in body.split("\n\n"):
        if frame.strip():
            event, data = frame.split("\n")[:2]
            out.append((event.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return out


def stream_text(events: list[tuple[str, dict[str, Any]]]) -> str:
    return "".join(d["delta"].get("text", "") for k, d in events if k == "content_block_delta")


def wait_until(condition: Any, what: str, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_json_answer_and_what_the_engine_received(
    http: httpx.Client, control: EngineControl, tokenizer: Tokenizer
) -> None:
    control.script({"text": "Foxes are clever."})
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 40, "messages": USER})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert body["model"] == MODEL
    assert body["content"] == [{"type": "text", "text": "Foxes are clever."}]
    assert body["stop_reason"] == "end_turn"
    [sent] = control.received()
    assert sent["fields"] == 9  # EngineCoreRequest's required fields, positionally
    assert body["usage"]["input_tokens"] == len(sent["prompt_token_ids"])
    assert body["usage"]["output_tokens"] == len(tokenizer.encode("Foxes are clever.")) + 1  # and the EOS
    assert "<|im_start|>user\nTell me about foxes.<|im_end|>" in tokenizer.decode(
        sent["prompt_token_ids"], skip_special_tokens=False
    )
    params = sent["sampling_params"]
    # EngineCore has no tokenizer: the gateway names the EOS, and never sends stop strings.
    assert params["_eos_token_id"] in tokenizer.eos_token_ids
    assert params["_eos_token_id"] in params["_all_stop_token_ids"]
    assert params["max_tokens"] == 40
    assert "stop" not in params
    assert sent["request_id"] == body["id"]


def test_sse_stream_is_the_spec_sequence(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "A fox jumps.", "chunk_size": 2})
    with http.stream(
        "POST", "/v1/messages", json={"model": ALIAS, "max_tokens": 40, "stream": True, "messages": USER}
    ) as reply:
        assert reply.status_code == 200
        events = sse_events(reply.read().decode())
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start"
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert stream_text(events) == "A fox jumps."
    assert events[0][1]["message"]["model"] == MODEL  # the alias answers with the canonical id
    assert events[-2][1]["delta"]["stop_reason"] == "end_turn"


@pytest.mark.parametrize("stream", [False, True])
def test_stop_strings_are_matched_by_the_gateway_and_end_the_engine_request(
    http: httpx.Client, control: EngineControl, stream: bool
) -> None:
    control.script({"text": "Foxes hunt at night. STOP and then much more text the engine would write", "delay_ms": 20})
    body = {"model": MODEL, "max_tokens": 60, "stream": stream, "stop_sequences": ["STOP"], "messages": USER}
    reply = http.post("/v1/messages", json=body)
    assert reply.status_code == 200, reply.text
    if stream:
        events = sse_events(reply.text)
        text, delta = stream_text(events), events[-2][1]["delta"]
        message_id = events[0][1]["message"]["id"]
    else:
        answer = reply.json()
        text, delta, message_id = answer["content"][0]["text"], answer, answer["id"]
    assert text == "Foxes hunt at night. "
    assert (delta["stop_reason"], delta["stop_sequence"]) == ("stop_sequence", "STOP")
    # The engine would go on to max_tokens: the gateway aborts it (also without a stream).
    assert wait_until(lambda: message_id in control.aborts(), "the ABORT")


def test_max_tokens_is_the_engines_limit(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "one two three four five six seven eight nine ten"})
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 3, "messages": USER})
    assert reply.json()["stop_reason"] == "max_tokens"
    assert reply.json()["usage"]["output_tokens"] == 3
    assert control.received()[-1]["sampling_params"]["max_tokens"] == 3


def test_a_system_prompt_no_window_can_hold_is_refused_untokenized(
    http: httpx.Client, control: EngineControl, zmq_journal: Path
) -> None:
    body = {"model": MODEL, "max_tokens": 10, "messages": USER, "system": "fox " * (512 << 10)}  # 2 MiB
    reply = http.post("/v1/messages", json=body, timeout=60)
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "context_length_exceeded"
    assert f"maximum context length is {WINDOW} tokens. However, your request has at least" in reply.text
    events = wait_for_events(zmq_journal, reply.headers["x-request-id"])
    assert [e.kind for e in events] == ["received", "validated", "error", "completed"]
    assert control.received() == []
    with JournalReader(zmq_journal) as reader:
        row = reader.get_request(reply.headers["x-request-id"])
    assert row is not None and row["model"] == MODEL  # a refused request records the model it asked for


def test_an_over_long_prompt_is_refused_before_the_engine_then_a_normal_request_works(
    http: httpx.Client, control: EngineControl
) -> None:
    long = [{"role": "user", "content": "fox " * (WINDOW * 2)}]
    reply = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 10, "messages": long})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert f"maximum context length is {WINDOW} tokens" in reply.json()["error"]["message"]
    # The scripted engine, like vLLM, dies on such a prompt: it never saw it, and still serves.
    assert control.received() == []
    control.script({"text": "Still here."})
    after = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 10, "messages": USER})
    assert after.status_code == 200 and after.json()["content"][0]["text"] == "Still here."


def test_count_tokens_and_max_tokens_zero_are_answered_by_the_gateway(
    http: httpx.Client, control: EngineControl
) -> None:
    counted = http.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER})
    assert counted.status_code == 200
    zero = http.post("/v1/messages", json={"model": MODEL, "max_tokens": 0, "messages": USER})
    assert zero.status_code == 200
    assert zero.json()["stop_reason"] == "max_tokens"
    assert zero.json()["usage"]["input_tokens"] == counted.json()["input_tokens"]
    assert control.received() == []


def test_a_client_that_goes_away_has_its_engine_request_aborted(
    zmq_gateway: Spawned, http: httpx.Client, control: EngineControl, zmq_journal: Path
) -> None:
    control.script({"text": "one two three four five six seven", "hold_after": 2})
    with httpx.Client(base_url=zmq_gateway.url, timeout=30.0) as client:
        with client.stream(
            "POST", "/v1/messages", json={"model": MODEL, "max_tokens": 40, "stream": True, "messages": USER}
        ) as reply:
            request_id = reply.headers["x-request-id"]
            lines = reply.iter_lines()
            first = next(line for line in lines if line.startswith("data: "))
            message_id = json.loads(first[6:])["message"]["id"]
    assert wait_until(lambda: message_id in control.aborts(), "the ABORT of the abandoned stream")
    # The cut stream keeps its prompt's tokens (and so its cost).
    wait_for_events(zmq_journal, request_id)
    with JournalReader(zmq_journal) as reader:
        row = reader.get_request(request_id)
    assert row is not None and row["model"] == MODEL
    assert row["input_tokens"] == len(control.received()[-1]["prompt_token_ids"]) > 0


def test_the_sdk_and_the_journal_and_offline_replay(
    zmq_gateway: Spawned, http: httpx.Client, control: EngineControl, zmq_journal: Path
) -> None:
    control.script({"text": "Foxes live in dens. Really."})
    sdk = anthropic.Anthropic(api_key="unused", base_url=zmq_gateway.url, max_retries=0)
    raw = sdk.messages.with_raw_response.create(model=MODEL, max_tokens=30, messages=USER)  # type: ignore[arg-type]
    request_id = raw.headers["x-request-id"]
    message = raw.parse()
    assert message.content[0].text == "Foxes live in dens. Really."  # type: ignore[union-attr]
    events = wait_for_events(zmq_journal, request_id)
    routed = [e for e in events if isinstance(e, Routed)]
    assert routed[-1].backend == "zmq" and routed[-1].worker is not None and routed[-1].worker.startswith("ipc://")
    assert any(isinstance(e, Rendered) for e in events)
    tokens = [t for e in events if isinstance(e, Tokens) for t in e.ids]
    assert len(tokens) == message.usage.output_tokens
    replayed = CliRunner().invoke(app, ["replay", request_id, "--offline", "--journal", str(zmq_journal)])
    assert replayed.exit_code == 0, replayed.output
    assert "identical" in replayed.output and "byte for byte" in replayed.output, replayed.output
