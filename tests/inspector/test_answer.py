"""The assembled answer and the waterfall, over journals a live gateway wrote: in `smg journal
show` (text and JSON) and in the inspector's tabs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from textual.widgets import TabbedContent
from typer.testing import CliRunner

from journal.events import event_from_dict, event_kinds
from journal.reader import JournalReader
from journal.waterfall import stages
from replay.answer import assemble
from replay.diff import from_events, parse_sse
from replay.inspector import InspectorApp
from smg.cli.main import app as cli
from tests.inspector.conftest import QWEN3, _wait_completed
from tests.inspector.test_app import open_request, settle, static_text
from tools.engine_control import EngineControl
from tools.spawn import spawn_engine, spawn_gateway

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def tool_stream(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A journal holding one streamed answer of thinking, text and a tool call, through a live
    gRPC gateway in front of the scripted engine; yields (path, request id, the SSE body)."""
    path = tmp_path_factory.mktemp("answer") / "smg-journal.db"
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", "qwen3-fixture"])
    gateway = None
    try:
        gateway = spawn_gateway([engine.url], journal=path, extra=["--model-path", str(QWEN3)])
        control = EngineControl(engine.url)
        control.script({"text": "<think>plan the call</think>\n\nChecking." + CALL})
        control.close()
        body = {
            "model": "qwen3-fixture",
            "max_tokens": 2048,
            "stream": True,
            "messages": [{"role": "user", "content": "Weather in Paris?"}],
            "tools": [WEATHER],
            "thinking": {"type": "enabled", "budget_tokens": 1024},
        }
        with httpx.Client(timeout=30.0) as http:
            answer = http.post(f"{gateway.url}/v1/messages", json=body)
        assert answer.status_code == 200, answer.text
        _wait_completed(path, 1)
        yield path, answer.headers["x-request-id"], answer.text
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()


def _load(path: Path, request_id: str) -> tuple[list[Any], list[Any]]:
    with JournalReader(path) as reader:
        raw = reader.raw_events(request_id)
    known = set(event_kinds())
    return raw, [event_from_dict(kind, data, t) for _, kind, t, data in raw if kind in known]


def test_the_answer_of_a_stream_is_what_the_client_folded(real_journal: dict[str, Any]) -> None:
    _, events = _load(real_journal["path"], real_journal["grpc"])
    answer = assemble(events)
    seen = from_events(parse_sse(real_journal["grpc_body"])).message  # the client's own SSE, folded
    assert seen is not None
    assert answer["status"] == 200 and answer["streamed"]
    assert answer["content"] == seen["content"] and answer["content"][0]["type"] == "text"
    assert "Hello there, friend." in answer["content"][0]["text"]
    assert answer["stop_reason"] == seen["stop_reason"] and answer["usage"] == seen["usage"]
    assert answer["error"] is None


def test_the_answer_joins_thinking_text_and_tool_input_from_their_deltas(tool_stream: Any) -> None:
    path, request_id, sse = tool_stream
    raw, events = _load(path, request_id)
    answer = assemble(events)
    assert [b["type"] for b in answer["content"]] == ["thinking", "text", "tool_use"]
    thinking, said, tool = answer["content"]
    assert thinking["thinking"] == "plan the call" and said["text"] == "Checking."
    assert tool["name"] == "get_weather" and tool["input"] == {"city": "Paris"}
    # The input came in pieces: it is assembled, not copied from one event.
    assert sum('"input_json_delta"' in line for line in sse.splitlines()) >= 1
    assert answer["stop_reason"] == "tool_use" and answer["usage"]["output_tokens"] > 0
    blocks = [s for s in stages(raw) if s.depth == 2]
    assert [s.detail for s in blocks] == ["thinking", "text", "tool_use get_weather"]
    shown = CliRunner().invoke(cli, ["journal", "show", request_id, "--journal", str(path)], env={"COLUMNS": "160"})
    assert shown.exit_code == 0, shown.output
    assert "[2] tool_use get_weather" in shown.output and '"city": "Paris"' in shown.output


def test_the_answer_of_a_refusal_is_its_error(real_journal: dict[str, Any]) -> None:
    _, events = _load(real_journal["path"], real_journal["rejected"])
    answer = assemble(events)
    assert answer["status"] == 400 and answer["content"] == []
    assert answer["error"]["type"] == "invalid_request_error" and "max_tokens" in answer["error"]["message"]


def test_the_waterfall_of_a_grpc_stream_has_each_stage_in_order(real_journal: dict[str, Any]) -> None:
    raw, _ = _load(real_journal["path"], real_journal["grpc"])
    found = stages(raw)
    names = [s.name for s in found]
    for name in ("request", "validate", "route (attempt 1)", "attempt 1", "render + tokenize",
                 "engine: to first token", "first token", "engine: generation", "block 0", "completion"):  # fmt: skip
        assert name in names, names
    by = {s.name: s for s in found}
    total = by["request"]
    assert all(0 <= s.start_ms <= s.end_ms <= total.end_ms + 1e-6 for s in found)
    assert by["validate"].end_ms <= by["attempt 1"].start_ms <= by["render + tokenize"].end_ms
    assert by["render + tokenize"].end_ms <= by["first token"].start_ms <= by["block 0"].end_ms
    assert by["block 0"].detail == "text" and by["completion"].detail.startswith("200")


def test_the_waterfall_of_a_relay_shows_the_upstream(real_journal: dict[str, Any]) -> None:
    raw, _ = _load(real_journal["path"], real_journal["relay"])
    names = [s.name for s in stages(raw)]
    assert "upstream: to head" in names and "attempt 1" in names and "render + tokenize" not in names


def test_show_prints_the_answer_and_the_waterfall(real_journal: dict[str, Any]) -> None:
    args = ["journal", "show", real_journal["grpc"], "--journal", str(real_journal["path"])]
    shown = CliRunner().invoke(cli, args, env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert "answer (as the client assembled it)" in shown.output and "[0] text" in shown.output
    assert "waterfall" in shown.output and "engine: to first token" in shown.output and "█" in shown.output
    as_json = CliRunner().invoke(cli, [*args, "--json"])
    assert as_json.exit_code == 0, as_json.output
    document = json.loads(as_json.output)
    assert "Hello there, friend." in document["answer"]["content"][0]["text"]
    assert {"name", "start_ms", "duration_ms", "detail", "depth"} <= set(document["waterfall"][0])
    assert "first token" in [s["name"] for s in document["waterfall"]]


async def test_the_inspector_shows_the_answer_and_waterfall_tabs(real_journal: dict[str, Any]) -> None:
    app = InspectorApp(real_journal["path"], refresh_s=0)
    async with app.run_test(size=(140, 36)) as pilot:
        screen = await open_request(app, pilot, real_journal["grpc"])
        await settle(app, pilot)
        assert "Hello there, friend." in static_text(app, "#answer-view")
        tabs = screen.query_one(TabbedContent)
        tabs.active = "waterfall"
        await pilot.pause()
        shown = static_text(app, "#waterfall-view")
        assert "engine: to first token" in shown and "block 0" in shown and "completion" in shown
