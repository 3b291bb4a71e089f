"""Checks that only look at a body of megabytes copy none of it (each copy is a pass over the body
while the GIL is held, and memory the size of the body), and still see all of it."""

from __future__ import annotations

import tracemalloc
from collections.abc import Callable
from typing import Any

import orjson
import pytest

from smg.protocol import codec
from smg.protocol.errors import ApiError
from smg.protocol.parse import parse_create_message
from smg.protocol.validation import check_message_contents

MIB = 1 << 20


def _peak(work: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_the_long_integer_check_holds_one_window_of_a_large_body() -> None:
    body = orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * (8 * MIB // 5)}]})
    assert _peak(lambda: codec._has_long_integer(body)) < 3 * MIB  # a window and its translation


@pytest.mark.parametrize("at", [0, MIB - 25, MIB - 19, MIB - 10, 3 * MIB - 1, 8 * MIB - 20])
def test_a_long_integer_is_found_wherever_it_lies(at: int) -> None:
    filler = bytearray(b" " * (8 * MIB))
    filler[at : at + 20] = b"1" * 20
    assert codec._has_long_integer(bytes(filler))
    filler[at + 19 : at + 20] = b" "  # nineteen digits fit 64 bits
    assert not codec._has_long_integer(bytes(filler))


def test_a_long_integer_in_a_large_body_keeps_its_digits() -> None:
    body = b'{"pad": "' + b"x" * (3 * MIB) + b'", "n": 123456789012345678901234567890}'
    assert codec.loads(body)["n"] == 123456789012345678901234567890


def test_the_empty_content_check_copies_no_message() -> None:
    request = parse_create_message(
        {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": " word" * (MIB // 5) + " "}]}
    )
    assert _peak(lambda: check_message_contents(request.messages)) < MIB // 8


@pytest.mark.parametrize("content", [" \n\t ", [{"type": "text", "text": " \u3000 "}]])
def test_whitespace_only_content_is_still_empty(content: Any) -> None:
    with pytest.raises(ApiError) as refused:
        parse_create_message({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": content}]})
    assert refused.value.code in ("empty_content", "empty_text_block")
