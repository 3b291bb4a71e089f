"""Parameter values written as text (the XML-style formats) → JSON, by the tool's schema.

A value whose parameter the tool declares with a JSON-schema `type` is read as that type; one
that does not parse as its type, or whose parameter has no single declared type, is read as
JSON if it is JSON, then as a Python literal (`True`, `False`, `None`), else as a string.
Strings are literal — no HTML unescaping — except that the one newline the chat templates put
after the opening tag and before the closing one is not part of the value.
"""

from __future__ import annotations

import json
import re
from typing import Any

from smg.pipeline.parsers.tools.base import Tools, tool_schema

_INTEGER = re.compile(r"[+-]?\d+")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": "true", "True": "true", "false": "false", "False": "false", "null": "null", "None": "null"}


def param_types(tools: Tools, name: str) -> dict[str, str]:
    """Parameter → its declared JSON-schema type, for the parameters that declare exactly one
    (a `["string", "null"]` union counts as `string`)."""
    properties = tool_schema(tools, name).get("properties")
    types: dict[str, str] = {}
    if not isinstance(properties, dict):
        return types
    for key, schema in properties.items():
        declared = schema.get("type") if isinstance(schema, dict) else None
        if isinstance(declared, list):
            kinds = [t for t in declared if t != "null"]
            declared = kinds[0] if len(kinds) == 1 else None
        if isinstance(declared, str):
            types[key] = declared
    return types


def strip_newlines(text: str) -> str:
    """Without the template's newline after the opening tag and before the closing one."""
    if text.startswith("\r\n"):
        text = text[2:]
    elif text.startswith("\n"):
        text = text[1:]
    if text.endswith("\r\n"):
        text = text[:-2]
    elif text.endswith("\n"):
        text = text[:-1]
    return text


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def value_json(raw: str, declared: str | None) -> str:
    """The JSON text of a parameter value as written (template newlines included)."""
    if declared == "string":
        return dumps(strip_newlines(raw))
    text = raw.strip()
    if declared == "integer" and _INTEGER.fullmatch(text):
        return str(int(text))
    if declared == "number" and _NUMBER.fullmatch(text):
        return text
    if declared == "boolean" and text in ("true", "True", "false", "False"):
        return _LITERALS[text]
    if declared == "null" and text in ("null", "None"):
        return "null"
    if declared in ("object", "array"):
        parsed = _json(text)
        if isinstance(parsed, dict if declared == "object" else list):
            return _json_text(parsed, text)
    return infer_json(raw)


def infer_json(raw: str) -> str:
    """JSON if it is JSON, then a Python literal, else the string."""
    text = raw.strip()
    parsed = _json(text)
    if parsed is not _INVALID:
        return _json_text(parsed, text)
    if text in _LITERALS:
        return _LITERALS[text]
    return dumps(strip_newlines(raw))


_INVALID: Any = object()


def _reject(constant: str) -> Any:
    raise ValueError(constant)


def _json(text: str) -> Any:
    if not text:
        return _INVALID
    try:
        return json.loads(text, parse_constant=_reject)
    except (ValueError, RecursionError):
        return _INVALID


def _json_text(value: Any, text: str) -> str:
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (ValueError, RecursionError):
        return text  # e.g. a number too large for a float: still valid JSON as written
