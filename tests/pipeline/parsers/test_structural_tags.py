"""Structural tags in a model's own call format (behaviors.md §F.3, §F.7): Kimi-K3's, and that
what its grammar admits is read back as the calls it describes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smg.pipeline.constraints import tool_constraint
from smg.pipeline.generation import Piece, Text, Thinking
from smg.pipeline.parsers.reasoning import make_reasoning_parser
from smg.pipeline.parsers.tools import make_tool_parser
from smg.pipeline.parsers.tools.kimik3 import RESPONSE_CLOSE, THINK_CLOSE, TOOLS_CLOSE, TOOLS_OPEN, structural_tag
from tests.pipeline.parsers.test_tool_parsers import result, run
from tests.pipeline.test_output import USER, _plan

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "units": {"type": "string", "enum": ["c", "f"]},
                "where": {"type": "object"},
                "any": {"anyOf": [{"type": "string"}, {"type": "integer"}]},
            },
            "required": ["city", "days"],
        },
    },
}
PING = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}


def test_the_tag_frames_the_tools_channel_after_any_open_channel() -> None:
    fmt = structural_tag([WEATHER], True)["format"]
    assert fmt["type"] == "triggered_tags" and fmt["at_least_one"] is True
    assert "stop_after_first" not in fmt  # what follows the channel stays free
    assert fmt["triggers"] == [TOOLS_OPEN, THINK_CLOSE, RESPONSE_CLOSE]
    assert [tag["begin"] for tag in fmt["tags"]] == [TOOLS_OPEN, THINK_CLOSE + TOOLS_OPEN, RESPONSE_CLOSE + TOOLS_OPEN]
    for tag in fmt["tags"]:
        assert tag["end"] == TOOLS_CLOSE and tag["content"]["type"] == "plus"  # one or more calls


def test_arguments_follow_the_schema_in_its_order() -> None:
    call = structural_tag([WEATHER], True)["format"]["tags"][0]["content"]["content"]["elements"][0]
    head, index, sep, args, end = call["elements"]
    assert head["value"] == '<|open|>call tool="get_weather" index="' and index["type"] == "regex"
    assert sep["value"] == '"<|sep|>' and end["value"] == "<|close|>call<|sep|>"
    city, days, units, where, other = args["elements"]
    assert city["elements"][0]["value"] == '<|open|>argument key="city" type="string"<|sep|>'
    assert city["elements"][1]["type"] == "any_text"  # a string is written verbatim, not as JSON
    assert days["elements"][0]["value"] == '<|open|>argument key="days" type="number"<|sep|>'
    assert days["elements"][1] == {"type": "json_schema", "json_schema": {"type": "integer"}}
    assert units["type"] == "optional"  # not required: skippable in its place
    assert [e["value"] for e in units["content"]["elements"][1]["elements"]] == ["c", "f"]
    assert where["content"]["elements"][0]["value"].endswith('type="object"<|sep|>')
    # A schema that pins no type leaves the type attribute and the value free.
    assert other["content"]["elements"][1]["type"] == "any_text"


def test_names_and_keys_are_escaped_and_schemaless_tools_take_any_arguments() -> None:
    odd = {"type": "function", "function": {"name": 'a&b"c', "parameters": {"properties": {'k"': {"type": "string"}}}}}
    fmt = structural_tag([odd, PING], False)["format"]
    assert fmt["at_least_one"] is False
    first, second = fmt["tags"][0]["content"]["content"]["elements"]
    assert first["elements"][0]["value"] == '<|open|>call tool="a&amp;b&quot;c" index="'
    assert first["elements"][3]["elements"][0]["content"]["elements"][0]["value"].startswith(
        '<|open|>argument key="k&quot;"'
    )
    assert second["elements"][3]["type"] == "star"


def test_a_configured_kimi_k3_parser_forces_calls_with_its_tag() -> None:
    kind, text = tool_constraint("any", None, [WEATHER, PING], configured_parser="kimi_k3") or ("", "")
    assert kind == "structural_tag"
    assert json.loads(text) == structural_tag([WEATHER, PING], True)
    kind, text = tool_constraint("tool", "ping", [WEATHER, PING], configured_parser="kimi_k3") or ("", "")
    assert json.loads(text) == structural_tag([PING], True)
    # Detected, not configured: a JSON schema, as for every parser.
    assert (tool_constraint("any", None, [WEATHER], configured_parser=None) or ("",))[0] == "json_schema"
    # The other new formats have no structural tag in the reference either.
    for parser in ("deepseek32", "deepseek_v4", "cohere"):
        assert (tool_constraint("any", None, [WEATHER], configured_parser=parser) or ("",))[0] == "json_schema"


# --- what the grammar admits parses back ---------------------------------------------------------

VALUES: dict[str, Any] = {"city": "Paris\nnord", "days": 3, "units": "f", "where": {"lat": 1.5}, "any": "x"}


def _write(node: dict[str, Any], key: str = "", after: str = "") -> str:
    """One string the grammar node admits (`after`: the text written just before), with `VALUES`
    for the arguments and every optional argument present."""
    kind = node["type"]
    if kind == "const_string":
        return str(node["value"])
    if kind == "regex":
        return "1"
    if kind == "sequence":
        out = ""
        for element in node["elements"]:
            if element["type"] == "const_string" and 'key="' in element["value"]:
                key = element["value"].split('key="')[1].split('"')[0]
            out += _write(element, key, out)
        return out
    if kind == "or":  # an enum's literals, or the choice of tools (the first)
        chosen = [e for e in node["elements"] if e.get("value") == VALUES.get(key)] or node["elements"]
        return _write(chosen[0], key, after)
    if kind in ("plus", "optional"):
        return _write(node["content"], key, after)
    if kind == "json_schema":
        return json.dumps(VALUES[key])
    assert kind == "any_text", kind
    return "string" if after.endswith('type="') else str(VALUES[key])


@pytest.mark.parametrize("prefix", ["", THINK_CLOSE, RESPONSE_CLOSE])
def test_output_the_grammar_admits_is_read_as_its_calls(prefix: str) -> None:
    tag = next(t for t in structural_tag([WEATHER], True)["format"]["tags"] if t["begin"] == prefix + TOOLS_OPEN)
    call = _write(tag["content"])
    output = tag["begin"] + call + call + tag["end"]
    for chunks in ([output], list(output)):
        text, calls = result(run("kimi_k3", chunks, [WEATHER]))
        assert calls == [("get_weather", VALUES)] * 2
        # A closed think channel is the reasoning parser's to take; the response wrapper is dropped.
        assert text == (THINK_CLOSE if prefix == THINK_CLOSE else "")


def test_forced_output_after_reasoning_goes_through_both_stages() -> None:
    tag = structural_tag([WEATHER], True)["format"]["tags"][1]
    output = "I should look it up." + tag["begin"] + _write(tag["content"]) + tag["end"]
    reasoning = make_reasoning_parser("kimi_k3", in_reasoning=True, start_consumed=True)
    tools = make_tool_parser("kimi_k3", [WEATHER])
    pieces: list[Piece] = []
    for ch in output:
        pieces += tools.feed(reasoning.feed([Text(ch)]))
    pieces += tools.feed(reasoning.flush()) + tools.flush()
    assert "".join(p.text for p in pieces if isinstance(p, Thinking)) == "I should look it up."
    assert result(pieces) == ("", [("get_weather", VALUES)])


def test_the_plan_reads_forced_kimi_k3_output_with_its_own_parser() -> None:
    tool = {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}
    body = {"messages": USER, "tools": [tool], "tool_choice": {"type": "any"}}
    plan = _plan(body, "moonshotai/Kimi-K3", tool_parser="kimi_k3")
    assert plan.constraint[0] == "structural_tag" and plan.tool_parser == "kimi_k3"
    assert plan.skip_special_tokens is False  # the format's markers must reach the parser
    # Detected from the id alone, kimi_k3 gets the JSON schema like every parser.
    detected = _plan(body, "moonshotai/Kimi-K3")
    assert detected.constraint[0] == "json_schema" and detected.tool_parser == "json"


def test_kimi_k3_keeps_its_channel_tokens_and_reads_them_with_thinking_off() -> None:
    # The reference: a reasoning parser whose markers are special tokens runs and keeps them.
    for body in ({"messages": USER}, {"messages": USER, "thinking": {"type": "disabled"}}):
        plan = _plan(body, "moonshotai/Kimi-K3")
        assert plan.reasoning_parser == "kimi_k3" and plan.skip_special_tokens is False
        assert plan.in_reasoning is False
    # Other formats are unchanged: thinking off runs no reasoning parser, plain text skips specials.
    plan = _plan({"messages": USER, "thinking": {"type": "disabled"}}, "moonshotai/Kimi-K2-Instruct")
    assert plan.reasoning_parser is None and plan.skip_special_tokens is True
