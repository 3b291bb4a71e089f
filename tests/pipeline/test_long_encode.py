"""Tokenizing megabytes: the same ids as the one-text path, and one long text at a time."""

from __future__ import annotations

import sys
import threading

import pytest

from smg.pipeline.tokenizers import tokenizer as tokenizer_module
from smg.pipeline.tokenizers.tokenizer import LONG_ENCODES_AT_ONCE, LONG_TEXT_CHARS
from tests.pipeline import _toy

# Awkward for a tokenizer: special-token spellings, multi-byte and combining characters, emoji
# joined by ZWJ, CRLF and runs of spaces, digits, a byte-order mark.
_AWKWARD = (
    "<|im_start|>user\nhé\u0301llo 世界 🧑\u200d💻  <think>x</think>\r\n\t  12345678 "
    "<|endoftext|><|im_end|>\ufeff café—naïve  \u00a0 <s></s>[INST] "
)


def _long_text() -> str:
    return (_AWKWARD * (LONG_TEXT_CHARS // len(_AWKWARD) + 1))[: LONG_TEXT_CHARS + 7]


@pytest.mark.parametrize("name", ["qwen3", "llama3", "mistral", "deepseek"])
def test_a_long_text_tokenizes_to_the_ids_of_the_one_text_path(name: str) -> None:
    tok = _toy.fixture(name)
    text = _long_text()
    ids = tok.encode(text)
    assert ids == tok._backend.encode(text, add_special_tokens=False).ids
    assert tok.encode(_AWKWARD) == tok._backend.encode(_AWKWARD, add_special_tokens=False).ids


def _waiting_for_a_turn(thread: threading.Thread) -> bool:
    frame = sys._current_frames().get(thread.ident or -1)
    while frame is not None:
        if frame.f_code.co_name == "acquire" and frame.f_code.co_filename.endswith("threading.py"):
            return True
        frame = frame.f_back
    return False


def test_long_texts_are_tokenized_one_at_a_time() -> None:
    tok = _toy.fixture("qwen3")
    text = _long_text()
    out: list[list[int]] = []
    turns = tokenizer_module._LONG_ENCODES
    for _ in range(LONG_ENCODES_AT_ONCE):
        assert turns.acquire(blocking=False)  # the turns other long texts would hold
    held = LONG_ENCODES_AT_ONCE
    try:
        thread = threading.Thread(target=lambda: out.append(tok.encode(text)))
        thread.start()
        while thread.is_alive() and not _waiting_for_a_turn(thread):
            thread.join(0.01)
        assert thread.is_alive() and not out  # it waits for a turn instead of tokenizing
        for _ in range(held):
            turns.release()
        held = 0
        thread.join()
    finally:
        for _ in range(held):
            turns.release()
    assert out == [tok._backend.encode(text, add_special_tokens=False).ids]
