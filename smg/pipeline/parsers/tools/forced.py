"""Reading the whole output of a generation constrained by a JSON schema (behaviors.md §F.3).

`tool_choice: any` constrains the output to an array of `{"name", "parameters"}` objects;
`tool_choice: tool` to the named tool's arguments object. Both readers are pure: None means the
output did not parse as required and stays text.
"""

from __future__ import annotations

import json
from typing import Any


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def parse_forced_any(text: str) -> list[tuple[str, dict[str, Any]]] | None:
    """The calls of a `tool_choice: any` output — a JSON array of `{"name": …, "parameters":
    {…}}` objects — as (name, arguments); None unless every element is such a call.
    `arguments` is accepted for `parameters`, and an arguments object given as a JSON string is
    decoded; a call without arguments gets `{}`."""
    value = _loads(text)
    if not isinstance(value, list):
        return None
    calls: list[tuple[str, dict[str, Any]]] = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        args = item.get("parameters", item.get("arguments", {}))
        if isinstance(args, str):
            args = _loads(args)
        calls.append((item["name"], args if isinstance(args, dict) else {}))
    return calls


def parse_forced_tool(text: str) -> dict[str, Any] | None:
    """The arguments of a `tool_choice: tool` output: the whole output as a JSON object."""
    value = _loads(text)
    return value if isinstance(value, dict) else None
