"""Every tool-call parser through the live gateway, chosen by model id and by flag.

One gateway fronts one scripted engine per model id; each id is one the spec's detection
table maps to a parser, so the gateway picks the parser from the id alone. For each, the
model's native call format must come back as the same `tool_use` block streamed and not, and
the SSE stream must fold (with the anthropic SDK's stream helper) into the non-streamed message.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import anthropic
import pytest

from smg.pipeline.parsers.tools import detect_tool_parser
from tests.grpc.conftest import QWEN3, target_of
from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway, spawn_together

WEATHER = {
    "name": "get_weather",
    "description": "Weather for a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
USER = [{"role": "user", "content": "Weather in Paris?"}]
NO_THINKING = {"type": "disabled"}  # the fixture template thinks by default; these models' parsers would see it

# model id → (the parser the detection table gives, the model's output for one call)
FORMATS: dict[str, tuple[str, str]] = {
    "gemma-fixture": ("json", '{"name": "get_weather", "arguments": {"city": "Paris"}}'),
    "qwen2.5-fixture": ("qwen", '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    "Qwen3-Coder-fixture": (
        "qwen_xml",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
    ),
    "llama-3.2-fixture": ("llama", '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    "llama-4-fixture": ("pythonic", '[get_weather(city="Paris")]'),
    "mistral-fixture": ("mistral", '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris"}}]'),
    "deepseek-v3-fixture": (
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
    ),
    "deepseek-v3.1-fixture": (
        "deepseek31",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    ),
    "glm-4.5-fixture": (
        "glm45_moe",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    ),
    "glm-4.7-fixture": (
        "glm47_moe",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Paris</arg_value></tool_call>",
    ),
    "kimi-k2-fixture": (
        "kimik2",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    "minimax-m2-fixture": (
        "minimax_m2",
        '<minimax:tool_call><invoke name="get_weather"><parameter name="city">Paris</parameter></invoke>'
        "</minimax:tool_call>",
    ),
    "deepseek-v3.2-fixture": (
        "deepseek32",
        '<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n'
        "</｜DSML｜function_calls>",
    ),
    "deepseek-v4-fixture": (
        "deepseek_v4",
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n{"city": "Paris"}\n</｜DSML｜invoke>\n'
        "</｜DSML｜tool_calls>",
    ),
    "kimi-k3-fixture": (
        "kimi_k3",
        '<|close|>response<|sep|><|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|><|close|>call<|sep|>'
        "<|close|>tools<|sep|>",
    ),
    "sarashina-fixture": ("sarashina", "<|tool_calls|>[{'name': 'get_weather', 'arguments': {'city': 'Paris'}}]"),
    "step3-fixture": (
        "step3",
        '<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="get_weather">'
        '<steptml:parameter name="city">Paris</steptml:parameter></steptml:invoke><｜tool_call_end｜>'
        "<｜tool_calls_end｜>",
    ),
    # Inkling's reasoning parser (special tokens: it runs with thinking off too) drops the header
    # and hands the invocation to the tool parser.
    "inkling-fixture": (
        "inkling",
        '<|message_model|>get_weather<|content_invoke_tool_json|>{"name": "get_weather", "args": {"city": "Paris"}}'
        "<|end_message|><|content_model_end_sampling|>",
    ),
    "command-a-fixture": (
        "cohere",
        '<|START_ACTION|>[\n    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris"}}\n]'
        "<|END_ACTION|>",
    ),
}


def _engine(model: str) -> Spawned:
    return spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", model])


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Spawned, dict[str, EngineControl]]]:
    engines: dict[str, Spawned] = {}
    controls: dict[str, EngineControl] = {}
    gateway: Spawned | None = None
    try:
        models = [*FORMATS, "plain-fixture"]
        engines.update(zip(models, spawn_together([partial(_engine, model) for model in models])))
        for model, engine in engines.items():
            controls[model] = EngineControl(target_of(engine.url))
        journal = tmp_path_factory.mktemp("parsers") / "j.db"
        gateway = spawn_gateway(
            [e.url for e in engines.values()], journal=journal, extra=["--model-path", str(QWEN3)], timeout=60
        )
        yield gateway, controls
    finally:
        for control in controls.values():
            control.close()
        if gateway is not None:
            gateway.stop()
        for engine in engines.values():
            engine.stop()


def _content(message: Any) -> list[dict[str, Any]]:
    return [b.model_dump(exclude_none=True) for b in message.content]


@pytest.mark.parametrize("model", list(FORMATS))
def test_parser_chosen_by_model_id_streamed_and_not(
    fleet: tuple[Spawned, dict[str, EngineControl]], model: str
) -> None:
    gateway, controls = fleet
    parser, output = FORMATS[model]
    assert detect_tool_parser(model) == parser
    control = controls[model]
    control.reset()
    control.script(
        {"text": "Let me look. " + output, "chunk_size": 1}, {"text": "Let me look. " + output, "chunk_size": 1}
    )
    sdk = anthropic.Anthropic(api_key="unused", base_url=gateway.url, max_retries=0)
    kwargs: dict[str, Any] = {"model": model, "max_tokens": 256, "messages": USER, "tools": [WEATHER]}
    plain = sdk.messages.create(**kwargs, thinking=NO_THINKING)
    with sdk.messages.stream(**kwargs, thinking=NO_THINKING) as stream:
        final = stream.get_final_message()
    for message in (plain, final):
        assert message.stop_reason == "tool_use", (parser, _content(message))
        assert [b.type for b in message.content] == ["text", "tool_use"]
        assert message.content[0].text.strip() == "Let me look."
        call = message.content[1]
        assert call.name == "get_weather" and call.input == {"city": "Paris"}
        expected_id = "functions.get_weather:0" if parser == "kimik2" else None
        assert call.id == expected_id if expected_id else call.id.startswith("toolu_")
    # Same blocks; the tool ids differ only because they are two messages.
    strip = [{k: v for k, v in b.items() if k != "id"} for b in _content(plain)]
    assert strip == [{k: v for k, v in b.items() if k != "id"} for b in _content(final)]


def test_passthrough_model_leaves_calls_as_text(fleet: tuple[Spawned, dict[str, EngineControl]]) -> None:
    gateway, controls = fleet
    assert detect_tool_parser("plain-fixture") == "passthrough"
    control = controls["plain-fixture"]
    control.reset()
    output = FORMATS["qwen2.5-fixture"][1]
    control.script({"text": output})
    sdk = anthropic.Anthropic(api_key="unused", base_url=gateway.url, max_retries=0)
    message = sdk.messages.create(
        model="plain-fixture", max_tokens=256, messages=USER, tools=[WEATHER], thinking=NO_THINKING
    )
    assert [b.type for b in message.content] == ["text"] and message.content[0].text == output
    assert message.stop_reason == "end_turn"


def test_parser_chosen_by_flag_overrides_detection(engine: Spawned, tmp_path: Path) -> None:
    """`qwen3-fixture` would be parsed as `qwen`; `--tool-call-parser pythonic` wins."""
    gateway = spawn_gateway(
        [engine.url], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3), "--tool-call-parser", "pythonic"]
    )
    control = EngineControl(target_of(engine.url))
    try:
        control.reset()
        control.script({"text": '[get_weather(city="Oslo")]'})
        sdk = anthropic.Anthropic(api_key="unused", base_url=gateway.url, max_retries=0)
        message = sdk.messages.create(
            model="qwen3-fixture", max_tokens=64, messages=USER, tools=[WEATHER], thinking=NO_THINKING
        )
        assert [(b.type, b.input) for b in message.content if b.type == "tool_use"] == [("tool_use", {"city": "Oslo"})]
    finally:
        control.close()
        gateway.stop()


@pytest.mark.parametrize("thinking", [NO_THINKING, {"type": "enabled", "budget_tokens": 1024}])
def test_inkling_typed_blocks_become_thinking_text_and_a_call(
    fleet: tuple[Spawned, dict[str, EngineControl]], thinking: dict[str, Any]
) -> None:
    # The model id picks both Inkling parsers; its blocks are special tokens, so the reasoning
    # parser reads them whatever `thinking` says.
    gateway, controls = fleet
    control = controls["inkling-fixture"]
    control.reset()
    output = (
        "<|message_model|><|content_thinking|>Paris, then.<|end_message|>"
        "<|message_model|><|content_text|>Let me look.<|end_message|>" + FORMATS["inkling-fixture"][1]
    )
    control.script({"text": output, "chunk_size": 1}, {"text": output, "chunk_size": 1})
    sdk = anthropic.Anthropic(api_key="unused", base_url=gateway.url, max_retries=0)
    kwargs: dict[str, Any] = {"model": "inkling-fixture", "max_tokens": 2048, "messages": USER, "tools": [WEATHER]}
    plain = sdk.messages.create(**kwargs, thinking=thinking)
    with sdk.messages.stream(**kwargs, thinking=thinking) as stream:
        final = stream.get_final_message()
    for message in (plain, final):
        blocks = _content(message)
        assert [b["type"] for b in blocks] == ["thinking", "text", "tool_use"], blocks
        assert blocks[0]["thinking"] == "Paris, then." and blocks[1]["text"] == "Let me look."
        assert blocks[2]["name"] == "get_weather" and blocks[2]["input"] == {"city": "Paris"}
        assert message.stop_reason == "tool_use"
