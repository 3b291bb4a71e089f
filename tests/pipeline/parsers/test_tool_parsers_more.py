"""The `sarashina`, `step3` and `inkling` tool-call parsers, with the same tables and properties as
the other families (test_tool_parsers.py): streamed and not, every split point, malformed output
stays text, multiple calls, ids; and their constrained decoding and selection (behaviors.md
§C.2, §D.2, §F.3, §F.7, §F.8)."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg.pipeline.constraints import tool_constraint
from smg.pipeline.generation import Generation, GenerationSettings, Piece, Text, ToolArgs, ToolCall
from smg.pipeline.ids import tool_use_id
from smg.pipeline.output import build_stages
from smg.pipeline.parsers.tools import TOOL_PARSERS, detect_tool_parser, has_tool_parser, make_tool_parser
from smg.pipeline.parsers.tools.inkling import InklingParser
from smg.pipeline.parsers.tools.pyliteral import PyLiteralJson
from smg.pipeline.parsers.tools.sarashina import SarashinaParser
from smg.pipeline.parsers.tools.step3 import Step3Parser
from smg.pipeline.parsers.tools.values import strip_newlines
from tests.pipeline import _toy
from tests.pipeline.parsers.test_tool_generation import WEATHER, content, generate
from tests.pipeline.parsers.test_tool_parsers import (
    PARIS,
    QUERY,
    TOOLS,
    Call,
    chunked,
    fn,
    is_subsequence,
    json_values,
    names,
    nonspace,
    prose,
    rendered,
    result,
    run,
)
from tests.pipeline.test_output import USER
from tests.pipeline.test_output import WEATHER as PLAN_TOOL
from tests.pipeline.test_output import _plan as output_plan

# --- the formats -------------------------------------------------------------------------------

SR = "<|tool_calls|>"
S3 = {
    "calls": "<｜tool_calls_begin｜>",
    "calls_end": "<｜tool_calls_end｜>",
    "call": "<｜tool_call_begin｜>",
    "call_end": "<｜tool_call_end｜>",
    "sep": "<｜tool_sep｜>",
}
MM, TJ, CT, CTH, EM, ES = (
    "<|message_model|>",
    "<|content_invoke_tool_json|>",
    "<|content_text|>",
    "<|content_thinking|>",
    "<|end_message|>",
    "<|content_model_end_sampling|>",
)


def sarashina_calls(calls: list[Call]) -> str:
    """The calls as the model writes them: the Python repr of the list."""
    return repr([{"name": name, "arguments": args} for name, args in calls])


def step3_call(name: str, params: dict[str, str]) -> str:
    body = "".join(f'<steptml:parameter name="{k}">{v}</steptml:parameter>\n' for k, v in params.items())
    return f'{S3["call"]}function{S3["sep"]}<steptml:invoke name="{name}">\n{body}</steptml:invoke>{S3["call_end"]}'


def step3_block(*calls: str) -> str:
    return S3["calls"] + "\n".join(calls) + "\n" + S3["calls_end"]


def inkling_call(name: str, args: dict[str, Any], header: bool = True) -> str:
    return (MM + name if header else "") + TJ + json.dumps({"name": name, "args": args}) + EM


def inkling_text(text: str) -> str:
    return MM + CT + text + EM


# (parser, model output, expected text, expected calls)
CASES: list[tuple[str, str, str, list[Call]]] = [
    # sarashina
    ("sarashina", SR + sarashina_calls([("get_weather", PARIS)]), "", [("get_weather", PARIS)]),
    ("sarashina", sarashina_calls([("get_weather", PARIS)]), "", [("get_weather", PARIS)]),
    (
        "sarashina",
        "Let me check." + SR + sarashina_calls([("get_weather", PARIS), ("search", QUERY)]),
        "Let me check.",
        [("get_weather", PARIS), ("search", QUERY)],
    ),
    (
        "sarashina",
        "\n  " + sarashina_calls([("noop", {}), ("search", QUERY)]) + "\nDone.",
        "Done.",
        [("noop", {}), ("search", QUERY)],
    ),
    (
        "sarashina",
        "[{'name': 'search', 'arguments': {'query': 'it\\'s [done] \"q\"', 'filters': {'a': True, 'b': None},"
        " 'tags': ('x', 'y',), 'score': -1.5e3,},}]",
        "",
        [
            (
                "search",
                {"query": 'it\'s [done] "q"', "filters": {"a": True, "b": None}, "tags": ["x", "y"], "score": -1500},
            )
        ],
    ),
    (
        "sarashina",
        '<|tool_calls|>{"name": "search", "arguments": {"query": "json", "limit": 2}}',
        "",
        [("search", {"query": "json", "limit": 2})],
    ),
    ("sarashina", SR + "[{'name': 'unknown_tool', 'arguments': {'a': [1]}}]", "", [("unknown_tool", {"a": [1]})]),
    ("sarashina", SR + "[{'name': 'noop'}]", "", [("noop", {})]),
    ("sarashina", SR + "[{'name': 'search', 'arguments': {'query': 'cut sh", "", [("search", {"query": "cut sh"})]),
    ("sarashina", "[1, 2, 3]", "[1, 2, 3]", []),
    ("sarashina", "[{'name': 'Bob', 'age': 3}]", "[{'name': 'Bob', 'age': 3}]", []),
    ("sarashina", "[{'name': 'undeclared', 'arguments': {}}]", "[{'name': 'undeclared', 'arguments': {}}]", []),
    (
        "sarashina",
        "See [{'name': 'noop', 'arguments': {}}] here.",
        "See [{'name': 'noop', 'arguments': {}}] here.",
        [],
    ),
    ("sarashina", SR + "[{'name': 'x'", SR + "[{'name': 'x'", []),
    ("sarashina", SR + " I cannot.", SR + " I cannot.", []),
    ("sarashina", "a <|tool_ca", "a <|tool_ca", []),
    ("sarashina", "[ ", "[ ", []),
    # step3
    (
        "step3",
        "Let me check."
        + step3_block(step3_call("get_weather", {"city": "Paris", "days": "3"}), step3_call("noop", {})),
        "Let me check.",
        [("get_weather", PARIS), ("noop", {})],
    ),
    (
        "step3",
        step3_block(
            step3_call(
                "search", {"query": "if a < b: print(a)", "limit": "7", "filters": '{"a": [1]}', "tags": '["x"]'}
            )
        )
        + "\nAfter.",
        "After.",
        [("search", {"query": "if a < b: print(a)", "limit": 7, "filters": {"a": [1]}, "tags": ["x"]})],
    ),
    (
        "step3",
        step3_block(step3_call("unknown", {"n": "12", "b": "True", "p": "None", "s": "hello world"})),
        "",
        [("unknown", {"n": 12, "b": True, "p": None, "s": "hello world"})],
    ),
    ("step3", step3_call("get_weather", {"city": "Paris", "days": "3"}), "", [("get_weather", PARIS)]),
    (
        "step3",
        S3["calls"]
        + S3["call"]
        + 'function<｜tool_sep｜><steptml:invoke name="search"><steptml:parameter name="query">cu',
        "",
        [("search", {"query": "cu"})],
    ),
    (
        "step3",
        S3["calls"]
        + S3["call"]
        + "code<｜tool_sep｜>"
        + '<steptml:invoke name="noop"></steptml:invoke>'
        + S3["call_end"],
        S3["calls"]
        + S3["call"]
        + "code<｜tool_sep｜>"
        + '<steptml:invoke name="noop"></steptml:invoke>'
        + S3["call_end"],
        [],
    ),
    (
        "step3",
        S3["calls"] + S3["call"] + "function<｜tool_sep｜><invoke>x</invoke>",
        S3["calls"] + S3["call"] + "function<｜tool_sep｜><invoke>x</invoke>",
        [],
    ),
    ("step3", S3["calls"] + S3["calls_end"], S3["calls"] + S3["calls_end"], []),
    ("step3", "x <｜tool_ca", "x <｜tool_ca", []),
    # inkling
    (
        "inkling",
        inkling_text("I'll check.") + inkling_call("search", QUERY) + inkling_call("get_weather", PARIS) + ES,
        "I'll check.",
        [("search", QUERY), ("get_weather", PARIS)],
    ),
    ("inkling", inkling_call("noop", {}, header=False), "", [("noop", {})]),
    (
        "inkling",
        inkling_call("search", {"query": "Rust {lang}"}) + CT + "After" + ES,
        "After",
        [("search", {"query": "Rust {lang}"})],
    ),
    (
        "inkling",
        MM + CTH + "check sources" + EM + inkling_text("Here.") + inkling_call("noop", {}),
        "check sourcesHere.",
        [("noop", {})],
    ),
    ("inkling", TJ + '{"name": "unknown_tool", "arguments": {"a": 1}}' + EM, "", [("unknown_tool", {"a": 1})]),
    ("inkling", MM + "search" + TJ + '{"name": "search", "args": {"query": "cu', "", [("search", {"query": "cu"})]),
    ("inkling", inkling_text("Plain answer.") + ES, "Plain answer.", []),
    ("inkling", TJ + "not-json" + EM + "After.", TJ + "not-json" + "After.", []),
    ("inkling", MM + "search" + TJ + '{"name": "sea', MM + "search" + TJ + '{"name": "sea', []),
    (
        "inkling",
        "<|content_invoke_tool_text|>search for the weather" + EM,
        "<|content_invoke_tool_text|>search for the weather",
        [],
    ),
    ("inkling", "Use <|message_mod", "Use <|message_mod", []),
]

PARSERS = sorted({name for name, *_ in CASES})
IDS = [f"{name}-{i}" for i, (name, *_) in enumerate(CASES)]


def test_the_families_here_have_cases() -> None:
    assert PARSERS == ["inkling", "sarashina", "step3"]
    assert (TOOL_PARSERS["sarashina"], TOOL_PARSERS["step3"], TOOL_PARSERS["inkling"]) == (
        SarashinaParser,
        Step3Parser,
        InklingParser,
    )


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


# Inkling drops its message framing, so only its outputs without framing stay verbatim.
NO_CALL = [(name, output) for name, output, text, calls in CASES if not calls and text == output]


@pytest.mark.parametrize(("name", "output"), NO_CALL, ids=[f"{n}-{i}" for i, (n, _) in enumerate(NO_CALL)])
def test_output_that_never_became_a_call_is_text_verbatim(name: str, output: str) -> None:
    for chunks in ([output], list(output)):
        pieces = run(name, chunks)
        assert all(isinstance(p, Text) for p in pieces)
        assert "".join(p.text for p in pieces if isinstance(p, Text)) == output


@pytest.mark.parametrize("name", PARSERS)
def test_tool_use_ids_are_generated(name: str) -> None:
    for output in [o for n, o, _, calls in CASES if n == name and calls]:
        ids = [p.id for p in run(name, [output]) if isinstance(p, ToolCall)]
        assert all(re.fullmatch(r"toolu_[0-9a-f]{24}", i) for i in ids)
        assert len(set(ids)) == len(ids)
    parser = make_tool_parser(name, TOOLS, new_id=lambda i: f"toolu_{i:024x}")
    output = next(o for n, o, _, calls in CASES if n == name and len(calls) == 2)
    ids = [p.id for p in parser.feed([Text(output)]) + parser.flush() if isinstance(p, ToolCall)]
    assert ids == ["toolu_" + "0" * 24, "toolu_" + "0" * 23 + "1"]


# --- malformed output: nothing lost --------------------------------------------------------------

# (parser, output, syntax the parser consumes) for outputs that break after a call opened.
BROKEN: list[tuple[str, str, list[str]]] = [
    (
        "sarashina",
        SR + "[{'name': 'search', 'arguments': {'query': 'x', 'limit': }}] tail",
        [SR, "[{'name': '", "', 'arguments': ", "'", '"'],
    ),
    ("sarashina", "[{'name': 'noop', 'arguments': {}} trailing words] then", ["[{'name': 'noop', 'arguments': {}}"]),
    (
        "step3",
        step3_block(step3_call("noop", {}).replace("</steptml:invoke>", "stray words</steptml:invoke>")),
        [*S3.values(), "function", '<steptml:invoke name="', '">'],
    ),
    (
        "step3",
        step3_block(step3_call("search", {"query": "x"}).replace('name="query"', 'id="1"')),
        [*S3.values(), "function", '<steptml:invoke name="', '">'],
    ),
    (
        "inkling",
        TJ + '{"name": "search", "args": {"query": "x",, }}' + EM + "more",
        [TJ, EM, '{"name": "', '", "args": '],
    ),
]


@pytest.mark.parametrize(("name", "output", "syntax"), BROKEN, ids=[f"{n}-{i}" for i, (n, *_) in enumerate(BROKEN)])
def test_broken_calls_keep_every_character(name: str, output: str, syntax: list[str]) -> None:
    one = run(name, [output])
    each = run(name, list(output))
    assert result(one) == result(each)
    assert result(one)[1], "a call opened"
    content_ = output
    for token in syntax:
        content_ = content_.replace(token, " ")
    # Sarashina's literal is read as JSON: its quotes may change, nothing else.
    unquoted = str.maketrans("", "", "'\"")
    assert is_subsequence(nonspace(content_).translate(unquoted), nonspace(rendered(each)).translate(unquoted))


# --- streaming behaviour -------------------------------------------------------------------------


def feed_each(name: str, chunks: Sequence[str]) -> list[list[Piece]]:
    parser = make_tool_parser(name, TOOLS)
    return [parser.feed([Text(c)]) for c in chunks] + [parser.flush()]


STREAMED = [
    ("sarashina", "Let me see. ", SR + sarashina_calls([("search", {"query": "stream me please"})]), "'arguments': {"),
    ("sarashina", "\n", sarashina_calls([("search", {"query": "stream me please"})]), "'arguments': {"),
    ("step3", "Let me see. ", step3_block(step3_call("search", {"query": "stream me please"})), 'name="search">'),
    ("inkling", "Let me see. ", inkling_call("search", {"query": "stream me please"}), '"args": {'),
]


@pytest.mark.parametrize(("name", "before", "body", "opens_after"), STREAMED, ids=[s[0] for s in STREAMED])
def test_text_goes_out_first_a_call_opens_once_named_and_arguments_stream(
    name: str, before: str, body: str, opens_after: str
) -> None:
    output = before + body
    steps = feed_each(name, list(output))
    first_call = next(i for i, step in enumerate(steps) if any(isinstance(p, ToolCall) for p in step))
    text = "".join(p.text for step in steps[:first_call] for p in step if isinstance(p, Text))
    assert text == (before if before.strip() else "")
    assert output[: first_call + 1].endswith(opens_after)
    args = [p.fragment for step in steps for p in step if isinstance(p, ToolArgs)]
    assert len(args) > 5
    assert json.loads("".join(args)) == {"query": "stream me please"}
    # Cut off anywhere, the arguments sent so far are still completed by the flush.
    for cut in range(len(output)):
        assert result(run(name, [output[:cut]]))  # never raises; every call's JSON parses


def test_only_a_possible_marker_is_held() -> None:
    assert feed_each("sarashina", ["Hello <|tool", "s|> and [more]"]) == [
        [Text("Hello ")],
        [Text("<|tools|> and [more]")],
        [],
    ]
    assert feed_each("step3", ["Hi <｜tool", "box"]) == [[Text("Hi ")], [Text("<｜toolbox")], []]
    assert feed_each("inkling", ["Hi <|content", "_image|>"]) == [[Text("Hi ")], [Text("<|content_image|>")], []]
    # A bare list is only looked for at the start: anywhere else `[` is text at once.
    assert feed_each("sarashina", ["Hi [", "{"]) == [[Text("Hi [")], [Text("{")], []]


def test_step3_string_values_stream_and_keep_their_text() -> None:
    value = "first line\n\n    indented <b>&amp;</b>"
    steps = feed_each("step3", list(step3_block(step3_call("search", {"query": value, "limit": "3"}))))
    args = [p.fragment for step in steps for p in step if isinstance(p, ToolArgs)]
    assert json.loads("".join(args)) == {"query": value, "limit": 3}
    assert len(args) > len(value) // 2  # streamed, not sent whole


def test_step3_values_follow_the_schema() -> None:
    tools = [fn("f", s="string", i="integer", b="boolean", o="object")]
    output = step3_block(step3_call("f", {"s": "007", "i": "007", "b": "False", "o": '{"k": null}', "u": "007"}))
    assert result(run("step3", [output], tools)) == (
        "",
        [("f", {"s": "007", "i": 7, "b": False, "o": {"k": None}, "u": "007"})],
    )


def test_sarashina_without_declared_tools_accepts_any_bare_name() -> None:
    output = "[{'name': 'anything', 'arguments': {'a': 1}}]"
    assert result(run("sarashina", [output], None)) == ("", [("anything", {"a": 1})])


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("{'a': 'x\\ny\\t\\\\z'}", {"a": "x\ny\t\\z"}),
        ("{'a': '\\x41\\u00e9\\U0001F600\\101\\0'}", {"a": "Aé😀A\0"}),
        ("{'a': 'C:\\Users\\q \\xZZ'}", {"a": "C:\\Users\\q \\xZZ"}),
        ("{'a': \"it's\", 'b': '\"q\"'}", {"a": "it's", "b": '"q"'}),
        (
            "{'a': (1,), 'b': [], 'c': {}, 'd': [True, False, None, true, null]}",
            {"a": [1], "b": [], "c": {}, "d": [True, False, None, True, None]},
        ),
        ("{'a': 1e5, 'b': -0.25, 'c': [1 , 2 ,  ]}", {"a": 100000.0, "b": -0.25, "c": [1, 2]}),
    ],
)
def test_python_literals_read_as_json(literal: str, value: dict[str, Any]) -> None:
    reader = PyLiteralJson()
    out = [reader.push(ch) for ch in literal]
    assert None not in out
    assert json.loads("".join(o for o in out if o is not None)) == value


@pytest.mark.parametrize("literal", ["{'a': Nope}", "{'a': b'x'}", "{'a': f(1)}", "{'a': x}"])
def test_what_is_no_python_literal_is_refused(literal: str) -> None:
    reader = PyLiteralJson()
    assert None in [reader.push(ch) for ch in literal]


# --- fuzzing: random outputs built from each format's pieces ---------------------------------------

FRAGMENTS: dict[str, list[str]] = {
    "sarashina": [SR, "[", "]", "{'name': 'noop', 'arguments': {", "'a': True", "}}", "}", "'", ",", "(", "x", " "],
    "step3": [
        S3["calls"],
        S3["calls_end"],
        S3["call"],
        S3["call_end"],
        "function" + S3["sep"],
        '<steptml:invoke name="noop">',
        "</steptml:invoke>",
        '<steptml:parameter name="a">',
        "</steptml:parameter>",
        "1",
        "x",
    ],
    "inkling": [MM, TJ, CT, CTH, EM, ES, "noop", '{"name": "noop", "args": {', '"a": 1', "}}", "}", "x", " "],
}


def outputs(name: str) -> st.SearchStrategy[str]:
    pieces = st.one_of(st.sampled_from(FRAGMENTS[name]), st.text(alphabet="ab <>{}[]'\"\\\n", max_size=3))
    return st.lists(pieces, max_size=14).map("".join)


@pytest.mark.parametrize("name", sorted(FRAGMENTS))
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_outputs_parse_the_same_however_cut(name: str, data: st.DataObject) -> None:
    output = data.draw(outputs(name))
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=len(output)))
    one = run(name, [output])
    whole = result(one)  # also: every call's arguments are one JSON object
    assert result(run(name, chunked(output, cuts))) == whole
    assert result(run(name, list(output))) == whole
    if not whole[1] and name != "inkling":
        assert whole[0] == output  # no call: the text is the output, exactly
    assert all(isinstance(p, (Text, ToolCall, ToolArgs)) for p in one)


# --- generated calls: any arguments survive any chunking ---------------------------------------------


@pytest.mark.parametrize("name", ["sarashina", "inkling"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_object_calls(name: str, data: st.DataObject) -> None:
    calls = data.draw(
        st.lists(
            st.tuples(names, st.dictionaries(st.text(max_size=6), json_values, max_size=4)), min_size=1, max_size=3
        )
    )
    before = data.draw(prose)
    if name == "sarashina":
        body = data.draw(st.sampled_from(["", SR])) + sarashina_calls(calls)
        if not body.startswith(SR):
            before = ""  # a bare list only counts at the start
    else:
        body = "".join(inkling_call(n, a, header=data.draw(st.booleans())) for n, a in calls)
    output = before + body + data.draw(st.sampled_from(["", "\n", " "]))
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=20))
    expected = (before if before.strip() else "", calls)
    assert result(run(name, chunked(output, cuts))) == expected


_values = st.text(alphabet=st.characters(exclude_characters="<"), max_size=12)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_generated_step3_calls(data: st.DataObject) -> None:
    params = data.draw(st.lists(st.tuples(_values, st.integers(-99, 99)), min_size=1, max_size=3))
    before = data.draw(prose)
    output = before + step3_block(*(step3_call("search", {"query": q, "limit": str(n)}) for q, n in params))
    cuts = data.draw(st.lists(st.integers(0, len(output)), max_size=20))
    # Values are written bare: a newline a value starts or ends with is taken for the template's.
    expected = [("search", {"query": strip_newlines(q), "limit": n}) for q, n in params]
    assert result(run("step3", chunked(output, cuts))) == (before if before.strip() else "", expected)


# --- through a whole generation ------------------------------------------------------------------

GENERATION = [
    (
        "sarashina",
        "Checking." + SR + "[{'name': 'get_weather', 'arguments': {'city': 'Paris', 'unit': 'celsius'}}]",
        "Checking.",
    ),
    ("sarashina", "[{'name': 'get_weather', 'arguments': {'city': 'Paris', 'unit': 'celsius'}}]", None),
    (
        "step3",
        S3["calls"]
        + S3["call"]
        + 'function<｜tool_sep｜><steptml:invoke name="get_weather">\n<steptml:parameter name="city">Paris'
        '</steptml:parameter>\n<steptml:parameter name="unit">celsius</steptml:parameter>\n</steptml:invoke>'
        + S3["call_end"]
        + S3["calls_end"],
        None,
    ),
    (
        "inkling",
        inkling_text("Let me check.") + inkling_call("get_weather", {"city": "Paris", "unit": "celsius"}) + ES,
        "Let me check.",
    ),
]


@pytest.mark.parametrize(("parser", "output", "text"), GENERATION, ids=[g[0] for g in GENERATION])
def test_a_tool_call_through_the_generation(parser: str, output: str, text: str | None) -> None:
    events = generate("deepseek", parser, output)
    blocks = content(events)
    tool = blocks[-1]
    assert tool["type"] == "tool_use" and tool["name"] == "get_weather"
    assert re.fullmatch(r"toolu_[0-9a-f]{24}", tool["id"])
    assert tool["input"] == {"city": "Paris", "unit": "celsius"}
    assert blocks[:-1] == ([{"type": "text", "text": text}] if text else [])
    index = len(blocks) - 1
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta" and e["index"] == index]
    assert len(deltas) > 1 and all(d["type"] == "input_json_delta" for d in deltas)
    assert json.loads("".join(d["partial_json"] for d in deltas)) == {"city": "Paris", "unit": "celsius"}
    assert events[-2]["delta"] == {"stop_reason": "tool_use"}
    unstreamed = content(generate("deepseek", parser, output, stream=False))
    assert [{k: v for k, v in b.items() if k != "id"} for b in unstreamed] == [
        {k: v for k, v in b.items() if k != "id"} for b in blocks
    ]


# --- selection and constrained decoding ----------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "parser"),
    [
        ("sbintuitions/sarashina2.2-3b-instruct-v0.1", "sarashina"),
        ("Sarashina2-7B", "sarashina"),
        ("stepfun-ai/step3", "step3"),
        ("stepfun-ai/Step-3.5-Flash", "step3"),
        ("org/Inkling-Chat", "inkling"),
        ("inkling-7b", "inkling"),
    ],
)
def test_detected_names_select_these_parsers(model: str, parser: str) -> None:
    assert detect_tool_parser(model) == parser
    assert has_tool_parser(parser)
    assert isinstance(make_tool_parser(parser, TOOLS), TOOL_PARSERS[parser])


def test_inkling_forced_tool_use_is_a_structural_tag_in_its_own_framing() -> None:
    tools = [fn("search", query="string"), fn("noop")]
    kind, text = tool_constraint("any", None, tools, configured_parser="inkling") or ("", "")
    assert kind == "structural_tag"
    tag = json.loads(text)["format"]
    assert tag["type"] == "triggered_tags" and tag["triggers"] == [TJ] and tag["at_least_one"] is True
    assert [t["begin"] for t in tag["tags"]] == [TJ + '{"name":"search","args":', TJ + '{"name":"noop","args":']
    assert all(t["end"] == "}" + EM for t in tag["tags"])
    assert tag["tags"][0]["content"] == {"type": "json_schema", "json_schema": tools[0]["function"]["parameters"]}
    kind, text = tool_constraint("tool", "noop", tools, configured_parser="inkling") or ("", "")
    assert kind == "structural_tag" and [t["begin"] for t in json.loads(text)["format"]["tags"]] == [
        TJ + '{"name":"noop","args":'
    ]
    # Output written inside that tag is what the parser reads.
    output = TJ + '{"name":"search","args":{"query":"x"}}' + EM
    assert result(run("inkling", [output], tools)) == ("", [("search", {"query": "x"})])


@pytest.mark.parametrize("parser", ["sarashina", "step3"])
def test_sarashina_and_step3_force_tool_use_with_a_json_schema(parser: str) -> None:
    # The reference has no structural tag for these formats: even configured, the schema is used.
    tools = [fn("search", query="string")]
    assert (tool_constraint("any", None, tools, configured_parser=parser) or ("",))[0] == "json_schema"
    assert (tool_constraint("tool", "search", tools, configured_parser=parser) or ("",))[0] == "json_schema"


def generate_with_both_parsers(parser: str, output: str, stream: bool, in_reasoning: bool = False) -> list[Any]:
    """A whole generation with the format's reasoning and tool parsers as the stages."""
    tokenizer = _toy.fixture("deepseek")
    settings = GenerationSettings(
        message_id="msg_t",
        model="m",
        stream=stream,
        eos_token_ids=tokenizer.eos_token_ids,
        skip_special_tokens=False,
        tool_parser=parser,
        reasoning_parser=parser,
        in_reasoning=in_reasoning,
        tools=[WEATHER],
    )
    gen = Generation(tokenizer, settings, stages=build_stages(settings))
    events = gen.start()
    for token in tokenizer.encode(output) + tokenizer.eos_token_ids[:1]:
        events += gen.feed([token])
    return events + gen.finish("stop", 10, 20)


@pytest.mark.parametrize("stream", [True, False])
def test_step3_reasoning_then_calls(stream: bool) -> None:
    # Step3 starts in reasoning (its reasoning parser); the calls come after `</think>`.
    output = "plan the call</think>\n\n" + GENERATION[2][1]
    events = generate_with_both_parsers("step3", output, stream, in_reasoning=True)
    assert content(events) == [
        {"type": "thinking", "thinking": "plan the call", "signature": ""},
        {
            "type": "tool_use",
            "id": tool_use_id("msg_t", 0),
            "name": "get_weather",
            "input": {"city": "Paris", "unit": "celsius"},
            "caller": {"type": "direct"},
        },
    ]
    assert events[-2]["delta"] == {"stop_reason": "tool_use"}


@pytest.mark.parametrize("stream", [True, False])
def test_inkling_typed_blocks_make_thinking_text_and_calls(stream: bool) -> None:
    # Inkling's reasoning parser takes the blocks apart, then its tool parser reads the call.
    output = MM + CTH + "plan the call" + EM + inkling_text("Checking.") + inkling_call("get_weather", PARIS) + ES
    events = generate_with_both_parsers("inkling", output, stream)
    assert content(events) == [
        {"type": "thinking", "thinking": "plan the call", "signature": ""},
        {"type": "text", "text": "Checking."},
        {
            "type": "tool_use",
            "id": tool_use_id("msg_t", 0),
            "name": "get_weather",
            "input": PARIS,
            "caller": {"type": "direct"},
        },
    ]
    assert events[-2]["delta"] == {"stop_reason": "tool_use"}


@pytest.mark.parametrize("thinking", [{"type": "disabled"}, {"type": "enabled", "budget_tokens": 1024}, None])
def test_inkling_reasoning_runs_whatever_thinking_says(thinking: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {"messages": USER, **({"thinking": thinking} if thinking else {})}
    plan = output_plan(body, model="Inkling-7B")
    assert plan.reasoning_parser == "inkling" and plan.skip_special_tokens is False


@pytest.mark.parametrize(
    ("model", "parser"),
    [("sbintuitions/sarashina2.2-3b", "sarashina"), ("stepfun-ai/step3", "step3"), ("Inkling-7B", "inkling")],
)
def test_requests_to_these_models_parse_their_calls(model: str, parser: str) -> None:
    plan = output_plan({"messages": USER, "tools": [PLAN_TOOL]}, model=model)
    assert plan.tool_parser == parser and plan.skip_special_tokens is False and plan.constraint is None
    # Forced use: a detected parser gives the JSON schema; only a configured inkling its tag.
    forced = {"messages": USER, "tools": [PLAN_TOOL], "tool_choice": {"type": "any"}}
    assert output_plan(forced, model=model).constraint[0] == "json_schema"
    configured = output_plan(forced, model=model, tool_parser=parser)
    if parser == "inkling":
        assert configured.constraint[0] == "structural_tag" and configured.tool_parser == "inkling"
        assert configured.skip_special_tokens is False
    else:
        assert configured.constraint[0] == "json_schema" and configured.tool_parser == "json"
