"""Incremental detokenization: whatever the chunking, the emitted text is exactly the decode of
all ids, and no push ever emits half a character."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from smg.pipeline.detokenize import REPLACEMENT, Detokenizer
from smg.pipeline.tokenizers import Tokenizer
from tests.pipeline import _toy

TRICKY = [
    "héllo",
    "naïve",
    "你好世界",
    "😀",
    "👩‍👩‍👧",
    "🇫🇷",
    " the world",
    "\n\n",
    "e\u0301",
    "  ",
    "é",
    "ß",
    "\ufffd",
    "x",
]

texts = st.lists(st.one_of(st.sampled_from(TRICKY), st.text(max_size=8)), max_size=12).map("".join)

KINDS = ["byte_level", "sentencepiece", "qwen3", "mistral"]


def tokenizer(kind: str) -> Tokenizer:
    if kind == "byte_level":
        return _toy.byte_level()
    if kind == "sentencepiece":
        return _toy.sentencepiece()
    return _toy.fixture(kind)


def chunk(ids: Sequence[int], cuts: Sequence[int]) -> list[list[int]]:
    bounds = [0, *sorted(set(cuts)), len(ids)]
    return [list(ids[a:b]) for a, b in zip(bounds, bounds[1:], strict=False)]


def run(tok: Tokenizer, chunks: Sequence[Sequence[int]], skip: bool = True) -> tuple[str, list[str]]:
    detok = Detokenizer(tok, skip_special_tokens=skip)
    pieces = [detok.push(c) for c in chunks]
    pieces.append(detok.flush())
    return "".join(pieces), pieces


@pytest.mark.parametrize("kind", KINDS)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, data=st.data())
def test_any_chunking_yields_the_full_decode(kind: str, text: str, data: st.DataObject) -> None:
    tok = tokenizer(kind)
    ids = tok.encode(text)
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    joined, pieces = run(tok, chunk(ids, cuts))
    assert joined == tok.decode(ids)
    # Only genuine replacement characters ever come out.
    assert "".join(pieces).count(REPLACEMENT) == tok.decode(ids).count(REPLACEMENT)


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece"])
@pytest.mark.parametrize("skip", [True, False])
@settings(max_examples=100, deadline=None)
@given(segments=st.lists(st.one_of(texts, st.none()), max_size=5), data=st.data())
def test_special_tokens_in_between(kind: str, skip: bool, segments: list[str | None], data: st.DataObject) -> None:
    tok = tokenizer(kind)
    specials = sorted(tok.special_ids)
    # Special tokens sit between encoded texts (never inside a character's bytes).
    ids: list[int] = []
    for segment in segments:
        ids += tok.encode(segment) if segment is not None else [data.draw(st.sampled_from(specials))]
    cuts = data.draw(st.lists(st.integers(0, len(ids)), max_size=len(ids)))
    assert run(tok, chunk(ids, cuts), skip)[0] == tok.decode(ids, skip_special_tokens=skip)


@pytest.mark.parametrize("kind", ["byte_level", "sentencepiece", "qwen3"])
def test_multibyte_characters_split_across_tokens_are_held_until_complete(kind: str) -> None:
    tok = tokenizer(kind)
    ids = tok.encode("a😀b你")
    assert len(ids) > 2
    detok = Detokenizer(tok)
    emitted = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(emitted) == "a😀b你"
    assert all(REPLACEMENT not in piece for piece in emitted)
    assert "😀" in emitted  # emitted whole, once its last byte arrived


def test_sentencepiece_spacing_survives_one_token_pushes() -> None:
    tok = _toy.sentencepiece()
    ids = tok.encode("the world the stop")
    detok = Detokenizer(tok)
    pieces = [detok.push([i]) for i in ids]
    assert pieces[0] == "the"
    assert pieces[1] == " world"
    assert "".join(pieces) + detok.flush() == "the world the stop"


def test_an_unfinished_character_is_flushed_as_a_replacement() -> None:
    tok = _toy.byte_level()
    ids = tok.encode("😀")
    detok = Detokenizer(tok)
    assert detok.push(ids[:-1]) == ""
    assert detok.flush() == tok.decode(ids[:-1])
    assert detok.flush() == ""


def test_the_window_stays_short() -> None:
    tok = _toy.byte_level()
    detok = Detokenizer(tok)
    ids = tok.encode("The quick brown fox jumps over the lazy dog. " * 50)
    out = []
    for i in ids:
        out.append(detok.push([i]))
        assert len(detok._ids) <= 4
    assert "".join(out) + detok.flush() == tok.decode(ids)


def test_empty_pushes() -> None:
    detok = Detokenizer(_toy.byte_level())
    assert detok.push([]) == ""
    assert detok.flush() == ""


class _Counting:
    """A real tokenizer, with the decodes it was asked for counted."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.decodes = 0

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        self.decodes += 1
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)


def test_a_flush_with_nothing_held_back_decodes_nothing() -> None:
    # A non-streamed answer arrives as one chunk: its text is certain at the push, and the
    # flush after it has no text to add, so it costs no decode of the whole answer.
    counting = _Counting(_toy.fixture("qwen3"))
    detok = Detokenizer(counting)
    ids = counting.tokenizer.encode("The quick brown fox jumps over the lazy dog. " * 20)
    text = detok.push(ids)
    before = counting.decodes
    assert detok.flush() == ""
    assert counting.decodes == before
    assert text == counting.tokenizer.decode(ids)
