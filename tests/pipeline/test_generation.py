"""A generation end to end, sans I/O: engine token ids → Anthropic events (behaviors.md §C.2,
§D.2, §D.3, §D.5, §F.4)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg.pipeline.detokenize import REPLACEMENT
from smg.pipeline.generation import (
    Generation,
    GenerationSettings,
    Piece,
    Text,
    Thinking,
    ToolArgs,
    ToolCall,
    empty_message,
)
from smg.pipeline.tokenizers import Tokenizer
from smg.protocol.fold import BlockFold
from tests.pipeline import _toy

Event = dict[str, Any]


def tok() -> Tokenizer:
    return _toy.fixture("qwen3")


def make(
    tokenizer: Tokenizer | None = None,
    stream: bool = True,
    stages: Sequence[Any] = (),
    **kw: Any,
) -> Generation:
    tokenizer = tokenizer or tok()
    kw.setdefault("eos_token_ids", tokenizer.eos_token_ids)
    return Generation(tokenizer, GenerationSettings(message_id="msg_t", model="qwen", stream=stream, **kw), stages)


def run(gen: Generation, chunks: Sequence[Sequence[int]], finish: str = "stop", **kw: Any) -> list[Event]:
    events = gen.start()
    for chunk in chunks:
        events += gen.feed(chunk)
    kw.setdefault("prompt_tokens", 7)
    kw.setdefault("completion_tokens", sum(len(c) for c in chunks))
    return events + gen.finish(finish, **kw)


def one_by_one(ids: Sequence[int]) -> list[list[int]]:
    return [[i] for i in ids]


def content(events: list[Event]) -> list[dict[str, Any]]:
    folder = BlockFold()
    for event in events:
        folder.feed(event)
    return folder.content()


def text_of(events: list[Event]) -> str:
    return "".join(e["delta"]["text"] for e in events if e["type"] == "content_block_delta")


def final(events: list[Event]) -> Event:
    assert events[-1] == {"type": "message_stop"}
    assert events[-2]["type"] == "message_delta"
    return events[-2]


def test_a_text_answer_has_the_documented_stream_shape() -> None:
    t = tok()
    ids = t.encode("There is no single answer") + [t.eos_token_ids[0]]
    events = run(make(t), one_by_one(ids), prompt_tokens=27, completion_tokens=112)
    types = [e["type"] for e in events]
    n = types.count("content_block_delta")
    assert n >= 2
    assert types == ["message_start", "content_block_start"] + ["content_block_delta"] * n + [
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    assert events[0] == {
        "type": "message_start",
        "message": {
            "id": "msg_t",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "qwen",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {
                "input_tokens": 0,
                "output_tokens": 0,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
    }
    assert events[1] == {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
    assert all(e["index"] == 0 and e["delta"]["type"] == "text_delta" for e in events[2 : 2 + n])
    assert text_of(events) == "There is no single answer"
    assert events[-3] == {"type": "content_block_stop", "index": 0}
    assert final(events) == {
        "type": "message_delta",
        "delta": {"stop_reason": "end_turn"},
        "usage": {
            "output_tokens": 112,
            "input_tokens": 27,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    }


def test_a_stop_sequence_split_across_tokens() -> None:
    t = tok()
    stop = "xyzzy!"
    assert len(t.encode(stop)) > 1
    ids = t.encode("Hello there xyzzy! and more text")
    gen = make(t, stop_sequences=[stop])
    events = gen.start()
    for chunk in one_by_one(ids):
        events += gen.feed(chunk)
    assert gen.stopped
    assert gen.feed(t.encode("ignored")) == []
    events += gen.finish("stop", 7, len(ids))
    assert text_of(events) == "Hello there "
    assert final(events)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_multibyte_characters_split_across_tokens() -> None:
    t = tok()
    ids = t.encode("Bonjour 😀 你好 café")
    events = run(make(t), one_by_one(ids))
    deltas = [e["delta"]["text"] for e in events if e["type"] == "content_block_delta"]
    assert all(REPLACEMENT not in d for d in deltas)
    assert "".join(deltas) == "Bonjour 😀 你好 café"


def test_length_is_max_tokens() -> None:
    t = tok()
    events = run(make(t), [t.encode("cut short")], finish="length", completion_tokens=2)
    assert final(events)["delta"] == {"stop_reason": "max_tokens"}
    assert final(events)["usage"]["output_tokens"] == 2


def test_eos_is_dropped_and_is_not_a_stop_sequence() -> None:
    t = tok()
    eos = t.eos_token_ids[0]
    gen = make(t, skip_special_tokens=False, stop_sequences=["never"])
    events = run(gen, [t.encode("Done."), [eos]], matched_token_id=eos)
    assert text_of(events) == "Done."
    assert final(events)["delta"] == {"stop_reason": "end_turn"}


def test_an_engine_stop_token_maps_back_to_the_users_string() -> None:
    t = tok()
    stop_id = t.token_id("<|im_end|>")
    assert stop_id is not None
    # The engine stopped on the id and left it out of the output.
    gen = make(t, eos_token_ids=[], stop_sequences=["<|im_end|>"], stop_token_map={stop_id: "<|im_end|>"})
    events = run(gen, [t.encode("Answer")], matched_token_id=stop_id)
    assert text_of(events) == "Answer"
    assert final(events)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "<|im_end|>"}


def test_a_stop_token_in_the_output_ends_it_and_releases_held_text() -> None:
    t = tok()
    word = "Paris"
    stop_id = t.token_id(word)
    if stop_id is None:
        word, stop_id = "<|im_end|>", t.token_id("<|im_end|>")
    assert stop_id is not None
    # "Pa" is held as a possible start of the stop string, then the engine stops on the token.
    ids = t.encode("Capital: Pa") + [stop_id] + t.encode("after")
    gen = make(t, eos_token_ids=[], stop_sequences=[word], stop_token_map={stop_id: word})
    events = run(gen, one_by_one(ids))
    assert gen.stopped
    assert text_of(events) == "Capital: Pa"
    assert final(events)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": word}


def test_an_engine_matched_string_counts_only_when_it_is_the_users() -> None:
    t = tok()
    events = run(make(t, stop_sequences=["END"]), [t.encode("x")], matched_stop_str="END")
    assert final(events)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    events = run(make(t, stop_sequences=["END"]), [t.encode("x")], matched_stop_str="<|im_end|>")
    assert final(events)["delta"] == {"stop_reason": "end_turn"}
    events = run(make(t), [t.encode("x")], matched_token_id=12345)
    assert final(events)["delta"] == {"stop_reason": "end_turn"}


def test_a_partial_stop_held_at_the_end_is_flushed_as_text() -> None:
    t = tok()
    events = run(make(t, stop_sequences=["STOPPING"]), one_by_one(t.encode("Almost STOP")))
    assert text_of(events) == "Almost STOP"
    assert final(events)["delta"] == {"stop_reason": "end_turn"}


def test_empty_message_for_max_tokens_zero() -> None:
    assert empty_message("msg_0", "qwen", 27) == [
        {
            "type": "message_start",
            "message": {
                "id": "msg_0",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "qwen",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {
                    "input_tokens": 27,
                    "output_tokens": 0,
                    "cache_creation_input_tokens": 0,
                    "cache_read_input_tokens": 0,
                },
            },
        },
        {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens"},
            "usage": {
                "output_tokens": 0,
                "input_tokens": 27,
                "cache_creation_input_tokens": 0,
                "cache_read_input_tokens": 0,
            },
        },
        {"type": "message_stop"},
    ]


def test_no_output_is_three_events() -> None:
    t = tok()
    events = run(make(t), [[t.eos_token_ids[0]]], completion_tokens=1)
    assert [e["type"] for e in events] == ["message_start", "message_delta", "message_stop"]


# --- the stage seam ----------------------------------------------------------------------------


class ThinkSplitter:
    """A toy reasoning stage: text before `</think>` is thinking (no partial-tag holding, the
    test feeds the tag in one piece)."""

    def __init__(self) -> None:
        self.thinking = True

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        out: list[Piece] = []
        for piece in pieces:
            if not isinstance(piece, Text) or not self.thinking:
                out.append(piece)
                continue
            before, tag, after = piece.text.partition("</think>")
            out.append(Thinking(before))
            if tag:
                self.thinking = False
                out.append(Text(after))
        return out

    def flush(self) -> list[Piece]:
        return []


class ToolTail:
    """A toy tool stage: `CALL` starts a call whose arguments are the rest of the text; it holds
    the last text until flush, to show that flushed pieces still reach the builder."""

    def __init__(self) -> None:
        self.in_call = False
        self.held: list[Piece] = []

    def feed(self, pieces: Sequence[Piece]) -> list[Piece]:
        out: list[Piece] = list(self.held)
        self.held = []
        for piece in pieces:
            if not isinstance(piece, Text):
                out.append(piece)
            elif self.in_call:
                out.append(ToolArgs(piece.text))
            elif "CALL" in piece.text:
                before, _, after = piece.text.partition("CALL")
                self.in_call = True
                out += [Text(before), ToolCall("toolu_1", "get_weather"), ToolArgs(after)]
            else:
                out.append(piece)
        self.held, out = out[-1:], out[:-1]
        return out

    def flush(self) -> list[Piece]:
        held, self.held = self.held, []
        return held


def test_stages_turn_text_into_thinking_text_and_tool_calls() -> None:
    t = tok()
    chunks = [t.encode("plan</think>"), t.encode("Checking."), t.encode("CALL"), t.encode('{"city": "Paris"}')]
    gen = make(t, stages=[ThinkSplitter(), ToolTail()], stop_sequences=["never"])
    events = run(gen, chunks, finish="length")
    assert content(events) == [
        {"type": "thinking", "thinking": "plan", "signature": ""},
        {"type": "text", "text": "Checking."},
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "get_weather",
            "input": {"city": "Paris"},
            "caller": {"type": "direct"},
        },
    ]
    assert final(events)["delta"] == {"stop_reason": "tool_use"}


def test_engine_tool_calls_finish_is_tool_use() -> None:
    t = tok()
    assert final(run(make(t), [t.encode("x")], finish="tool_calls"))["delta"] == {"stop_reason": "tool_use"}


def test_non_streaming_drops_a_whitespace_residual() -> None:
    t = tok()
    gen = make(t, stream=False, stages=[ThinkSplitter()])
    events = run(gen, [t.encode("hmm</think>\n\n")])
    assert content(events) == [{"type": "thinking", "thinking": "hmm", "signature": ""}]
    streamed = run(make(t, stages=[ThinkSplitter()]), [t.encode("hmm</think>\n\n")])
    assert content(streamed)[1] == {"type": "text", "text": "\n\n"}


# --- properties --------------------------------------------------------------------------------

texts = st.lists(
    st.one_of(st.sampled_from(["Hello", " world", "😀", "你好", "é", "STOP", "ST", "\n", " "]), st.text(max_size=4)),
    max_size=10,
).map("".join)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, data=st.data(), stream=st.booleans(), use_stop=st.booleans())
def test_any_chunking_gives_the_text_up_to_the_stop(
    text: str, data: st.DataObject, stream: bool, use_stop: bool
) -> None:
    t = tok()
    ids = t.encode(text)
    cuts = sorted(set(data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))))
    bounds = [0, *cuts, len(ids)]
    chunks = [ids[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
    stops = ["STOP"] if use_stop else []
    events = run(make(t, stream=stream, stop_sequences=stops), chunks)
    decoded = t.decode(ids)
    at = decoded.find("STOP") if use_stop else -1
    expected = decoded[:at] if at >= 0 else decoded
    got = "".join(b["text"] for b in content(events) if b["type"] == "text")
    if stream:
        assert got == expected
    else:
        assert got == (expected if expected.strip() else "")
    delta = final(events)["delta"]
    assert delta == (
        {"stop_reason": "stop_sequence", "stop_sequence": "STOP"} if at >= 0 else {"stop_reason": "end_turn"}
    )


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
def test_other_tokenizers(kind: str) -> None:
    t = _toy.byte_level() if kind == "byte_level" else _toy.sentencepiece()
    ids = t.encode("the world 😀 stop here")
    events = run(make(t, stop_sequences=["stop"]), one_by_one(ids))
    assert text_of(events) == t.decode(ids).split("stop")[0]
