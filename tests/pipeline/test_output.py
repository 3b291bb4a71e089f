"""Sans-IO: forced tool use (constraints and the forced stage), the output plan, stable ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

from smg.pipeline.constraints import any_tool_schema, tool_constraint
from smg.pipeline.forced import ForcedToolStage
from smg.pipeline.generation import Text, ToolArgs, ToolCall
from smg.pipeline.ids import from_parser_id, tool_use_id
from smg.pipeline.output import plan_output
from smg.pipeline.render import render_prompt
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.protocol.errors import ApiError
from smg.protocol.parse import parse_create_message
from tests.grpc.conftest import QWEN3


def tool(name: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    parameters = schema or {"type": "object", "properties": {"x": {"type": "string"}}}
    return {"type": "function", "function": {"name": name, "description": "", "parameters": parameters}}


def test_any_schema_is_an_array_of_name_parameters_variants() -> None:
    schema = any_tool_schema([tool("a"), tool("b")])
    assert schema["type"] == "array" and schema["minItems"] == 1
    variants = schema["items"]["anyOf"]
    assert [v["properties"]["name"]["enum"] for v in variants] == [["a"], ["b"]]
    assert all(v["required"] == ["name", "parameters"] for v in variants)


def test_defs_are_merged_and_conflicts_refused() -> None:
    a = tool("a", {"type": "object", "$defs": {"P": {"type": "string"}}})
    b = tool("b", {"type": "object", "$defs": {"Q": {"type": "integer"}}})
    assert set(any_tool_schema([a, b])["$defs"]) == {"P", "Q"}
    clash = tool("c", {"type": "object", "$defs": {"P": {"type": "number"}}})
    with pytest.raises(ApiError) as info:
        any_tool_schema([a, clash])
    assert info.value.status == 400 and info.value.code == "invalid_tool_configuration"
    assert "Tool definition 'P' has multiple conflicting schemas" in info.value.message


def test_constraint_per_tool_choice() -> None:
    tools = [tool("a"), tool("b")]
    assert tool_constraint("auto", None, tools, configured_parser=None) is None
    assert tool_constraint("none", None, tools, configured_parser=None) is None
    kind, text = tool_constraint("tool", "b", tools, configured_parser=None) or ("", "")
    assert kind == "json_schema" and json.loads(text) == tools[1]["function"]["parameters"]
    kind, text = tool_constraint("any", None, tools, configured_parser="mistral") or ("", "")
    tag = json.loads(text)
    assert kind == "structural_tag" and tag["format"]["triggers"] == ["[TOOL_CALLS]"]
    assert tag["format"]["at_least_one"] is True
    # A detected (not configured) parser never gives a structural tag.
    assert (tool_constraint("any", None, tools, configured_parser=None) or ("",))[0] == "json_schema"


@pytest.mark.parametrize("stream", [True, False])
def test_forced_tool_stage_valid_output(stream: bool) -> None:
    stage = ForcedToolStage("get_weather", stream)
    pieces = stage.feed([Text('{"city": '), Text('"Paris"}')]) + stage.flush()
    calls = [p for p in pieces if isinstance(p, ToolCall)]
    args = "".join(p.fragment for p in pieces if isinstance(p, ToolArgs))
    assert [c.name for c in calls] == ["get_weather"] and json.loads(args) == {"city": "Paris"}


def test_forced_tool_stage_unparseable_output_stays_text_when_buffered() -> None:
    stage = ForcedToolStage("get_weather", stream=False)
    assert stage.feed([Text("not json")]) == []
    assert stage.flush() == [Text("not json")]


def test_stable_ids() -> None:
    assert tool_use_id("msg_a", 0) == tool_use_id("msg_a", 0) != tool_use_id("msg_a", 1)
    assert tool_use_id("msg_a", 0).startswith("toolu_") and len(tool_use_id("msg_a", 0)) == 30
    assert from_parser_id("call_abc") == "toolu_abc"
    assert from_parser_id("functions.f:0") == "functions.f:0"


def _plan(body: dict[str, Any], model: str = "qwen3-fixture", **flags: Any) -> Any:
    request = parse_create_message({"model": model, "max_tokens": 4096, **body})
    tokenizer = Tokenizer.load(QWEN3)
    return plan_output(request, render_prompt(tokenizer, request), model, **flags)


WEATHER = {"name": "w", "input_schema": {"type": "object", "properties": {"c": {"type": "string"}}}}
USER = [{"role": "user", "content": "hi"}]


def test_plan_detects_parsers_and_keeps_special_tokens_for_tools() -> None:
    plan = _plan({"messages": USER, "tools": [WEATHER]})
    assert plan.tool_parser == "qwen" and plan.reasoning_parser == "qwen3"
    assert plan.skip_special_tokens is False and plan.constraint is None
    assert _plan({"messages": USER}).skip_special_tokens is True


def test_plan_forced_tool_and_any() -> None:
    forced = _plan({"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "tool", "name": "w"}})
    assert forced.forced_tool == "w" and forced.tool_parser is None and forced.constraint[0] == "json_schema"
    forced_any = _plan({"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "any"}})
    assert forced_any.tool_parser == "json" and forced_any.skip_special_tokens is True


def test_plan_flags_win_and_none_disables_tools() -> None:
    plan = _plan({"messages": USER, "tools": [WEATHER]}, tool_parser="pythonic", reasoning_parser="deepseek_r1")
    assert plan.tool_parser == "pythonic" and plan.reasoning_parser == "deepseek_r1"
    none = _plan({"messages": USER, "tools": [WEATHER], "tool_choice": {"type": "none"}})
    assert none.tool_parser is None and none.constraint is None


def test_plan_thinking_disabled_runs_no_reasoning_parser() -> None:
    assert _plan({"messages": USER, "thinking": {"type": "disabled"}}).reasoning_parser is None
    omitted = _plan({"messages": USER, "thinking": {"type": "enabled", "budget_tokens": 1024, "display": "omitted"}})
    assert omitted.display_omitted is True
