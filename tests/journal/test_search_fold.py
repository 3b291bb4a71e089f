"""The search columns a `received` event folds into: the conversation key of a huge first message."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import orjson

from journal import search
from journal.events import Received


def _thread_key(body: dict[str, Any]) -> str:
    row: dict[str, Any] = {}
    search.fold(row, Received(method="POST", path="/v1/messages", body=json.dumps(body), ts=1.0))
    return str(row["thread_key"])


def _turn(first: str, system: str = "Be brief.") -> dict[str, Any]:
    return {"model": "m", "system": system, "messages": [{"role": "user", "content": first}]}


def test_a_short_conversation_keeps_its_key() -> None:
    start = [[{"type": "text", "text": "Be brief."}], {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    expected = "h:" + hashlib.sha256(orjson.dumps(start, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
    assert _thread_key(_turn("Hi")) == expected


def test_a_huge_first_message_is_keyed_by_its_first_million_characters() -> None:
    head = "w" * search.THREAD_KEY_CHARS
    assert _thread_key(_turn(head + " one")) == _thread_key(_turn(head + " two"))
    assert _thread_key(_turn("v" + head[1:] + " one")) != _thread_key(_turn(head + " one"))
    assert _thread_key(_turn(head + " one", system=head + "a")) != _thread_key(_turn(head + " one", system="b"))
