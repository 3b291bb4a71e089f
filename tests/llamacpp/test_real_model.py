"""The real model through the gateway's gRPC path: properties of its answers, never their words."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import anthropic
import httpx
import jsonschema
import pytest
from typer.testing import CliRunner

from smg.cli.main import app
from tests.conftest import wait_for_events
from tests.llamacpp.conftest import MODEL, Engine, ask
from tools.spawn import Spawned

WEATHER = {
    "name": "get_weather",
    "description": "The current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def sse_events(text: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]


def streamed_message(events: list[dict[str, Any]]) -> tuple[str, str | None, dict[str, Any]]:
    """(the text, the stop reason, the final usage) of an SSE stream."""
    text = "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta" and "text" in e["delta"])
    delta = next(e for e in events if e["type"] == "message_delta")
    return text, delta["delta"]["stop_reason"], delta["usage"]


def test_a_short_answer_ends_its_turn(http: httpx.Client) -> None:
    body = http.post("/v1/messages", json=ask()).json()
    assert body["stop_reason"] == "end_turn", body
    assert body["content"][0]["type"] == "text" and body["content"][0]["text"].strip()
    assert 0 < body["usage"]["output_tokens"] < 48


def test_count_tokens_equals_the_input_tokens_of_the_answer(http: httpx.Client) -> None:
    request = ask(system="Answer briefly.", messages=[{"role": "user", "content": "Name one colour."}])
    counted = http.post("/v1/messages/count_tokens", json={k: request[k] for k in ("model", "system", "messages")})
    answer = http.post("/v1/messages", json=request).json()
    assert counted.json()["input_tokens"] == answer["usage"]["input_tokens"] > 0


def test_the_greedy_stream_equals_the_greedy_json(http: httpx.Client) -> None:
    request = ask("Write one sentence about the sea.", max_tokens=40)
    plain = http.post("/v1/messages", json=request).json()
    streamed = http.post("/v1/messages", json={**request, "stream": True})
    text, stop_reason, usage = streamed_message(sse_events(streamed.text))
    assert text == plain["content"][0]["text"] and text
    assert stop_reason == plain["stop_reason"]
    assert usage["output_tokens"] == plain["usage"]["output_tokens"]
    assert usage["input_tokens"] == plain["usage"]["input_tokens"]


def test_max_tokens_cuts_the_answer(http: httpx.Client) -> None:
    body = http.post("/v1/messages", json=ask("Count from one to fifty in words.", max_tokens=7)).json()
    assert body["stop_reason"] == "max_tokens"
    assert body["usage"]["output_tokens"] == 7


@pytest.mark.parametrize("stream", [False, True])
def test_stop_sequences_stop_the_answer(http: httpx.Client, stream: bool) -> None:
    request = ask("Count from one to ten in words, separated by commas.", max_tokens=40)
    full = http.post("/v1/messages", json=request).json()["content"][0]["text"]
    words = full.split()
    assert len(words) >= 4, full
    # A multi-token stop (matched by the gateway) and a single-token one (given to the engine as an id).
    for stop in (" ".join(words[2:4]), ","):
        if stop not in full:
            continue
        stopped = http.post("/v1/messages", json={**request, "stop_sequences": [stop], "stream": stream})
        if stream:
            text, stop_reason, _ = streamed_message(sse_events(stopped.text))
            stop_sequence = next(e for e in sse_events(stopped.text) if e["type"] == "message_delta")["delta"][
                "stop_sequence"
            ]
        else:
            body = stopped.json()
            text = body["content"][0]["text"] if body["content"] else ""
            stop_reason, stop_sequence = body["stop_reason"], body["stop_sequence"]
        assert (stop_reason, stop_sequence) == ("stop_sequence", stop)
        assert text == full[: full.index(stop)]


@pytest.mark.parametrize("stream", [False, True])
def test_forced_tool_choice_gives_a_valid_tool_use(real_gateway: Spawned, stream: bool) -> None:
    client = anthropic.Anthropic(base_url=real_gateway.url, api_key="unused", max_retries=0)
    request: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "extra_body": {"temperature": 0},  # newer SDKs take no sampling arguments of their own
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "messages": [{"role": "user", "content": "What is the weather like in Paris?"}],
    }
    if stream:
        with client.messages.stream(**request) as events:
            message = events.get_final_message()
    else:
        message = client.messages.create(**request)
    assert message.stop_reason == "tool_use"
    (call,) = [block for block in message.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])


def test_a_tool_result_turn_renders_and_answers(http: httpx.Client) -> None:
    messages = [
        {"role": "user", "content": "What is the weather like in Paris?"},
        {
            "role": "assistant",
            "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}],
        },
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 degrees."}],
        },
    ]
    body = http.post("/v1/messages", json=ask(tools=[WEATHER], messages=messages, max_tokens=32)).json()
    assert body["type"] == "message" and body["stop_reason"] in ("end_turn", "max_tokens", "tool_use"), body


def test_concurrent_requests_all_answer(real_gateway: Spawned, engine: Engine) -> None:
    prompts = ["Name a fruit.", "Name a country.", "Name an animal.", "Name a planet."]
    engine.wait_idle()
    before = engine.generated_tokens()

    def one(prompt: str) -> dict[str, Any]:
        with httpx.Client(base_url=real_gateway.url, timeout=60.0) as client:
            answer: dict[str, Any] = client.post("/v1/messages", json=ask(prompt, max_tokens=24)).json()
            return answer

    with ThreadPoolExecutor(len(prompts)) as pool:
        answers = list(pool.map(one, prompts))
    for answer in answers:
        assert answer["type"] == "message" and answer["stop_reason"] in ("end_turn", "max_tokens"), answer
        assert answer["content"][0]["text"].strip()
    engine.wait_idle()  # a generation's tokens are counted once its worker thread is done
    assert engine.generated_tokens() - before == sum(a["usage"]["output_tokens"] for a in answers)


def test_a_client_that_goes_away_ends_the_generation(real_gateway: Spawned, engine: Engine) -> None:
    engine.wait_idle()
    before = engine.generated_tokens()
    request = ask("Write a very long story about a lighthouse keeper.", max_tokens=4000, stream=True)
    with httpx.Client(base_url=real_gateway.url, timeout=60.0) as client:
        with client.stream("POST", "/v1/messages", json=request) as response:
            deltas = 0
            for line in response.iter_lines():
                if line.startswith("data: ") and '"content_block_delta"' in line:
                    deltas += 1
                    if deltas == 5:
                        break
    engine.wait_idle()
    generated = engine.generated_tokens() - before
    assert 5 <= generated < 1000, generated


def test_offline_replay_of_real_traffic_is_byte_identical(http: httpx.Client, real_journal: Path) -> None:
    ids = []
    for request in (
        ask(),
        ask(stream=True),
        ask("Count to five.", stop_sequences=["3"], stream=True),
        ask("What is the weather like in Paris?", tools=[WEATHER], tool_choice={"type": "any"}, max_tokens=40),
    ):
        response = http.post("/v1/messages", json=request)
        assert response.status_code == 200, response.text
        ids.append(response.headers["x-request-id"])
    for request_id in ids:
        wait_for_events(real_journal, request_id)
    runner = CliRunner(env={"COLUMNS": "200"})
    for request_id in ids:
        result = runner.invoke(app, ["replay", request_id, "--offline", "--journal", str(real_journal)])
        assert result.exit_code == 0, result.output
