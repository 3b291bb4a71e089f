"""The Kimi-K3 tool-call format, XTML (behaviors.md §F.8 `kimi_k3`), as its chat template writes
an assistant turn:

    <|open|>response<|sep|>Let me check.<|close|>response<|sep|>
    <|open|>tools<|sep|>
    <|open|>call tool="get_weather" index="1"<|sep|>
    <|open|>argument key="city" type="string"<|sep|>Paris<|close|>argument<|sep|>
    <|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>
    <|close|>call<|sep|>
    <|close|>tools<|sep|>

(written without the line breaks). The `response` channel's wrappers (and a closing
`<|close|>message<|sep|>`) are dropped from the text; the generation prompt often opens the
channel itself, so the output may start with its content. Calls are the `call` elements of the
`tools` channel (invoke.py): a `type="string"` value is the string verbatim and streams, any other
type is JSON (kept as a string when it is not). A call may instead hold one
`<|open|>json type="object"<|sep|>{…}<|close|>json<|sep|>` arguments object. Attribute values
escape `&` and `"` (`&amp;`, `&quot;`). The `index` attribute is not an id: ids are the gateway's.

`structural_tag` is the constraint for forced tool use (§F.3) in this format, as the reference
builds it: the tools channel, possibly right after the close of the channel the prompt left open
(`think` or `response`), holding one or more calls of the declared tools whose arguments follow
each tool's schema.
"""

from __future__ import annotations

from typing import Any

from smg.pipeline.parsers.tools.invoke import InvokeParser

OPEN, CLOSE, SEP = "<|open|>", "<|close|>", "<|sep|>"
TOOLS_OPEN = f"{OPEN}tools{SEP}"
TOOLS_CLOSE = f"{CLOSE}tools{SEP}"
CALL = f"{OPEN}call"
END_CALL = f"{CLOSE}call{SEP}"
ARGUMENT = f"{OPEN}argument"
END_ARGUMENT = f"{CLOSE}argument{SEP}"
JSON_OPEN = f"{OPEN}json"
JSON_CLOSE = f"{CLOSE}json{SEP}"
RESPONSE_OPEN = f"{OPEN}response{SEP}"
RESPONSE_CLOSE = f"{CLOSE}response{SEP}"
MESSAGE_CLOSE = f"{CLOSE}message{SEP}"
THINK_CLOSE = f"{CLOSE}think{SEP}"
WRAPPERS = (RESPONSE_OPEN, RESPONSE_CLOSE, MESSAGE_CLOSE)


class KimiK3Parser(InvokeParser):
    name = "kimi_k3"
    start_markers = (TOOLS_OPEN, *WRAPPERS)
    block = TOOLS_OPEN
    block_end = TOOLS_CLOSE
    invoke = CALL
    end_invoke = END_CALL
    parameter = ARGUMENT
    end_parameter = END_ARGUMENT
    tag_end = SEP
    name_attr = "tool"
    key_attr = "key"
    value_ends = (END_ARGUMENT, ARGUMENT, END_CALL, TOOLS_CLOSE)
    value_newlines = False
    json_body = True
    json_open = JSON_OPEN
    json_close = JSON_CLOSE

    def _open(self, marker: str) -> None:
        if marker == TOOLS_OPEN:
            self.mode = "block"
        else:  # a channel wrapper: not text
            self._raw = []

    def _attr(self, value: str) -> str:
        return value.replace("&quot;", '"').replace("&amp;", "&")

    def _valid_name(self, name: str) -> bool:
        return True  # any name the template could write (its attributes are escaped)

    def _value_type(self, key: str, attrs: dict[str, str]) -> str | None:
        return "string" if attrs.get("type", "string") == "string" else "json"


# --- the structural tag -------------------------------------------------------------------------

_ANY_VALUE = {"type": "any_text", "excludes": [CLOSE, OPEN, SEP]}
_ANY_ATTR = {"type": "any_text", "excludes": ['"', "<|"]}
_INDEX = {"type": "regex", "pattern": "[1-9][0-9]*"}


def _const(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _escape(value: str) -> str:
    return value.replace("&", "&amp;").replace('"', "&quot;")


def _value_shape(schema: Any) -> tuple[str, dict[str, Any]] | None:
    """(the `type` attribute, the value's grammar) for a property's schema; None when the
    schema does not pin one (a union, `anyOf`, no type)."""
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
        return "string", {"type": "or", "elements": [_const(v) for v in enum]}
    kind = schema.get("type")
    if kind == "string":
        return "string", _ANY_VALUE  # written verbatim, so not a JSON string
    if kind in ("integer", "number"):
        return "number", {"type": "json_schema", "json_schema": schema}
    if kind == "boolean":
        return "boolean", {"type": "json_schema", "json_schema": {"type": "boolean"}}
    if kind in ("object", "array"):
        return kind, {"type": "json_schema", "json_schema": schema}
    if kind == "null":
        return "null", _const("null")
    return None


def _argument(key: str, schema: Any) -> dict[str, Any]:
    head = f'{ARGUMENT} key="{_escape(key)}" type="'
    shape = _value_shape(schema)
    if shape is None:
        elements = [_const(head), _ANY_ATTR, _const(f'"{SEP}'), _ANY_VALUE]
    else:
        kind, value = shape
        elements = [_const(f'{head}{kind}"{SEP}'), value]
    return {"type": "sequence", "elements": [*elements, _const(END_ARGUMENT)]}


def _any_arguments() -> dict[str, Any]:
    argument = [_const(f'{ARGUMENT} key="'), _ANY_ATTR, _const('" type="'), _ANY_ATTR, _const(f'"{SEP}')]
    return {"type": "star", "content": {"type": "sequence", "elements": [*argument, _ANY_VALUE, _const(END_ARGUMENT)]}}


def _arguments(schema: Any) -> dict[str, Any]:
    """The arguments of a call in the schema's property order: the required ones always, each
    optional one skippable in its place."""
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict) or not properties:
        return _any_arguments()
    required = set(schema.get("required") or ())
    elements = []
    for key, sub in properties.items():
        argument = _argument(key, sub)
        elements.append(argument if key in required else {"type": "optional", "content": argument})
    return {"type": "sequence", "elements": elements}


def _call(name: str, schema: Any) -> dict[str, Any]:
    head = [_const(f'{CALL} tool="{_escape(name)}" index="'), _INDEX, _const(f'"{SEP}')]
    return {"type": "sequence", "elements": [*head, _arguments(schema), _const(END_CALL)]}


def structural_tag(tools: list[dict[str, Any]], at_least_one: bool) -> dict[str, Any]:
    """The structural tag of calls to `tools` (OpenAI-style function tools) in this format."""
    calls = [_call(f["name"], f.get("parameters")) for t in tools if (f := t["function"]).get("name")]
    if calls:
        choice: dict[str, Any] = {"type": "or", "elements": calls}
    else:
        any_call = [_const(f'{CALL} tool="'), _ANY_ATTR, _const('" index="'), _INDEX, _const(f'"{SEP}')]
        choice = {"type": "sequence", "elements": [*any_call, _any_arguments(), _const(END_CALL)]}
    content = {"type": "plus", "content": choice}
    tags = [
        {"begin": prefix + TOOLS_OPEN, "content": content, "end": TOOLS_CLOSE}
        for prefix in ("", THINK_CLOSE, RESPONSE_CLOSE)
    ]
    return {
        "format": {
            "type": "triggered_tags",
            "triggers": [TOOLS_OPEN, THINK_CLOSE, RESPONSE_CLOSE],
            "tags": tags,
            "at_least_one": at_least_one,
        }
    }
