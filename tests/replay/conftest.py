"""Real traffic for replay: a scripted SGLang engine and a gateway in front of it, as processes.

The gateway requires an API key, so a replay must be given one (the journal keeps only its
fingerprint). Every scenario is scripted as a repeating rule keyed on a marker in its prompt, so
the original request and any replay of it get the same engine output. `traffic` sends each
scenario streamed and not and returns the request ids by name, once their events are committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.reader import JournalReader
from tests.conftest import wait_for_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN3 = FIXTURES / "qwen3"
LLAMA3 = FIXTURES / "llama3"
MODEL = "qwen3-fixture"
API_KEY = "sk-gateway-replay-test"

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
THINKING = {"type": "enabled", "budget_tokens": 1024}


@dataclass(frozen=True)
class Scenario:
    name: str
    output: str
    request: dict[str, Any]
    chunk_size: int = 1


SCENARIOS = [
    Scenario("text", "Hello there, friend. Nice to meet you!", {"max_tokens": 256}),
    Scenario("sampled", "A sampled answer.", {"max_tokens": 256, "temperature": 1.0}),
    # One token: the engine stops on it and names it; the gateway maps it back to the string.
    Scenario("stop-token", "one two three four", {"max_tokens": 256, "stop_sequences": [" three"]}),
    # Several tokens: the gateway matches it in the text and ends the message itself.
    Scenario("stop-text", "Count: 1, 2, STOP, 3, 4", {"max_tokens": 256, "stop_sequences": ["STOP"]}, chunk_size=2),
    Scenario("length", "This answer is longer than its budget allows", {"max_tokens": 5}),
    Scenario("tool", "Let me check." + CALL, {"max_tokens": 256, "tools": [WEATHER]}, chunk_size=3),
    Scenario("thinking", "<think>plan</think>\n\nAnswer.", {"max_tokens": 2048, "thinking": THINKING}),
    Scenario(
        "thinking-tool",
        "<think>I need the weather.</think>\n\n" + CALL,
        {"max_tokens": 2048, "thinking": THINKING, "tools": [WEATHER]},
        chunk_size=2,
    ),
]


def body_of(scenario: Scenario, stream: bool) -> dict[str, Any]:
    prompt = f"[{scenario.name}] please answer"
    return {
        "model": MODEL,
        "temperature": 0,
        **scenario.request,
        "messages": [{"role": "user", "content": prompt}],
        "stream": stream,
    }


@pytest.fixture(scope="session")
def replay_engine() -> Iterator[Spawned]:
    proc = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", MODEL])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def replay_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("replay-journal") / "smg-journal.db"


@pytest.fixture(scope="session")
def gateway(replay_engine: Spawned, replay_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway(
        [replay_engine.url],
        journal=replay_journal,
        extra=["--model-path", str(QWEN3), "--api-key", API_KEY],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def traffic(replay_engine: Spawned, gateway: Spawned, replay_journal: Path) -> dict[str, str]:
    """Request ids by name: `<scenario>-plain` and `<scenario>-stream`, plus `zero` (max_tokens 0),
    `count` (count_tokens) and `rejected` (a body the gateway refuses)."""
    with EngineControl(replay_engine.url) as control:
        control.reset()
        control.script(
            *(
                {
                    "text": s.output,
                    "chunk_size": s.chunk_size,
                    "when_prompt_contains": f"[{s.name}]",
                    "repeat": True,
                }
                for s in SCENARIOS
            )
        )
    ids: dict[str, str] = {}
    auth = {"authorization": f"Bearer {API_KEY}", "anthropic-version": "2023-06-01"}
    with httpx.Client(base_url=gateway.url, timeout=30.0, headers=auth) as client:
        for scenario in SCENARIOS:
            for stream in (False, True):
                name = f"{scenario.name}-{'stream' if stream else 'plain'}"
                rid = f"rp-{name}"
                response = client.post("/v1/messages", json=body_of(scenario, stream), headers={"x-request-id": rid})
                assert response.status_code == 200, response.text
                ids[name] = rid
        zero = {"model": MODEL, "max_tokens": 0, "messages": [{"role": "user", "content": "[zero] hi"}]}
        assert client.post("/v1/messages", json=zero, headers={"x-request-id": "rp-zero"}).status_code == 200
        ids["zero"] = "rp-zero"
        count = {"model": MODEL, "messages": [{"role": "user", "content": "[count] hi"}]}
        response = client.post("/v1/messages/count_tokens", json=count, headers={"x-request-id": "rp-count"})
        assert response.status_code == 200
        ids["count"] = "rp-count"
        response = client.post("/v1/messages", json={"model": MODEL}, headers={"x-request-id": "rp-rejected"})
        assert response.status_code == 400
        ids["rejected"] = "rp-rejected"
    for rid in ids.values():
        wait_for_events(replay_journal, rid)
    with JournalReader(replay_journal) as reader:  # the gateway's ids: what `replay_of` names
        return {name: str(reader.get_request(rid)["id"]) for name, rid in ids.items()}  # type: ignore[index]
