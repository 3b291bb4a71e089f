"""Forced tool use as constrained decoding (spec §F.3).

`tool_choice: any` and `tool_choice: {"type":"tool"}` cannot be left to the model: the engine
is given a constraint. A `json_schema` for any parser (an array of `{name, parameters}` for
`any`, the tool's own `input_schema` for `tool`), or — only when the tool-call parser was
configured explicitly and has a builder — a `structural_tag` in the model's own call format.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, Literal

from smg.pipeline.parsers.tools import kimik3
from smg.protocol.errors import ApiError

ConstraintKind = Literal["json_schema", "structural_tag", "regex", "ebnf"]
Constraint = tuple[ConstraintKind, str]


def _schema(tool: dict[str, Any]) -> dict[str, Any]:
    return dict(tool["function"].get("parameters") or {"type": "object"})


def _merged_defs(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """Every tool's `$defs` in one map; one name with two different schemas is refused."""
    merged: dict[str, Any] = {}
    for tool in tools:
        for name, schema in (_schema(tool).get("$defs") or {}).items():
            if name in merged and merged[name] != schema:
                raise ApiError(
                    400,
                    f"Invalid tool configuration: Tool definition '{name}' has multiple conflicting schemas",
                    code="invalid_tool_configuration",
                )
            merged[name] = schema
    return merged


def any_tool_schema(tools: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON schema of `tool_choice: any`: at least one `{name, parameters}` call."""
    variants = []
    for tool in tools:
        params = {k: v for k, v in _schema(tool).items() if k != "$defs"}
        variants.append(
            {
                "properties": {
                    "name": {"type": "string", "enum": [tool["function"]["name"]]},
                    "parameters": params,
                },
                "required": ["name", "parameters"],
            }
        )
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"type": "object", "anyOf": variants}}
    defs = _merged_defs(tools)
    if defs:
        schema["$defs"] = defs
    return schema


def _triggered(triggers: list[str], tags: list[dict[str, Any]], at_least_one: bool) -> dict[str, Any]:
    """A structural tag that lets the model write freely until a trigger, then holds it to one of
    `tags` (at least one call when `at_least_one`)."""
    return {"format": {"type": "triggered_tags", "triggers": triggers, "tags": tags, "at_least_one": at_least_one}}


def _mistral_tag(tools: list[dict[str, Any]], at_least_one: bool) -> dict[str, Any]:
    calls = [
        {
            "begin": '{"name": ' + json.dumps(tool["function"]["name"]) + ', "arguments": ',
            "content": {"type": "json_schema", "json_schema": _schema(tool)},
            "end": "}",
        }
        for tool in tools
    ]
    group = {
        "begin": "[TOOL_CALLS] [",
        "content": {"type": "tags_with_separator", "tags": calls, "separator": ", "},
        "end": "]",
    }
    return _triggered(["[TOOL_CALLS]"], [group], at_least_one)


def _kimik2_tag(tools: list[dict[str, Any]], at_least_one: bool) -> dict[str, Any]:
    tags = []
    for index, tool in enumerate(tools):
        name = tool["function"]["name"]
        content = {"type": "json_schema", "json_schema": _schema(tool)}
        head = f"<|tool_call_begin|>functions.{name}:{index}<|tool_call_argument_begin|>"
        tags.append({"begin": f"<|tool_calls_section_begin|>{head}", "content": content, "end": "<|tool_call_end|>"})
        tags.append({"begin": head, "content": content, "end": "<|tool_call_end|>"})
    return _triggered(["<|tool_calls_section_begin|>", "<|tool_call_begin|>"], tags, at_least_one)


def _inkling_tag(tools: list[dict[str, Any]], at_least_one: bool) -> dict[str, Any]:
    tags = [
        {
            "begin": '<|content_invoke_tool_json|>{"name":' + json.dumps(tool["function"]["name"]) + ',"args":',
            "content": {"type": "json_schema", "json_schema": _schema(tool)},
            "end": "}<|end_message|>",
        }
        for tool in tools
    ]
    return _triggered(["<|content_invoke_tool_json|>"], tags, at_least_one)


# The parsers whose native call format can be written as a structural tag, and its builder.
STRUCTURAL_TAGS: dict[str, Callable[[list[dict[str, Any]], bool], dict[str, Any]]] = {
    "mistral": _mistral_tag,
    "kimik2": _kimik2_tag,
    "inkling": _inkling_tag,
    "kimi_k3": kimik3.structural_tag,
}
STRUCTURAL_TAG_PARSERS = frozenset(STRUCTURAL_TAGS)


def tool_constraint(
    choice: str | None,
    forced_name: str | None,
    tools: list[dict[str, Any]] | None,
    *,
    configured_parser: str | None,
) -> Constraint | None:
    """The constraint for a request's `tool_choice` (`any`/`tool`), as (kind, text), or None."""
    if choice not in ("any", "tool") or not tools:
        return None
    chosen = [t for t in tools if t["function"]["name"] == forced_name] if choice == "tool" else tools
    if not chosen:
        return None
    builder = STRUCTURAL_TAGS.get(configured_parser or "")
    if builder is not None:
        return "structural_tag", json.dumps(builder(chosen, True), separators=(",", ":"))
    if choice == "tool":
        return "json_schema", json.dumps(_schema(chosen[0]), separators=(",", ":"))
    return "json_schema", json.dumps(any_tool_schema(chosen), separators=(",", ":"))
