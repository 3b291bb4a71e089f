"""The incremental reasoning parsers: thinking/answer split, markers never emitted, any chunking
gives the same result (behaviors.md §F.6, §F.8)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from smg.pipeline.generation import Piece, Text, TextStage, Thinking, ToolArgs, ToolCall
from smg.pipeline.parsers.reasoning import REASONING_PARSERS, MarkerParser, make_reasoning_parser

# Inkling's typed blocks are not a pair of think markers: they have a table of their own below.
MARKER_PARSERS = sorted(name for name in REASONING_PARSERS if name not in ("passthrough", "inkling"))


def markers(name: str) -> tuple[str, str]:
    cls = REASONING_PARSERS[name]
    return cls.start, cls.end


def run(parser: TextStage, chunks: Iterable[str]) -> list[Piece]:
    out: list[Piece] = []
    for chunk in chunks:
        out += parser.feed([Text(chunk)])
    return out + parser.flush()


def parse(name: str, chunks: Iterable[str], in_reasoning: bool = False, start_consumed: bool = False) -> list[Piece]:
    return run(make_reasoning_parser(name, in_reasoning, start_consumed=start_consumed), chunks)


def split(pieces: Sequence[Piece]) -> tuple[str, str]:
    thinking = "".join(p.text for p in pieces if isinstance(p, Thinking))
    text = "".join(p.text for p in pieces if isinstance(p, Text))
    return thinking, text


def shape(pieces: Sequence[Piece]) -> list[tuple[str, str]]:
    """Pieces with adjacent ones of a kind joined: the blocks they would make."""
    out: list[tuple[str, str]] = []
    for p in pieces:
        assert isinstance(p, Text | Thinking)
        kind = type(p).__name__
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + p.text)
        else:
            out.append((kind, p.text))
    return out


def chars(text: str) -> list[str]:
    return list(text)


def assert_no_markers(name: str, pieces: Sequence[Piece]) -> None:
    start, end = markers(name)
    for p in pieces:
        assert isinstance(p, Text | Thinking)
        assert p.text, "no empty pieces"
        assert start not in p.text and end not in p.text
    thinking, text = split(pieces)
    for stream in (thinking, text):
        assert start not in stream and end not in stream


# --- per parser --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", MARKER_PARSERS)
@pytest.mark.parametrize("feed", [lambda s: [s], chars], ids=["whole", "by-char"])
def test_reasoning_then_answer(name: str, feed: Callable[[str], list[str]]) -> None:
    start, end = markers(name)
    pieces = parse(name, feed(f"{start}Let me plan.\nStep 1.{end}\n\nThe answer."))
    assert shape(pieces) == [("Thinking", "Let me plan.\nStep 1."), ("Text", "The answer.")]
    assert_no_markers(name, pieces)


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_starting_in_reasoning_needs_no_start_marker(name: str) -> None:
    start, end = markers(name)
    pieces = parse(name, chars(f"plan{end}\n\nAnswer."), in_reasoning=True)
    assert shape(pieces) == [("Thinking", "plan"), ("Text", "Answer.")]
    # A model that writes the start marker itself anyway (R1 sometimes does): it is dropped.
    pieces = parse(name, chars(f"{start}\nplan{end}Answer."), in_reasoning=True)
    assert shape(pieces) == [("Thinking", "\nplan"), ("Text", "Answer.")]


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_answer_only(name: str) -> None:
    pieces = parse(name, chars("Just the answer, <b>bold</b> < > </ and all."))
    assert shape(pieces) == [("Text", "Just the answer, <b>bold</b> < > </ and all.")]


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_unterminated_reasoning_stays_thinking(name: str) -> None:
    start, end = markers(name)
    # The tail could still have become the end marker; at the end it is reasoning text.
    tail = end[:3]
    for in_reasoning, out in [(False, f"{start}still going {tail}"), (True, f"still going {tail}")]:
        parser = make_reasoning_parser(name, in_reasoning)
        assert isinstance(parser, MarkerParser)
        held = run_no_flush(parser, chars(out))
        assert split(held) == ("still going ", "")
        assert parser.flush() == [Thinking(tail)]


def run_no_flush(parser: MarkerParser, chunks: Iterable[str]) -> list[Piece]:
    out: list[Piece] = []
    for chunk in chunks:
        out += parser.feed([Text(chunk)])
    return out


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_a_held_start_prefix_in_the_answer_is_text_at_the_end(name: str) -> None:
    start, _ = markers(name)
    pieces = parse(name, chars(f"Answer {start[:-1]}"))
    assert shape(pieces) == [("Text", f"Answer {start[:-1]}")]


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_blank_lines_after_the_end_marker_are_dropped(name: str) -> None:
    start, end = markers(name)
    for chunks in ([f"{start}a{end}\n\n \t\nAnswer\n\n  more\n"], chars(f"{start}a{end}\n\n \t\nAnswer\n\n  more\n")):
        assert split(parse(name, chunks)) == ("a", "Answer\n\n  more\n")
    # Only whitespace after the reasoning: no text at all.
    assert shape(parse(name, chars(f"{start}a{end}\n\n"))) == [("Thinking", "a")]


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_every_single_split_gives_the_same_result(name: str) -> None:
    start, end = markers(name)
    doc = f"{start}think {start[:2]} hard{end}\n\nAnswer {end[:2]}x"
    expected = ("think " + start[:2] + " hard", "Answer " + end[:2] + "x")
    for i in range(len(doc) + 1):
        for j in range(i, len(doc) + 1):
            pieces = parse(name, [doc[:i], doc[i:j], doc[j:]])
            assert split(pieces) == expected, (i, j)
            assert_no_markers(name, pieces)


@pytest.mark.parametrize("name", MARKER_PARSERS)
def test_markers_are_never_emitted_even_partially_while_they_could_complete(name: str) -> None:
    start, end = markers(name)
    parser = make_reasoning_parser(name, False)
    assert isinstance(parser, MarkerParser)
    for i in range(1, len(start)):
        assert parser.feed([Text(start[i - 1])]) == []
    assert parser.feed([Text(start[-1])]) == []
    assert parser.feed([Text("x")]) == [Thinking("x")]
    for ch in end:
        assert parser.feed([Text(ch)]) == []
    assert parser.feed([Text("\n\n")]) == []
    assert parser.feed([Text("y")]) == [Text("y")]


# --- chunking invariance (hypothesis) ----------------------------------------------------------


def alphabet(name: str) -> str:
    start, end = markers(name)
    return "".join(sorted(set(start + end))) + "a \n é😀"


@st.composite
def chunked(draw: st.DrawFn, doc: str) -> list[str]:
    cuts = sorted(draw(st.lists(st.integers(0, len(doc)), max_size=12)))
    bounds = [0, *cuts, len(doc)]
    return [doc[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@pytest.mark.parametrize("name", MARKER_PARSERS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_documents_and_chunkings(name: str, data: st.DataObject) -> None:
    start, end = markers(name)
    piece = st.one_of(st.text(alphabet(name), max_size=6), st.sampled_from([start, end, start[:3], end[:3], "\n\n"]))
    doc = "".join(data.draw(st.lists(piece, max_size=10)))
    in_reasoning = data.draw(st.booleans())
    start_consumed = data.draw(st.booleans())
    whole = parse(name, [doc], in_reasoning, start_consumed=start_consumed)
    chunks = data.draw(chunked(doc))
    assert "".join(chunks) == doc
    pieces = parse(name, chunks, in_reasoning, start_consumed=start_consumed)
    assert shape(pieces) == shape(whole)
    assert all(p.text for p in pieces if isinstance(p, Text | Thinking))


@pytest.mark.parametrize("name", MARKER_PARSERS)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_random_reasoning_and_answer_split_exactly(name: str, data: st.DataObject) -> None:
    start, end = markers(name)
    text = st.text(alphabet(name), max_size=30)
    thinking, blank, answer = data.draw(text), data.draw(st.text(" \n\t", max_size=4)), data.draw(text)
    doc = f"{start}{thinking}{end}{blank}{answer}"
    # Marker text generated by chance would legitimately change the split.
    for part in (thinking, answer):
        if start in part or end in part:
            return
    if doc.count(end) != 1 or doc.count(start) != 1:
        return
    pieces = parse(name, data.draw(chunked(doc)))
    assert split(pieces) == (thinking, answer.lstrip())
    assert_no_markers(name, pieces)


# --- a second start marker, stray end markers (the reference parser's rules) ----------------------


def test_a_second_start_marker_after_reasoning_is_literal_text() -> None:
    pieces = parse("qwen3", chars("<think>a</think>b <think>c</think>d"))
    assert shape(pieces) == [("Thinking", "a"), ("Text", "b <think>c</think>d")]


def test_text_before_the_start_marker_stays_text() -> None:
    pieces = parse("qwen3", chars("Hi <think>a</think>b"))
    assert shape(pieces) == [("Text", "Hi "), ("Thinking", "a"), ("Text", "b")]


def test_an_end_marker_outside_reasoning_is_literal_text() -> None:
    assert shape(parse("qwen3", chars("a</think>b"))) == [("Text", "a</think>b")]


def test_starting_in_reasoning_without_a_start_marker_honours_one_later() -> None:
    # The reference consumes the start marker once; none was seen, so a later one opens reasoning.
    pieces = parse("deepseek_r1", chars("a</think>b<think>c</think>d<think>e"), in_reasoning=True)
    assert shape(pieces) == [("Thinking", "a"), ("Text", "b"), ("Thinking", "c"), ("Text", "d<think>e")]


def test_a_start_marker_consumed_in_the_prompt_is_not_honoured_again() -> None:
    pieces = parse("deepseek_v31", chars("a<think>b</think>c<think>d"), in_reasoning=True, start_consumed=True)
    assert shape(pieces) == [("Thinking", "a<think>b"), ("Text", "c<think>d")]


def test_kimi_unicode_markers() -> None:
    pieces = parse("kimi", chars("◁think▷分析◁/think▷\n\n答案 <think>"))
    assert shape(pieces) == [("Thinking", "分析"), ("Text", "答案 <think>")]


def test_cohere_markers() -> None:
    pieces = parse("cohere_cmd", chars("<|START_THINKING|>plan<|END_THINKING|>\n<|START_RESPONSE|>hi"))
    assert shape(pieces) == [("Thinking", "plan"), ("Text", "<|START_RESPONSE|>hi")]


# --- passthrough, other pieces -----------------------------------------------------


def test_passthrough_changes_nothing() -> None:
    parser = make_reasoning_parser("passthrough", True)
    pieces: list[Piece] = [Text("<think>a"), Thinking("t"), Text("</think>\n\nb")]
    assert parser.feed(pieces) == pieces
    assert parser.flush() == []


def test_other_pieces_pass_through_in_order_after_held_text() -> None:
    parser = make_reasoning_parser("qwen3", False)
    call, args = ToolCall("toolu_1", "f"), ToolArgs("{}")
    assert parser.feed([Text("a <thi"), call, args, Thinking("x")]) == [
        Text("a "),
        Text("<thi"),
        call,
        args,
        Thinking("x"),
    ]
    assert parser.feed([Text("<think>t")]) == [Thinking("t")]
    # Another stage's thinking is passed on as it is, not joined to this parser's.
    assert parser.feed([Thinking("u"), Text("v")]) == [Thinking("u"), Thinking("v")]


def test_parsers_are_text_stages_with_their_own_state() -> None:
    first = make_reasoning_parser("qwen3", True)
    second = make_reasoning_parser("qwen3", True)
    assert first.feed([Text("a</think>b")]) == [Thinking("a"), Text("b")]
    assert second.feed([Text("c")]) == [Thinking("c")]
    with pytest.raises(ValueError, match="unknown reasoning parser"):
        make_reasoning_parser("nope", False)


# --- Kimi-K3's XTML channels ---------------------------------------------------------------------

K3_OPEN, K3_CLOSE, K3_SEP = "<|open|>", "<|close|>", "<|sep|>"


def k3(tag: str, closing: bool = False) -> str:
    return f"{K3_CLOSE if closing else K3_OPEN}{tag}{K3_SEP}"


@pytest.mark.parametrize("feed", [lambda s: [s], chars], ids=["whole", "by-char"])
@pytest.mark.parametrize(
    ("output", "in_reasoning", "expected"),
    [
        # The template's turn: think, response, tools; the generation prompt opened think.
        (
            f"plan{k3('think', True)}{k3('response')}Answer.{k3('response', True)}{k3('tools')}calls",
            True,
            [("Thinking", "plan"), ("Text", f"Answer.{k3('tools')}calls")],
        ),
        # The think channel left for the tools channel without closing (a forced call).
        (
            f"plan{k3('tools')}calls{k3('tools', True)}",
            True,
            [("Thinking", "plan"), ("Text", f"{k3('tools')}calls{k3('tools', True)}")],
        ),
        (f"plan{k3('response')}Answer.", True, [("Thinking", "plan"), ("Text", "Answer.")]),
        # Thinking off: the response channel's content, without its wrappers.
        (f"{k3('response')}Answer.{k3('response', True)}{k3('message', True)}", False, [("Text", "Answer.")]),
        (f"{k3('think')}a{k3('think', True)}b", False, [("Thinking", "a"), ("Text", "b")]),
        ("Answer <|open|>respo", False, [("Text", "Answer <|open|>respo")]),
    ],
)
def test_kimi_k3_channels(
    feed: Callable[[str], list[str]], output: str, in_reasoning: bool, expected: list[tuple[str, str]]
) -> None:
    assert shape(parse("kimi_k3", feed(output), in_reasoning)) == expected


# --- Inkling's TML typed blocks ---------------------------------------------------------------------

MM, CT, CTH, TJ, TT = (
    "<|message_model|>",
    "<|content_text|>",
    "<|content_thinking|>",
    "<|content_invoke_tool_json|>",
    "<|content_invoke_tool_text|>",
)
EM, ES = "<|end_message|>", "<|content_model_end_sampling|>"
TOOL_BLOCK = TJ + '{"name":"search","args":{"q":"rust"}}' + EM
# The reference parser's canonical turn: thinking, text, a JSON call whose header names the tool.
TYPED_OUTPUT = MM + CTH + "check sources" + EM + MM + CT + "Here is the answer." + EM + MM + "search" + TOOL_BLOCK + ES

NOT_TML = "Just <b>text</b> < <| |> <|unknown|> and <|content_th"
# (output, starts in reasoning, the blocks it makes)
INKLING_CASES: list[tuple[str, bool, list[tuple[str, str]]]] = [
    (TYPED_OUTPUT, False, [("Thinking", "check sources"), ("Text", "Here is the answer." + TOOL_BLOCK)]),
    # A text-mode invocation has no tool_use form: the whole frame is dropped.
    (TT + "search for rust" + EM + ES, False, []),
    (MM + CT + "a" + EM + MM + TT + "x <|content_text|> y" + EM + MM + CT + "b" + EM, False, [("Text", "ab")]),
    # Reasoning opened by the prompt, and thinking after the answer.
    ("plan" + EM + MM + CT + "Answer." + EM, True, [("Thinking", "plan"), ("Text", "Answer.")]),
    (
        MM + CT + "a" + EM + MM + CTH + "b" + EM + MM + CT + "c",
        False,
        [("Text", "a"), ("Thinking", "b"), ("Text", "c")],
    ),
    # No whitespace is dropped after reasoning, and text outside any block is the answer's.
    (CTH + "t" + EM + "\n\nloose " + CT + " x", False, [("Thinking", "t"), ("Text", "\n\nloose  x")]),
    # A header holds no content whatever it says; a tool block keeps every token for the tool parser.
    (MM + "assistant name" + CT + "hi" + EM, False, [("Text", "hi")]),
    (TJ + '{"a": "' + CT + '"}' + ES + "after", False, [("Text", TJ + '{"a": "' + CT + '"}' + ES + "after")]),
    # Not TML: text unchanged, a marker prefix that never completes included.
    (
        "Just <b>text</b> < <| |> <|unknown|> and <|content_th",
        False,
        [("Text", "Just <b>text</b> < <| |> <|unknown|> and <|content_th")],
    ),
    (CTH + "still <|end_mess", False, [("Thinking", "still <|end_mess")]),
]


@pytest.mark.parametrize("feed", [lambda s: [s], chars], ids=["whole", "by-char"])
@pytest.mark.parametrize(("output", "in_reasoning", "expected"), INKLING_CASES)
def test_inkling_blocks(
    feed: Callable[[str], list[str]], output: str, in_reasoning: bool, expected: list[tuple[str, str]]
) -> None:
    assert shape(parse("inkling", feed(output), in_reasoning)) == expected


@pytest.mark.parametrize(("output", "in_reasoning", "expected"), INKLING_CASES)
def test_inkling_every_single_split(output: str, in_reasoning: bool, expected: list[tuple[str, str]]) -> None:
    for i in range(len(output) + 1):
        pieces = parse("inkling", [output[:i], output[i:]], in_reasoning)
        assert shape(pieces) == expected, i
        assert all(p.text for p in pieces if isinstance(p, Text | Thinking))


def test_inkling_every_pair_of_splits() -> None:
    doc = CTH + "a<|" + EM + MM + "f" + CT + "b" + EM
    for i in range(len(doc) + 1):
        for j in range(i, len(doc) + 1):
            assert shape(parse("inkling", [doc[:i], doc[i:j], doc[j:]])) == [("Thinking", "a<|"), ("Text", "b")], (i, j)


def test_inkling_control_tokens_are_never_emitted_even_partially() -> None:
    parser = make_reasoning_parser("inkling", False)
    for ch in MM + "header" + CTH:
        assert parser.feed([Text(ch)]) == []
    assert parser.feed([Text("x")]) == [Thinking("x")]
    for ch in EM + MM + CT:
        assert parser.feed([Text(ch)]) == []
    assert parser.feed([Text("y")]) == [Text("y")]
    assert parser.flush() == []


def test_inkling_needs_its_special_tokens() -> None:
    assert REASONING_PARSERS["inkling"].special_tokens


INKLING_TOKENS = [MM, CT, CTH, TJ, TT, EM, ES, "<|message_user|>", "<|content_image|>"]


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_inkling_random_documents_and_chunkings(data: st.DataObject) -> None:
    piece = st.one_of(
        st.text("<|>_aé 😀\n", max_size=6),
        st.sampled_from(INKLING_TOKENS),
        st.sampled_from(INKLING_TOKENS).map(lambda t: t[:5]),
    )
    doc = "".join(data.draw(st.lists(piece, max_size=12)))
    in_reasoning = data.draw(st.booleans())
    whole = parse("inkling", [doc], in_reasoning)
    pieces = parse("inkling", data.draw(chunked(doc)), in_reasoning)
    assert shape(pieces) == shape(whole)
    assert all(p.text for p in pieces if isinstance(p, Text | Thinking))
    # What is emitted never holds a control token, but for a JSON call's own framing.
    if TJ not in doc:
        text = "".join(p.text for p in whole if isinstance(p, Text | Thinking))
        assert not [token for token in INKLING_TOKENS if token in text]
