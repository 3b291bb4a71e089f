"""Tool calls, thinking and forced tool choice on the gRPC path, end to end.

The model here is `qwen3-fixture`: its tool calls are Hermes-style `<tool_call>` JSON and its
reasoning `<think>…</think>` (both detected from the model id). The scripted engine writes
the model's text; the gateway must turn it into `thinking`, `text` and `tool_use` blocks, the
same streamed and not.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import pytest

from tests.grpc.conftest import MODEL
from tests.grpc.test_messages import sse_events
from tools.engine_control import EngineControl
from tools.spawn import Spawned

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
TIME = {
    "name": "get_time",
    "description": "Local time",
    "input_schema": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}
USER = [{"role": "user", "content": "Weather in Paris?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture
def sdk(grpc_gateway: Spawned) -> anthropic.Anthropic:
    return anthropic.Anthropic(api_key="sk-ant-client", base_url=grpc_gateway.url, max_retries=0)


def both(
    sdk: anthropic.Anthropic, control: EngineControl, output: str, max_tokens: int = 256, **kwargs: Any
) -> tuple[Any, Any, list[str]]:
    """The same engine output answered without and with streaming: (plain, streamed final, event kinds)."""
    control.script({"text": output}, {"text": output})
    plain = sdk.messages.create(model=MODEL, max_tokens=max_tokens, **kwargs)
    with sdk.messages.stream(model=MODEL, max_tokens=max_tokens, **kwargs) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    return plain, final, kinds


def blocks(message: Any) -> list[dict[str, Any]]:
    """The content blocks, without tool ids (they differ between two messages by design)."""
    return [{k: v for k, v in b.model_dump(exclude_none=True).items() if k != "id"} for b in message.content]


def test_tool_call_is_a_tool_use_block_streamed_and_not(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    plain, final, _ = both(sdk, control, "Let me check." + CALL, messages=USER, tools=[WEATHER])
    assert blocks(plain) == blocks(final)
    text, tool = plain.content
    assert text.type == "text" and text.text == "Let me check."
    assert tool.type == "tool_use" and tool.name == "get_weather" and tool.input == {"city": "Paris"}
    assert tool.id.startswith("toolu_") and len(tool.id) == len("toolu_") + 24
    assert plain.model_dump()["content"][1]["caller"] == {"type": "direct"}
    assert plain.stop_reason == final.stop_reason == "tool_use"


def test_tool_ids_are_the_same_streamed_and_not_within_a_message(http: httpx.Client, control: EngineControl) -> None:
    output = CALL + "\n" + CALL.replace("get_weather", "get_time").replace('"city": "Paris"', '"zone": "CET"')
    control.script({"text": output})
    body = {"model": MODEL, "max_tokens": 256, "messages": USER, "tools": [WEATHER, TIME], "stream": True}
    events = sse_events(http.post("/v1/messages", json=body).text)
    starts = [e["content_block"] for k, e in events if k == "content_block_start"]
    assert [b["name"] for b in starts] == ["get_weather", "get_time"]
    assert all(b["id"].startswith("toolu_") for b in starts) and starts[0]["id"] != starts[1]["id"]
    assert all(b["caller"] == {"type": "direct"} for b in starts)
    partial: dict[int, str] = {}
    for kind, e in events:
        if kind == "content_block_delta" and e["delta"]["type"] == "input_json_delta":
            partial[e["index"]] = partial.get(e["index"], "") + e["delta"]["partial_json"]
    assert [json.loads(v) for _, v in sorted(partial.items())] == [{"city": "Paris"}, {"zone": "CET"}]
    assert next(e for k, e in events if k == "message_delta")["delta"]["stop_reason"] == "tool_use"


def test_thinking_then_text_then_tool(sdk: anthropic.Anthropic, control: EngineControl, http: httpx.Client) -> None:
    output = "<think>plan the call</think>\n\nChecking." + CALL
    thinking = {"type": "enabled", "budget_tokens": 1024}
    plain, final, _ = both(sdk, control, output, messages=USER, tools=[WEATHER], thinking=thinking, max_tokens=2048)
    assert blocks(plain) == blocks(final)
    assert [b.type for b in plain.content] == ["thinking", "text", "tool_use"]
    assert plain.content[0].thinking == "plan the call" and plain.content[0].signature == ""
    assert plain.content[1].text == "Checking."
    # No reasoning marker ever reaches a delta.
    control.script({"text": output})
    body = {
        "model": MODEL,
        "max_tokens": 2048,
        "messages": USER,
        "tools": [WEATHER],
        "thinking": thinking,
        "stream": True,
    }
    raw = http.post("/v1/messages", json=body).text
    assert "<think>" not in raw and "</think>" not in raw


def test_thinking_display_omitted_keeps_the_block_without_its_text(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "<think>secret plan</think>\n\nDone."})
    thinking = {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}
    body = {"model": MODEL, "max_tokens": 2048, "messages": USER, "thinking": thinking}
    payload = http.post("/v1/messages", json=body).json()
    assert payload["content"] == [
        {"type": "thinking", "thinking": "", "signature": ""},
        {"type": "text", "text": "Done."},
    ]


def test_thinking_disabled_turns_the_template_toggle_off(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": "Plain answer."})
    body = {"model": MODEL, "max_tokens": 64, "messages": USER, "thinking": {"type": "disabled"}}
    payload = http.post("/v1/messages", json=body).json()
    assert payload["content"] == [{"type": "text", "text": "Plain answer."}]
    ids = control.received()[-1]["tokenized"]["input_ids"]
    from smg.pipeline.tokenizers.tokenizer import Tokenizer
    from tests.grpc.conftest import QWEN3

    prompt = Tokenizer.load(QWEN3).decode([int(i) for i in ids], skip_special_tokens=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_malformed_call_degrades_to_text(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    output = "Trying: <tool_call>\n{broken json</tool_call> oops"
    plain, final, _ = both(sdk, control, output, messages=USER, tools=[WEATHER])
    assert blocks(plain) == blocks(final)
    assert [b.type for b in plain.content] == ["text"]
    assert plain.content[0].text == output  # nothing lost, markers included
    assert plain.stop_reason == "end_turn"


def test_call_cut_off_mid_arguments_keeps_what_arrived(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    # Once a call has opened in a stream it cannot be taken back: it closes with the arguments so far.
    output = 'Checking. <tool_call>\n{"name": "get_weather", "arguments": {"city": "Par'
    plain, final, _ = both(sdk, control, output, messages=USER, tools=[WEATHER])
    assert blocks(plain) == blocks(final)
    assert [(b.type, getattr(b, "name", None)) for b in plain.content] == [("text", None), ("tool_use", "get_weather")]
    assert plain.content[1].input == {"city": "Par"}
    assert plain.stop_reason == "tool_use"


def test_unclosed_call_is_not_lost(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    output = 'Hmm <tool_call>\n{"name": "get_weather"'
    plain, final, _ = both(sdk, control, output, messages=USER, tools=[WEATHER])
    assert blocks(plain) == blocks(final)
    assert "".join(b.text for b in plain.content if b.type == "text").startswith("Hmm")


def test_tool_choice_none_renders_no_tools_and_parses_no_calls(http: httpx.Client, control: EngineControl) -> None:
    control.script({"text": CALL})
    body = {"model": MODEL, "max_tokens": 256, "messages": USER, "tools": [WEATHER], "tool_choice": {"type": "none"}}
    payload = http.post("/v1/messages", json=body).json()
    assert [b["type"] for b in payload["content"]] == ["text"]
    assert payload["stop_reason"] == "end_turn"
    sent = control.received()[-1]
    assert "constraint" not in json.dumps(sent["sampling_params"])


def test_tool_choice_any_sends_the_array_schema(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    output = '[{"name": "get_time", "parameters": {"zone": "CET"}}]'
    plain, final, _ = both(sdk, control, output, messages=USER, tools=[WEATHER, TIME], tool_choice={"type": "any"})
    schema = json.loads(control.received()[-1]["sampling_params"]["json_schema"])
    assert schema["type"] == "array" and schema["minItems"] == 1
    names = [v["properties"]["name"]["enum"] for v in schema["items"]["anyOf"]]
    assert names == [["get_weather"], ["get_time"]]
    assert blocks(plain) == blocks(final)
    assert [(b.type, b.name, b.input) for b in plain.content] == [("tool_use", "get_time", {"zone": "CET"})]
    assert plain.stop_reason == "tool_use"


def test_tool_choice_tool_sends_its_schema_and_the_output_is_its_input(
    sdk: anthropic.Anthropic, control: EngineControl
) -> None:
    plain, final, _ = both(
        sdk,
        control,
        '{"city": "Lyon"}',
        messages=USER,
        tools=[WEATHER, TIME],
        tool_choice={"type": "tool", "name": "get_weather"},
    )
    sent = control.received()[-1]["sampling_params"]
    assert json.loads(sent["json_schema"]) == WEATHER["input_schema"]
    assert blocks(plain) == blocks(final)
    assert [(b.type, b.name, b.input) for b in plain.content] == [("tool_use", "get_weather", {"city": "Lyon"})]
    assert plain.stop_reason == final.stop_reason == "tool_use"


def test_tool_round_trip_renders_the_result(sdk: anthropic.Anthropic, control: EngineControl) -> None:
    control.script({"text": CALL})
    first = sdk.messages.create(model=MODEL, max_tokens=256, messages=USER, tools=[WEATHER])
    call = first.content[0]
    control.script({"text": "It is sunny in Paris."})
    answer = sdk.messages.create(
        model=MODEL,
        max_tokens=256,
        tools=[WEATHER],
        messages=[
            *USER,
            {"role": "assistant", "content": first.content},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "21C, sunny"}]},
        ],
    )
    assert answer.stop_reason == "end_turn" and answer.content[0].text == "It is sunny in Paris."
