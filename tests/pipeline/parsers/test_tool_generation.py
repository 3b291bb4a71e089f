"""Tool parsers inside a whole generation: the fixture tokenizers' ids, one at a time, through
`Generation` (detokenized with special tokens kept, as when tools are in play) to Anthropic
events (behaviors.md §C.2, §D.2, §F.3)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from smg.pipeline.generation import Generation, GenerationSettings
from smg.pipeline.parsers.tools import make_tool_parser
from smg.protocol.fold import BlockFold
from tests.pipeline import _toy

Event = dict[str, Any]

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}


def generate(fixture: str, parser: str, output: str, stream: bool = True) -> list[Event]:
    tokenizer = _toy.fixture(fixture)
    ids = tokenizer.encode(output)
    assert tokenizer.decode(ids, skip_special_tokens=False) == output
    settings = GenerationSettings(
        message_id="msg_t",
        model="m",
        stream=stream,
        eos_token_ids=tokenizer.eos_token_ids,
        skip_special_tokens=False,
    )
    gen = Generation(tokenizer, settings, stages=[make_tool_parser(parser, [WEATHER])])
    events = gen.start()
    for token in ids + tokenizer.eos_token_ids[:1]:
        events += gen.feed([token])
    return events + gen.finish("stop", 10, len(ids))


def content(events: list[Event]) -> list[dict[str, Any]]:
    folder = BlockFold()
    for event in events:
        folder.feed(event)
    return folder.content()


CASES = [
    (
        "qwen3",
        "qwen",
        'Checking.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n'
        "</tool_call>",
        "Checking.\n",
    ),
    (
        "llama3",
        "llama",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        None,
    ),
    ("llama3", "json", '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}', None),
    (
        "deepseek",
        "deepseek31",
        "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
        '{"city": "Paris", "unit": "celsius"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        "Let me check.",
    ),
    (
        "deepseek",
        "deepseek",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris", "unit": "celsius"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>',
        None,
    ),
    (
        "mistral",
        "mistral",
        '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        None,
    ),
    (
        "mistral",
        "mistral",
        'Sure. [TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]',
        "Sure. ",
    ),
    (
        "deepseek",
        "deepseek32",
        'Let me check.\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="unit" string="true">celsius</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜function_calls>",
        "Let me check.\n\n",
    ),
    (
        "deepseek",
        "deepseek_v4",
        '<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n'
        '<｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>\n'
        '<｜DSML｜parameter name="unit" string="true">celsius</｜DSML｜parameter>\n'
        "</｜DSML｜invoke>\n</｜DSML｜tool_calls>",
        None,
    ),
    (
        "qwen3",
        "kimi_k3",
        "Let me check.<|close|>response<|sep|><|open|>tools<|sep|>"
        '<|open|>call tool="get_weather" index="1"<|sep|>'
        '<|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>'
        '<|open|>argument key="unit" type="string"<|sep|>celsius<|close|>argument<|sep|>'
        "<|close|>call<|sep|><|close|>tools<|sep|>",
        "Let me check.",
    ),
    (
        "qwen3",
        "cohere",
        "<|START_RESPONSE|>Checking.<|END_RESPONSE|><|START_ACTION|>[\n"
        '    {"tool_call_id": "0", "tool_name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}\n'
        "]<|END_ACTION|>",
        "Checking.",
    ),
]


@pytest.mark.parametrize(("fixture", "parser", "output", "text"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES])
def test_a_tool_call_through_the_generation(fixture: str, parser: str, output: str, text: str | None) -> None:
    events = generate(fixture, parser, output)
    blocks = content(events)
    tool = blocks[-1]
    assert tool["type"] == "tool_use"
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", tool["id"])
    assert tool["name"] == "get_weather"
    assert tool["input"] == {"city": "Paris", "unit": "celsius"}
    assert blocks[:-1] == ([{"type": "text", "text": text}] if text else [])

    # The stream: the tool_use block opens with empty input, then input_json_delta fragments
    # whose concatenation is the arguments.
    index = len(blocks) - 1
    start = next(e for e in events if e["type"] == "content_block_start" and e["index"] == index)
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == index]
    assert all(d["type"] == "input_json_delta" for d in deltas)
    assert len(deltas) > 1  # streamed, not sent whole
    assert json.loads("".join(d["partial_json"] for d in deltas)) == {"city": "Paris", "unit": "celsius"}
    assert events[-2]["delta"] == {"stop_reason": "tool_use"}

    # The same content without streaming.
    assert content(generate(fixture, parser, output, stream=False))[:-1] == blocks[:-1]


@pytest.mark.parametrize(
    ("fixture", "parser", "marker"),
    [
        ("qwen3", "qwen", "<tool"),
        ("llama3", "llama", "<|python"),
        ("deepseek", "deepseek31", "<｜tool▁"),
        ("mistral", "mistral", "[TOOL"),
        ("deepseek", "deepseek32", "<｜DSML｜func"),
        ("deepseek", "deepseek_v4", "<｜DS"),
        ("qwen3", "kimi_k3", "<|open|>to"),
        ("qwen3", "cohere", "<|START_AC"),
    ],
)
def test_text_that_only_looks_like_a_call_start_is_kept(fixture: str, parser: str, marker: str) -> None:
    output = f"The answer is 42. {marker}"
    events = generate(fixture, parser, output)
    assert content(events) == [{"type": "text", "text": output}]
    assert events[-2]["delta"] == {"stop_reason": "end_turn"}
