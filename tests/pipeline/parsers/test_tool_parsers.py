"""The incremental tool-call parsers: each format's calls become `ToolCall` + `ToolArgs` pieces,
text stays text, and nothing depends on how the output is cut (behaviors.md §C.2, §D.2, §F.8,
smg#2271)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg.pipeline.generation import Piece, Text, Thinking, ToolArgs, ToolCall
from smg.pipeline.parsers.tools import TOOL_PARSERS, make_tool_parser
from smg.pipeline.parsers.tools.values import strip_newlines

Call = tuple[str, dict[str, Any]]
Result = tuple[str, list[Call]]


def fn(name: str, **properties: str) -> dict[str, Any]:
    props = {key: {"type": kind} for key, kind in properties.items()}
    return {
        "type": "function",
        "function": {"name": name, "description": "", "parameters": {"type": "object", "properties": props}},
    }


TOOLS = [
    fn("get_weather", city="string", days="integer", metric="boolean"),
    fn("search", query="string", limit="integer", filters="object", tags="array", score="number"),
    fn("noop"),
]


def run(name: str, chunks: Iterable[str], tools: list[dict[str, Any]] | None = TOOLS) -> list[Piece]:
    parser = make_tool_parser(name, tools)
    out: list[Piece] = []
    for chunk in chunks:
        out += parser.feed([Text(chunk)])
    return out + parser.flush()


def result(pieces: Sequence[Piece]) -> Result:
    """(all text, [(name, json.loads of the call's concatenated ToolArgs)])."""
    text = "".join(p.text for p in pieces if isinstance(p, Text))
    calls: list[list[str]] = []
    for piece in pieces:
        if isinstance(piece, ToolCall):
            calls.append([piece.name, ""])
        elif isinstance(piece, ToolArgs):
            assert calls, "arguments before any call"
            calls[-1][1] += piece.fragment
    out: list[Call] = []
    for name, args in calls:
        parsed = json.loads(args)
        assert isinstance(parsed, dict), args
        out.append((name, parsed))
    return text, out


def chunked(text: str, cuts: Iterable[int]) -> list[str]:
    bounds = [0, *sorted(set(cuts)), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


def rendered(pieces: Sequence[Piece]) -> str:
    """The output in order, a call as its name and arguments."""
    parts: list[str] = []
    for piece in pieces:
        if isinstance(piece, Text):
            parts.append(piece.text)
        elif isinstance(piece, ToolCall):
            parts.append(piece.name)
        elif isinstance(piece, ToolArgs):
            parts.append(piece.fragment)
    return "".join(parts)


def is_subsequence(needle: str, haystack: str) -> bool:
    it = iter(haystack)
    return all(ch in it for ch in needle)


def nonspace(text: str) -> str:
    return re.sub(r"\s+", "", text)


# --- the formats -------------------------------------------------------------------------------

QC, QE = "<tool_call>", "</tool_call>"
DS = {
    "calls": "<｜tool▁calls▁begin｜>",
    "calls_end": "<｜tool▁calls▁end｜>",
    "call": "<｜tool▁call▁begin｜>",
    "call_end": "<｜tool▁call▁end｜>",
    "sep": "<｜tool▁sep｜>",
}
KS, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
KC, KA, KCE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"
MM, MME = "<minimax:tool_call>", "</minimax:tool_call>"
D = "｜DSML｜"
DSML_BLOCK = {"deepseek32": "function_calls", "deepseek_v4": "tool_calls"}
XO, XC, XS = "<|open|>", "<|close|>", "<|sep|>"
K3T, K3TE = f"{XO}tools{XS}", f"{XC}tools{XS}"
K3_WRAPPERS = (f"{XO}response{XS}", f"{XC}response{XS}", f"{XC}message{XS}")
CA, CAE = "<|START_ACTION|>", "<|END_ACTION|>"
COHERE_WRAPPERS = ("<|START_RESPONSE|>", "<|END_RESPONSE|>", "<|START_TEXT|>", "<|END_TEXT|>")

PARIS = {"city": "Paris", "days": 3}
QUERY = {"query": 'rust "async" \\ runtime\n', "limit": 5, "filters": {"lang": ["en", "fr"], "x": None}}


def qwen_call(name: str, args: dict[str, Any]) -> str:
    return f"{QC}\n{json.dumps({'name': name, 'arguments': args})}\n{QE}"


def xml_call(name: str, params: dict[str, str]) -> str:
    body = "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in params.items())
    return f"{QC}\n<function={name}>\n{body}</function>\n{QE}"


def glm_call(name: str, params: dict[str, str], newlines: bool = True) -> str:
    nl = "\n" if newlines else ""
    body = "".join(f"<arg_key>{k}</arg_key>{nl}<arg_value>{v}</arg_value>{nl}" for k, v in params.items())
    return f"{QC}{name}{nl}{body}{QE}"


def ds3_call(name: str, args: dict[str, Any]) -> str:
    return f"{DS['call']}function{DS['sep']}{name}\n```json\n{json.dumps(args)}\n```{DS['call_end']}"


def ds31_call(name: str, args: dict[str, Any]) -> str:
    return f"{DS['call']}{name}{DS['sep']}{json.dumps(args)}{DS['call_end']}"


def kimi_call(name: str, n: int, args: dict[str, Any]) -> str:
    return f"{KC}functions.{name}:{n}{KA}{json.dumps(args)}{KCE}"


def mm_invoke(name: str, params: dict[str, str]) -> str:
    body = "".join(f'<parameter name="{k}">{v}</parameter>\n' for k, v in params.items())
    return f'<invoke name="{name}">\n{body}</invoke>\n'


def dsml_invoke(name: str, args: dict[str, Any]) -> str:
    """As DeepSeek's encoder writes a call: strings verbatim, other values as JSON."""
    params = [
        f'<{D}parameter name="{k}" string="{str(isinstance(v, str)).lower()}">'
        f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}</{D}parameter>"
        for k, v in args.items()
    ]
    return f'<{D}invoke name="{name}">\n' + "\n".join(params) + f"\n</{D}invoke>"


def dsml(parser: str, *invokes: str) -> str:
    block = DSML_BLOCK[parser]
    return f"<{D}{block}>\n" + "\n".join(invokes) + f"\n</{D}{block}>"


def k3_call(name: str, index: int, args: dict[str, Any]) -> str:
    """As Kimi-K3's template writes a call: the type is the value's, strings verbatim."""
    kinds = {bool: "boolean", str: "string", dict: "object", list: "array", type(None): "null"}
    body = "".join(
        f'{XO}argument key="{k}" type="{kinds.get(type(v), "number")}"{XS}'
        f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}{XC}argument{XS}"
        for k, v in args.items()
    )
    return f'{XO}call tool="{name}" index="{index}"{XS}{body}{XC}call{XS}'


def k3(*calls: str) -> str:
    return K3T + "".join(calls) + K3TE


def cohere_action(calls: list[Call]) -> str:
    items = [{"tool_call_id": str(i), "tool_name": n, "parameters": a} for i, (n, a) in enumerate(calls)]
    return CA + "[\n    " + ",\n    ".join(json.dumps(item) for item in items) + "\n]" + CAE


# (parser, model output, expected text, expected calls)
CASES: list[tuple[str, str, str, list[Call]]] = [
    # qwen
    ("qwen", qwen_call("get_weather", PARIS), "", [("get_weather", PARIS)]),
    ("qwen", "Checking.\n" + qwen_call("get_weather", PARIS), "Checking.\n", [("get_weather", PARIS)]),
    (
        "qwen",
        qwen_call("get_weather", PARIS) + "\n" + qwen_call("search", QUERY) + "\n",
        "",
        [("get_weather", PARIS), ("search", QUERY)],
    ),
    ("qwen", f'{QC}\n{{"arguments": {{}}, "name": "noop"}}\n{QE}', "", [("noop", {})]),
    ("qwen", f'{QC}\n{{"name": "noop"}}\n{QE}', "", [("noop", {})]),
    ("qwen", f'{QC}\n{{"name": "unknown_tool", "parameters": {{"a": [1]}}}}{QE}', "", [("unknown_tool", {"a": [1]})]),
    ("qwen", f'{QC}\n{{"name": "noop", "arguments": "{{\\"a\\": 1}}"}}\n{QE}', "", [("noop", {"a": 1})]),
    ("qwen", qwen_call("get_weather", PARIS) + "\n\nDone.", "Done.", [("get_weather", PARIS)]),
    ("qwen", f'{QC}\n{{"name": get_weather}}\n{QE} ok', f'{QC}\n{{"name": get_weather}}\n{QE} ok', []),
    ("qwen", f'{QC}\n{{"tool": "x", "arguments": {{}}}}\n{QE}', f'{QC}\n{{"tool": "x", "arguments": {{}}}}\n{QE}', []),
    (
        "qwen",
        f'Hi {QC}\n{{"name": "get_weather", "arguments": {{"city": "Par',
        "Hi ",
        [("get_weather", {"city": "Par"})],
    ),
    ("qwen", f'Hi {QC}\n{{"name": "get_wea', f'Hi {QC}\n{{"name": "get_wea', []),
    ("qwen", "Use the <tool", "Use the <tool", []),
    ("qwen", "a < b and <tool_cal", "a < b and <tool_cal", []),
    # qwen_xml (qwen_coder, nemotron)
    (
        "qwen_xml",
        "Let me look.\n" + xml_call("get_weather", {"city": "Paris", "days": "3", "metric": "True"}),
        "Let me look.\n",
        [("get_weather", {"city": "Paris", "days": 3, "metric": True})],
    ),
    (
        "qwen_xml",
        xml_call("search", {"query": "42", "limit": "7", "filters": '{"a": [1]}', "tags": '["x"]', "score": "1.5"})
        + "\n"
        + xml_call("noop", {}),
        "",
        [("search", {"query": "42", "limit": 7, "filters": {"a": [1]}, "tags": ["x"], "score": 1.5}), ("noop", {})],
    ),
    (
        "qwen_xml",
        xml_call("unknown", {"n": "12", "b": "false", "s": "hello world", "j": "[1, 2]", "p": "None"}),
        "",
        [("unknown", {"n": 12, "b": False, "s": "hello world", "j": [1, 2], "p": None})],
    ),
    (
        "qwen_xml",
        xml_call("search", {"query": "  def f():\n      return '<a>&amp;'\n"}),
        "",
        [("search", {"query": "  def f():\n      return '<a>&amp;'\n"})],
    ),
    ("qwen_xml", "<function=noop>\n</function>\n", "", [("noop", {})]),
    ("qwen_xml", f"{QC}\n<function=search>\n<parameter=query>\ncut sh", "", [("search", {"query": "cut sh"})]),
    ("qwen_xml", f"{QC}\n<function=search>\n<parameter=limit>\n4", "", [("search", {"limit": 4})]),
    ("qwen_xml", f"{QC}\n<func", f"{QC}\n<func", []),
    ("qwen_xml", f'{QC}\n{{"name": "noop"}}\n{QE}', f'{QC}\n{{"name": "noop"}}\n{QE}', []),
    ("qwen_xml", "x <tool", "x <tool", []),
    # json
    ("json", '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}', "", [("get_weather", PARIS)]),
    (
        "json",
        '[{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}, {"name": "noop", "arguments": {}}]',
        "",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("json", 'Sure: {"name": "noop", "arguments": {}}', "Sure: ", [("noop", {})]),
    ("json", json.dumps([{"name": "search", "arguments": QUERY}] * 2), "", [("search", QUERY)] * 2),
    ("json", 'A list [1, 2] and {"a": 1} and {x}.', 'A list [1, 2] and {"a": 1} and {x}.', []),
    ("json", '{"name": "Bob", "age": 3}', '{"name": "Bob", "age": 3}', []),
    ("json", '{"name": "undeclared", "arguments": {}}', '{"name": "undeclared", "arguments": {}}', []),
    ("json", '{"name": "search", "arguments": {"query": "x", "limit": ', "", [("search", {"query": "x"})]),
    ("json", '{"name": "search", "argu', '{"name": "search", "argu', []),
    # llama
    (
        "llama",
        '<|python_tag|>{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "llama",
        '{"name": "get_weather", "parameters": {"city": "Paris", "days": 3}}; {"name": "noop", "parameters": {}}',
        "",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("llama", 'Okay. <|python_tag|>{"name": "noop", "parameters": {}}', "Okay. ", [("noop", {})]),
    ("llama", "<|python_tag|>" + json.dumps({"name": "search", "parameters": QUERY}), "", [("search", QUERY)]),
    ("llama", 'Okay. {"name": "noop", "parameters": {}}', 'Okay. {"name": "noop", "parameters": {}}', []),
    ("llama", '<|python_tag|>brave_search.call(query="x")', '<|python_tag|>brave_search.call(query="x")', []),
    ("llama", "Hello <|python_ta", "Hello <|python_ta", []),
    # mistral
    (
        "mistral",
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}, "id": "a1b2c3d4e"}]',
        "",
        [("get_weather", PARIS)],
    ),
    (
        "mistral",
        'Checking. [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "noop", "arguments": {}}]',
        "Checking. ",
        [("get_weather", PARIS), ("noop", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "days": 3}[TOOL_CALLS]noop[CALL_ID]a1b2c3d4e[ARGS]{}',
        "",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("mistral", "[TOOL_CALLS] " + json.dumps([{"name": "search", "arguments": QUERY}]), "", [("search", QUERY)]),
    ("mistral", "[TOOL_CALLS]search[ARGS]" + json.dumps(QUERY), "", [("search", QUERY)]),
    ("mistral", "[TOOL_CALLS] I cannot help.", "[TOOL_CALLS] I cannot help.", []),
    ("mistral", "[TOOL_CALLS] [{'name': 'noop'}]", "[TOOL_CALLS] [{'name': 'noop'}]", []),
    ("mistral", "a [TOOL_CA", "a [TOOL_CA", []),
    # pythonic
    (
        "pythonic",
        '[get_weather(city="Paris", days=3), search(query="a)b", filters={"x": (1, 2)}, limit=None)]',
        "",
        [("get_weather", PARIS), ("search", {"query": "a)b", "filters": {"x": [1, 2]}, "limit": None})],
    ),
    ("pythonic", "Calling: <|python_start|>[noop()]<|python_end|>", "Calling: ", [("noop", {})]),
    ("pythonic", "See [1] and [a, b] and [f(x)].", "See [1] and [a, b] and [f(x)].", []),
    ("pythonic", '[get_weather(city="Par', '[get_weather(city="Par', []),
    # deepseek (V3)
    (
        "deepseek",
        "Let me check." + DS["calls"] + ds3_call("get_weather", PARIS) + "\n" + ds3_call("noop", {}) + DS["calls_end"],
        "Let me check.",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("deepseek", DS["calls"] + ds3_call("search", QUERY) + DS["calls_end"], "", [("search", QUERY)]),
    ("deepseek", DS["calls"] + "not a call", DS["calls"] + "not a call", []),
    ("deepseek", "x <｜tool▁ca", "x <｜tool▁ca", []),
    # deepseek31
    (
        "deepseek31",
        "Let me check." + DS["calls"] + ds31_call("get_weather", PARIS) + ds31_call("noop", {}) + DS["calls_end"],
        "Let me check.",
        [("get_weather", PARIS), ("noop", {})],
    ),
    (
        "deepseek31",
        DS["calls"] + ds31_call("search", QUERY) + DS["calls_end"] + "\nAfter.",
        "After.",
        [("search", QUERY)],
    ),
    (
        "deepseek31",
        DS["calls"] + DS["call"] + "noop" + DS["sep"] + "[1]" + DS["call_end"],
        DS["calls"] + DS["call"] + "noop" + DS["sep"] + "[1]" + DS["call_end"],
        [],
    ),
    (
        "deepseek31",
        DS["calls"] + DS["call"] + "search" + DS["sep"] + '{"query": "cu',
        "",
        [("search", {"query": "cu"})],
    ),
    # glm45_moe / glm47_moe
    (
        "glm45_moe",
        "On it.\n" + glm_call("get_weather", {"city": "Paris", "days": "3"}) + "\n" + glm_call("noop", {}),
        "On it.\n",
        [("get_weather", PARIS), ("noop", {})],
    ),
    (
        "glm47_moe",
        glm_call("search", {"query": "123", "tags": '["a"]', "other": '{"k": 1}'}, newlines=False),
        "",
        [("search", {"query": "123", "tags": ["a"], "other": {"k": 1}})],
    ),
    ("glm47_moe", f'{QC}{{"name": "noop"}}{QE}', f'{QC}{{"name": "noop"}}{QE}', []),
    ("glm45_moe", f"{QC}search\n<arg_key>query</arg_key>\n<arg_value>par", "", [("search", {"query": "par"})]),
    # kimik2
    (
        "kimik2",
        "Sure." + KS + kimi_call("get_weather", 0, PARIS) + kimi_call("noop", 1, {}) + KE,
        "Sure.",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("kimik2", KS + kimi_call("search", 0, QUERY) + KE, "", [("search", QUERY)]),
    ("kimik2", KS + f"{KC}bad id{KA}{{}}{KCE}" + KE, KS + f"{KC}bad id{KA}{{}}{KCE}" + KE, []),
    ("kimik2", "x <|tool_calls_sec", "x <|tool_calls_sec", []),
    # minimax_m2
    (
        "minimax_m2",
        "Checking.\n"
        + MM
        + "\n"
        + mm_invoke("get_weather", {"city": "Paris", "days": "3"})
        + mm_invoke("noop", {})
        + MME,
        "Checking.\n",
        [("get_weather", PARIS), ("noop", {})],
    ),
    (
        "minimax_m2",
        MM + mm_invoke("search", {"query": "a &lt;b&gt; &amp; 1", "limit": "2", "x": "[1, 2]", "y": "true"}) + MME,
        "",
        [("search", {"query": "a <b> & 1", "limit": 2, "x": [1, 2], "y": True})],
    ),
    ("minimax_m2", MM + "<invoke>oops</invoke>" + MME, MM + "<invoke>oops</invoke>" + MME, []),
    # deepseek32 / deepseek_v4 (DSML)
    (
        "deepseek32",
        "Let me check.\n\n" + dsml("deepseek32", dsml_invoke("get_weather", PARIS), dsml_invoke("noop", {})),
        "Let me check.\n\n",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("deepseek32", dsml("deepseek32", dsml_invoke("search", QUERY)), "", [("search", QUERY)]),
    (
        "deepseek_v4",
        dsml("deepseek_v4", dsml_invoke("search", {"query": " <b> & 'x'\n", "limit": 2, "tags": ["a"]})) + "\nDone.",
        "Done.",
        [("search", {"query": " <b> & 'x'\n", "limit": 2, "tags": ["a"]})],
    ),
    (
        "deepseek_v4",
        dsml("deepseek_v4", f'<{D}invoke name="get_weather">\n{json.dumps(PARIS)}\n</{D}invoke>'),
        "",
        [("get_weather", PARIS)],
    ),
    (
        "deepseek32",
        dsml(
            "deepseek32",
            f'<{D}invoke name="search">\n<{D}parameter name="limit" string="false">many</{D}parameter>\n'
            f'<{D}parameter name="query">7</{D}parameter>\n</{D}invoke>',
        ),
        "",
        [("search", {"limit": "many", "query": "7"})],
    ),
    (
        "deepseek_v4",
        f'<{D}tool_calls>\n<{D}invoke name="search">\n<{D}parameter name="query" string="true">cut sh',
        "",
        [("search", {"query": "cut sh"})],
    ),
    ("deepseek_v4", dsml("deepseek32", dsml_invoke("noop", {})), dsml("deepseek32", dsml_invoke("noop", {})), []),
    ("deepseek32", dsml("deepseek_v4", dsml_invoke("noop", {})), dsml("deepseek_v4", dsml_invoke("noop", {})), []),
    (
        "deepseek32",
        f'<{D}function_calls>\n<{D}invoke name="">x</{D}invoke>',
        f'<{D}function_calls>\n<{D}invoke name="">x</{D}invoke>',
        [],
    ),
    ("deepseek32", f"<{D}function_calls>not a call", f"<{D}function_calls>not a call", []),
    ("deepseek_v4", "x <｜DSML｜tool_ca", "x <｜DSML｜tool_ca", []),
    # kimi_k3 (XTML)
    (
        "kimi_k3",
        "Sure." + K3_WRAPPERS[1] + k3(k3_call("get_weather", 1, PARIS), k3_call("noop", 2, {})) + K3_WRAPPERS[2],
        "Sure.",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("kimi_k3", k3(k3_call("search", 1, QUERY)), "", [("search", QUERY)]),
    (
        "kimi_k3",
        k3(
            f'{XO}call tool="search" index="1"{XS}{XO}json type="object"{XS}{json.dumps(QUERY)}{XC}json{XS}{XC}call{XS}'
        ),
        "",
        [("search", QUERY)],
    ),
    (
        "kimi_k3",
        k3(
            f'{XO}call tool="a&amp;b&quot;c" index="1"{XS}{XO}argument key="k&amp;q"{XS}v{XC}argument{XS}'
            f'{XO}argument key="n" type="number"{XS}not-json{XC}argument{XS}{XC}call{XS}'
        ),
        "",
        [('a&b"c', {"k&q": "v", "n": "not-json"})],
    ),
    (
        "kimi_k3",
        K3T + f'{XO}call tool="search" index="1"{XS}{XO}argument key="query" type="string"{XS}par',
        "",
        [("search", {"query": "par"})],
    ),
    ("kimi_k3", k3(f"{XO}call{XS}{XC}call{XS}"), k3(f"{XO}call{XS}{XC}call{XS}"), []),
    ("kimi_k3", K3T + "not a call", K3T + "not a call", []),
    # An opening tag longer than any a template writes is not one.
    (
        "kimi_k3",
        k3(f'{XO}call tool="{"a" * 600}"{XS}{XC}call{XS}'),
        k3(f'{XO}call tool="{"a" * 600}"{XS}{XC}call{XS}'),
        [],
    ),
    ("kimi_k3", "x <|open|>too", "x <|open|>too", []),
    # cohere
    (
        "cohere",
        "Checking." + cohere_action([("get_weather", PARIS), ("noop", {})]),
        "Checking.",
        [("get_weather", PARIS), ("noop", {})],
    ),
    ("cohere", cohere_action([("search", QUERY)]) + "\nAfter.", "After.", [("search", QUERY)]),
    ("cohere", CA + '{"tool_name": "noop"}' + CAE, "", [("noop", {})]),
    ("cohere", CA + '{"name": "search", "arguments": {"query": "x"}}' + CAE, "", [("search", {"query": "x"})]),
    ("cohere", CA + '[{"tool_name": "search", "parameters": {"query": "cu', "", [("search", {"query": "cu"})]),
    ("cohere", CA + '{"tool_name": invalid}' + CAE, CA + '{"tool_name": invalid}' + CAE, []),
    ("cohere", CA + "I will search." + CAE, CA + "I will search." + CAE, []),
    ("cohere", "a <|START_ACT", "a <|START_ACT", []),
    # passthrough
    ("passthrough", qwen_call("noop", {}), qwen_call("noop", {}), []),
]

PARSERS = sorted({name for name, *_ in CASES})
IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(CASES)]


def test_every_registered_format_has_cases() -> None:
    from tests.pipeline.parsers import test_tool_parsers_more

    assert set(TOOL_PARSERS) - {"qwen_coder", "nemotron"} == set(PARSERS) | set(test_tool_parsers_more.PARSERS)


@pytest.mark.parametrize(("name", "output", "text", "calls"), CASES, ids=IDS)
def test_output_in_one_piece(name: str, output: str, text: str, calls: list[Call]) -> None:
    assert result(run(name, [output])) == (text, calls)


@pytest.mark.parametrize(("name", "output", "text", "calls"), CASES, ids=IDS)
def test_output_split_at_every_character(name: str, output: str, text: str, calls: list[Call]) -> None:
    assert result(run(name, list(output))) == (text, calls)


@pytest.mark.parametrize(("name", "output", "text", "calls"), CASES, ids=IDS)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_output_in_random_chunks(name: str, output: str, text: str, calls: list[Call], data: st.DataObject) -> None:
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=12))
    assert result(run(name, chunked(output, cuts))) == (text, calls)


NO_CALL = [(name, output) for name, output, _, calls in CASES if not calls]


@pytest.mark.parametrize(("name", "output"), NO_CALL, ids=[f"{n}-{i}" for i, (n, _) in enumerate(NO_CALL)])
def test_output_that_never_became_a_call_is_text_verbatim(name: str, output: str) -> None:
    # Malformed calls, unclosed tags, marker prefixes: held text comes out at the end (smg#2271).
    for chunks in ([output], list(output)):
        pieces = run(name, chunks)
        assert all(isinstance(p, Text) for p in pieces)
        assert "".join(p.text for p in pieces if isinstance(p, Text)) == output


@pytest.mark.parametrize("name", PARSERS)
def test_tool_use_ids(name: str) -> None:
    outputs = [o for n, o, _, calls in CASES if n == name and calls]
    for output in outputs:
        ids = [p.id for p in run(name, [output]) if isinstance(p, ToolCall)]
        if name == "kimik2":
            assert all(re.fullmatch(r"functions\.\w+:\d+", i) for i in ids)
        else:
            assert all(re.fullmatch(r"toolu_[0-9a-f]{24}", i) for i in ids)
        assert len(set(ids)) == len(ids)


def test_kimi_ids_are_kept() -> None:
    out = run("kimik2", [KS + kimi_call("get_weather", 0, PARIS) + kimi_call("noop", 1, {}) + KE])
    assert [(p.id, p.name) for p in out if isinstance(p, ToolCall)] == [
        ("functions.get_weather:0", "get_weather"),
        ("functions.noop:1", "noop"),
    ]


def test_ids_can_come_from_the_caller() -> None:
    parser = make_tool_parser("qwen", TOOLS, new_id=lambda i: f"toolu_{i:024x}")
    out = parser.feed([Text(qwen_call("noop", {}) + qwen_call("noop", {}))]) + parser.flush()
    assert [p.id for p in out if isinstance(p, ToolCall)] == ["toolu_" + "0" * 24, "toolu_" + "0" * 23 + "1"]


# --- malformed output: nothing lost --------------------------------------------------------------

# (parser, output, syntax the parser consumes) for outputs that break after a call opened.
BROKEN: list[tuple[str, str, list[str]]] = [
    (
        "qwen",
        f'{QC}\n{{"name": "search", "arguments": {{"query": "x", "limit": }}}}\n{QE} tail',
        [QC, QE, '{"name": "', '", "arguments": '],
    ),
    (
        "qwen",
        f'{QC}\n{{"name": "search", "arguments": {{"limit": 1,}}}}\n{QE}',
        [QC, QE, '{"name": "', '", "arguments": '],
    ),
    (
        "qwen",
        f'{QC}\n{{"name": "noop", "arguments": {{}}}} trailing words\n{QE}\nthen',
        [QC, QE, '{"name": "noop", "arguments": {}}'],
    ),
    ("json", '{"name": "search", "arguments": {"query": "x"} oops} after', ['{"name": "', '", "arguments": ']),
    (
        "deepseek31",
        DS["calls"] + DS["call"] + "search" + DS["sep"] + '{"query": "x",, }' + DS["call_end"] + "more",
        list(DS.values()),
    ),
    (
        "kimik2",
        KS + f'{KC}functions.search:0{KA}{{"limit": 2 3}}{KCE}' + KE + " end",
        [KS, KE, KC, KA, KCE, "functions.", ":0"],
    ),
    ("qwen_xml", f"{QC}\n<function=noop>\nstray words\n</function>\n{QE}", [QC, QE, "<function=", ">"]),
    ("qwen_xml", f"{QC}\n<function=search>\n<parameter=>x</parameter>\n</function>\n{QE}", [QC, QE, "<function=", ">"]),
    ("glm45_moe", f"{QC}noop\nstray words{QE}", [QC, QE]),
    ("glm45_moe", f"{QC}search\n<arg_key>query</arg_key> no value{QE}", [QC, QE]),
    ("minimax_m2", f'{MM}<invoke name="noop">stray words</invoke>{MME}', [MM, MME, '<invoke name="', '">']),
    (
        "minimax_m2",
        f'{MM}<invoke name="noop"><parameter id="1">v</parameter></invoke>{MME}',
        [MM, MME, '<invoke name="', '">'],
    ),
    ("pythonic", "[noop(), get_weather(1)] done", ["[", "(", ")"]),
    (
        "deepseek32",
        dsml("deepseek32", f'<{D}invoke name="noop">\nstray words\n</{D}invoke>'),
        [f"<{D}function_calls>", f"</{D}function_calls>", f'<{D}invoke name="', '">'],
    ),
    (
        "deepseek_v4",
        dsml("deepseek_v4", f'<{D}invoke name="search">\n{{"query": "x",, }}\n</{D}invoke>') + " end",
        [f"<{D}tool_calls>", f"</{D}tool_calls>", f'<{D}invoke name="', '">', f"</{D}invoke>"],
    ),
    (
        "kimi_k3",
        k3(f'{XO}call tool="noop" index="1"{XS}stray words{XC}call{XS}'),
        [K3T, K3TE, f'{XO}call tool="', f'" index="1"{XS}'],
    ),
    (
        "cohere",
        CA + '[{"tool_name": "search", "parameters": {"limit": 2 3}}]' + CAE + " end",
        [CA, CAE, '[{"tool_name": "', '", "parameters": '],
    ),
]


@pytest.mark.parametrize(("name", "output", "syntax"), BROKEN, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(BROKEN)])
def test_broken_calls_keep_every_character(name: str, output: str, syntax: list[str]) -> None:
    one = run(name, [output])
    each = run(name, list(output))
    assert result(one) == result(each)
    assert result(one)[1], "a call opened"
    content = output
    for token in syntax:
        content = content.replace(token, " ")
    assert is_subsequence(nonspace(content), nonspace(rendered(each)))


# --- streaming behaviour -------------------------------------------------------------------------


def feed_each(name: str, chunks: Sequence[str]) -> list[list[Piece]]:
    parser = make_tool_parser(name, TOOLS)
    return [parser.feed([Text(c)]) for c in chunks] + [parser.flush()]


def test_only_a_possible_marker_is_held() -> None:
    steps = feed_each("qwen", ["Hello <tool", "box> and more"])
    assert steps[0] == [Text("Hello ")]
    assert steps[1] == [Text("<toolbox> and more")]
    assert steps[2] == []


def test_text_goes_out_before_a_call_completes() -> None:
    output = "Let me check. " + qwen_call("search", {"query": "long text here"})
    steps = feed_each("qwen", list(output))
    first_call = next(i for i, step in enumerate(steps) if any(isinstance(p, ToolCall) for p in step))
    assert "".join(p.text for step in steps[:first_call] for p in step if isinstance(p, Text)) == "Let me check. "
    # The call opens once its arguments begin, and they stream in several fragments.
    assert output[: first_call + 1].endswith('"arguments": {')
    fragments = [p for step in steps for p in step if isinstance(p, ToolArgs)]
    assert len(fragments) > 5


@pytest.mark.parametrize(
    ("name", "output"),
    [
        ("qwen", qwen_call("search", {"query": "stream me please"})),
        ("deepseek31", DS["calls"] + ds31_call("search", {"query": "stream me please"})),
        ("kimik2", KS + kimi_call("search", 0, {"query": "stream me please"})),
        ("qwen_xml", xml_call("search", {"query": "stream me please"})),
        ("glm47_moe", glm_call("search", {"query": "stream me please"}, newlines=False)),
        ("deepseek32", dsml("deepseek32", dsml_invoke("search", {"query": "stream me please"}))),
        ("deepseek_v4", dsml("deepseek_v4", f'<{D}invoke name="search">{{"query": "stream me please"}}</{D}invoke>')),
        ("kimi_k3", k3(k3_call("search", 1, {"query": "stream me please"}))),
        ("cohere", cohere_action([("search", {"query": "stream me please"})])),
    ],
)
def test_arguments_stream_and_every_prefix_stays_closable(name: str, output: str) -> None:
    steps = feed_each(name, list(output))
    args = [p.fragment for step in steps for p in step if isinstance(p, ToolArgs)]
    assert len(args) > 5
    assert json.loads("".join(args)) == {"query": "stream me please"}
    # Cut off anywhere, the arguments sent so far are still completed by the flush.
    for cut in range(len(output)):
        assert result(run(name, [output[:cut]]))  # never raises; every call's JSON parses


def test_whitespace_around_calls_is_dropped_and_later_text_kept() -> None:
    output = "  \n" + qwen_call("noop", {}) + "\n\n" + qwen_call("noop", {}) + "\n  Done.\n"
    assert result(run("qwen", list(output))) == ("Done.\n", [("noop", {}), ("noop", {})])
    assert result(run("qwen", ["\n\n  "])) == ("\n\n  ", [])


def test_other_pieces_pass_through() -> None:
    parser = make_tool_parser("qwen", TOOLS)
    out = parser.feed([Thinking("hmm"), Text("Hi <tool"), Thinking("more")])
    assert out == [Thinking("hmm"), Text("Hi "), Thinking("more")]
    assert parser.flush() == [Text("<tool")]


def test_a_call_cut_short_by_the_end_of_output() -> None:
    output = f'{QC}\n{{"name": "search", "arguments": {{"query": "abc", "filters": {{"lang": ["en'
    assert result(run("qwen", [output])) == ("", [("search", {"query": "abc", "filters": {"lang": ["en"]}})])


def test_raw_control_characters_and_bad_escapes_in_strings_are_repaired() -> None:
    output = f'{QC}\n{{"name": "search", "arguments": {{"query": "line1\nline2\tC:\\Users"}}}}\n{QE}'
    assert result(run("qwen", list(output))) == ("", [("search", {"query": "line1\nline2\tC:\\Users"})])


def test_qwen_xml_string_values_stream_and_keep_their_text() -> None:
    value = "first line\n\n    indented <b>&amp;</b>\n"
    output = xml_call("search", {"query": value, "limit": "3"})
    steps = feed_each("qwen_xml", list(output))
    args = [p.fragment for step in steps for p in step if isinstance(p, ToolArgs)]
    assert json.loads("".join(args)) == {"query": value, "limit": 3}
    assert len(args) > len(value) // 2  # streamed, not sent whole


def test_schema_types_decide_coercion() -> None:
    tools = [fn("f", s="string", i="integer", n="number", b="boolean", o="object", a="array")]
    params = {"s": "007", "i": "007", "n": "-1.5e3", "b": "False", "o": '{"k": null}', "a": "[true]", "u": "007"}
    expected = {"s": "007", "i": 7, "n": -1500.0, "b": False, "o": {"k": None}, "a": [True], "u": "007"}
    assert result(run("qwen_xml", [xml_call("f", params)], tools)) == ("", [("f", expected)])
    # Without a schema: JSON, then Python literals, else the string.
    untyped = {"s": "007", "i": "7", "b": "False", "o": '{"k": null}', "x": "not json"}
    assert result(run("qwen_xml", [xml_call("f", untyped)], [])) == (
        "",
        [("f", {"s": "007", "i": 7, "b": False, "o": {"k": None}, "x": "not json"})],
    )
    # A value that does not fit its declared type is inferred.
    assert result(run("glm47_moe", [glm_call("f", {"i": "many"}, newlines=False)], tools)) == (
        "",
        [("f", {"i": "many"})],
    )


def test_bare_json_accepts_any_name_without_declared_tools() -> None:
    assert result(run("json", ['{"name": "anything", "arguments": {"a": 1}}'], None)) == ("", [("anything", {"a": 1})])


# --- fuzzing: random outputs built from each format's pieces ---------------------------------------

FRAGMENTS: dict[str, list[str]] = {
    "qwen": [QC, QE, "\n", '{"name": "noop", "arguments": {', '"a": 1', "}}", "}", '"', "{", ",", "Hi", " "],
    "qwen_xml": [QC, QE, "<function=noop>", "</function>", "<parameter=a>", "</parameter>", "\n", "1", "x", "<", " "],
    "json": ['{"name": "noop", "parameters": {', '"a": [1, "x"]', "}", "}}", "[", "]", ",", "{", "text", " "],
    "llama": ["<|python_tag|>", '{"name": "noop", "parameters": {', '"a": 1', "}}", ";", " ", "hi", "{"],
    "mistral": ["[TOOL_CALLS]", " [", '{"name": "noop", "arguments": {', "}}", "]", ",", "noop", "[ARGS]", "{}", "x"],
    "pythonic": ["[", "]", "noop(", "a=1", ")", ", ", "'s)'", "x", "<|python_start|>", "<|python_end|>"],
    "deepseek": [DS["calls"], DS["call"], "function", DS["sep"], "noop\n```json\n", "{}", "\n```", DS["call_end"], "x"],
    "deepseek31": [DS["calls"], DS["calls_end"], DS["call"], "noop", DS["sep"], '{"a": ', "1}", DS["call_end"], "x"],
    "glm45_moe": [QC, QE, "noop", "\n", "<arg_key>a</arg_key>", "<arg_value>1</arg_value>", "x", "<"],
    "glm47_moe": [QC, QE, "noop", "<arg_key>a</arg_key>", "<arg_value>", "</arg_value>", "b c", " "],
    "kimik2": [KS, KE, KC, "functions.noop:0", KA, '{"a": 1', "}", KCE, "x", " "],
    "minimax_m2": [MM, MME, '<invoke name="noop">', "</invoke>", '<parameter name="a">', "</parameter>", "1", "x"],
    "deepseek32": [
        f"<{D}function_calls>",
        f"</{D}function_calls>",
        f'<{D}invoke name="noop">',
        f"</{D}invoke>",
        f'<{D}parameter name="a" string="true">',
        f'<{D}parameter name="b" string="false">',
        f"</{D}parameter>",
        "1",
        "{",
        "}",
        "x",
    ],
    "deepseek_v4": [
        f"<{D}tool_calls>",
        f"</{D}tool_calls>",
        f'<{D}invoke name="noop">',
        f"</{D}invoke>",
        f'<{D}parameter name="a" string="true">',
        f"</{D}parameter>",
        '{"a": 1}',
        "x",
    ],
    "kimi_k3": [
        K3T,
        K3TE,
        f'{XO}call tool="noop" index="1"{XS}',
        f"{XC}call{XS}",
        f'{XO}argument key="a" type="string"{XS}',
        f'{XO}argument key="b" type="number"{XS}',
        f"{XC}argument{XS}",
        f'{XO}json type="object"{XS}',
        f"{XC}json{XS}",
        *K3_WRAPPERS,
        "1",
        "{}",
        "x",
    ],
    "cohere": [
        CA,
        CAE,
        "[",
        "]",
        '{"tool_name": "noop", "parameters": {',
        '"a": 1',
        "}}",
        ",",
        *COHERE_WRAPPERS,
        "x",
        " ",
    ],
    "passthrough": [QC, "x", " "],
}


def outputs(name: str) -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(FRAGMENTS[name]), st.text(alphabet='ab <>{}[]"\\\n', max_size=3))
    return st.lists(pieces, max_size=14).map("".join)


# The channel wrappers a format drops from its text.
WRAPPERS = {"kimi_k3": K3_WRAPPERS, "cohere": COHERE_WRAPPERS}


def unwrapped(name: str, text: str) -> str:
    wrappers = WRAPPERS.get(name)
    return re.sub("|".join(map(re.escape, wrappers)), "", text) if wrappers else text


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_outputs_parse_the_same_however_cut(name: str, data: st.DataObject) -> None:
    output = data.draw(outputs(name))
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=len(output)))
    one = run(name, [output])
    whole = result(one)  # also: every call's arguments are one JSON object
    assert result(run(name, chunked(output, cuts))) == whole
    assert result(run(name, list(output))) == whole
    if not whole[1]:
        assert whole[0] == unwrapped(name, output)  # no call: the text is the output, exactly
    assert all(isinstance(p, (Text, ToolCall, ToolArgs)) for p in one)


# --- generated calls: any arguments survive any chunking ---------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,5}", fullmatch=True).filter(
    lambda k: k not in {"if", "in", "is", "or", "as", "def", "for", "and", "not", "del", "try"}
)
names = st.sampled_from(["get_weather", "search", "noop"])
prose = st.text(alphabet="ab .,!\n", max_size=6)


def _json_output(name: str, calls: list[Call]) -> str:
    if name == "qwen":
        return "\n".join(qwen_call(n, a) for n, a in calls)
    if name == "json":
        return json.dumps([{"name": n, "parameters": a} for n, a in calls])
    if name == "llama":
        return "<|python_tag|>" + "; ".join(json.dumps({"name": n, "parameters": a}) for n, a in calls)
    if name == "mistral":
        return "[TOOL_CALLS] " + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if name == "deepseek":
        return DS["calls"] + "\n".join(ds3_call(n, a) for n, a in calls) + DS["calls_end"]
    if name == "deepseek31":
        return DS["calls"] + "".join(ds31_call(n, a) for n, a in calls) + DS["calls_end"]
    if name == "kimik2":
        return KS + "".join(kimi_call(n, i, a) for i, (n, a) in enumerate(calls)) + KE
    if name == "cohere":
        return cohere_action(calls)
    assert name == "pythonic"
    return "[" + ", ".join(f"{n}(" + ", ".join(f"{k}={v!r}" for k, v in a.items()) + ")" for n, a in calls) + "]"


@pytest.mark.parametrize(
    "name", ["qwen", "json", "llama", "mistral", "deepseek", "deepseek31", "kimik2", "cohere", "pythonic"]
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_json_calls(name: str, data: st.DataObject) -> None:
    keys = identifiers if name == "pythonic" else st.text(max_size=6)
    calls = data.draw(
        st.lists(st.tuples(names, st.dictionaries(keys, json_values, max_size=4)), min_size=1, max_size=3)
    )
    before = data.draw(prose)
    output = before + _json_output(name, calls) + data.draw(st.sampled_from(["", "\n", " "]))
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=20))
    expected = (before if before.strip() else "", calls)
    assert result(run(name, chunked(output, cuts))) == expected


_values = st.text(alphabet=st.characters(exclude_characters="<"), max_size=12)


@pytest.mark.parametrize(
    "name", ["qwen_xml", "glm45_moe", "glm47_moe", "minimax_m2", "deepseek32", "deepseek_v4", "kimi_k3"]
)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_xml_calls(name: str, data: st.DataObject) -> None:
    count = data.draw(st.integers(1, 3))
    params = [(data.draw(_values), data.draw(st.integers(-99, 99))) for _ in range(count)]
    if name in DSML_BLOCK:
        body = dsml(name, *(dsml_invoke("search", {"query": q, "limit": n}) for q, n in params))
    elif name == "kimi_k3":
        body = k3(*(k3_call("search", i + 1, {"query": q, "limit": n}) for i, (q, n) in enumerate(params)))
    elif name == "qwen_xml":
        body = "".join(xml_call("search", {"query": q, "limit": str(n)}) for q, n in params)
    elif name == "minimax_m2":
        invokes = [
            mm_invoke("search", {"query": q.replace("&", "&amp;").replace(">", "&gt;"), "limit": str(n)})
            for q, n in params
        ]
        body = MM + "".join(invokes) + MME
    else:
        newlines = name == "glm45_moe"
        body = "".join(glm_call("search", {"query": q, "limit": str(n)}, newlines=newlines) for q, n in params)
    before = data.draw(prose)
    output = before + body
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=20))
    # qwen_xml writes the template's newlines around a value, and DSML and XTML write values
    # verbatim; the others write it bare, so a newline the value itself starts or ends with is
    # taken for the template's.
    query = (lambda q: q) if name in ("qwen_xml", "deepseek32", "deepseek_v4", "kimi_k3") else strip_newlines
    expected = [("search", {"query": query(q), "limit": n}) for q, n in params]
    assert result(run(name, chunked(output, cuts))) == (before if before.strip() else "", expected)


@pytest.mark.parametrize("name", ["glm45_moe", "glm47_moe"])
def test_a_crlf_before_the_closing_tag_is_the_templates_whole(name: str) -> None:
    output = glm_call("search", {"query": "0\r\n", "limit": "0"}, newlines=False)
    for cuts in ([], list(range(len(output)))):
        assert result(run(name, chunked(output, cuts))) == ("", [("search", {"query": "0", "limit": 0})])
