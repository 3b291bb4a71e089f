"""The search columns a `received` event folds into: the conversation key of a huge first message."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import orjson

from journal import search
from journal.events import Completed, Event, Received, Rejected, Upstream, Validated
from journal.reader import JournalReader
from journal.writer import JournalWriter


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


# -- a large body's parse, taken from where the gateway already made it -------------------

_BIG = search.PARSED_ELSEWHERE_CHARS


def _big_body(user_id: str, last: str) -> str:
    return json.dumps(
        {"model": "m", "metadata": {"user_id": user_id}, "messages": [{"role": "user", "content": last + " w" * _BIG}]}
    )


async def _journal(path: Path, requests: dict[str, list[Event]], bodies: str = "full") -> JournalReader:
    writer = JournalWriter(path, bodies=bodies)
    await writer.start()
    for request_id, events in requests.items():
        for seq, event in enumerate(events, 1):
            await writer.append(request_id, seq, event)
    await writer.close()
    return JournalReader(path)


async def test_a_large_body_is_folded_from_the_parse_validation_made(tmp_path: Path) -> None:
    """The writer does not parse a large received body again: the columns and text come from the
    `validated` event's `parsed_body` (here told apart from the text on purpose)."""
    body = _big_body("u-text", "Zebra")
    parsed = orjson.loads(body)
    parsed["metadata"]["user_id"] = "u-parsed"
    parsed["messages"][0]["content"] = "Okapi"
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", body=body, ts=1.0),
        Validated(model="m", parsed_body=parsed),
        Completed(status=200, duration_ms=1.0),
    ]
    with await _journal(tmp_path / "j.db", {"r": events}) as reader:
        row = reader.get_request("r")
        assert row is not None and row["user_id"] == "u-parsed" and row["turns"] == 1
        assert reader.count("okapi") == 1 and reader.count("zebra") == 0
        (_, received), *_ = reader.events("r")
        assert isinstance(received, Received) and received.body == body  # stored as received


async def test_a_large_body_whose_secrets_were_redacted_is_folded_from_what_is_stored(tmp_path: Path) -> None:
    body = _big_body("https://ann:pw-user@host.example/", "Zebra")
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", body=body, ts=1.0),
        Validated(model="m", parsed_body=orjson.loads(body)),  # holds the credential
        Completed(status=200, duration_ms=1.0),
    ]
    with await _journal(tmp_path / "j.db", {"r": events}) as reader:
        row = reader.get_request("r")
        assert row is not None and "pw-user" not in row["user_id"]
        assert "pw-user" not in str(reader.connection.execute("SELECT body FROM request_text").fetchall())
        assert reader.count("zebra") == 1


async def test_a_refused_large_body_is_still_folded(tmp_path: Path) -> None:
    events: list[Event] = [
        Received(method="POST", path="/v1/messages", body=_big_body("u-9", "Zebra"), ts=1.0),
        Rejected(status=400, error_type="invalid_request_error", message="Nope", code="x"),
        Completed(status=400, duration_ms=1.0),
    ]
    with await _journal(tmp_path / "j.db", {"r": events}) as reader:
        row = reader.get_request("r")
        assert row is not None and row["user_id"] == "u-9" and row["turns"] == 1
        assert reader.count("zebra") == 1


async def test_a_relayed_body_is_folded_from_its_parse_unless_the_stored_data_differs(tmp_path: Path) -> None:
    data = json.dumps({"type": "message", "content": [{"type": "text", "text": "Zebra"}]})
    answer = {"type": "message", "content": [{"type": "text", "text": "Okapi"}]}

    def events() -> list[Event]:
        return [
            Received(method="POST", path="/v1/messages", body="{}", ts=1.0),
            Upstream(part="head", status=200, headers={}),
            Upstream(part="body", data=data, parsed=answer),
            Completed(status=200, duration_ms=1.0),
        ]

    with await _journal(tmp_path / "full.db", {"r": events()}) as reader:
        assert reader.count("okapi") == 1 and reader.count("zebra") == 0
    # Stored as fingerprints: what was parsed is not what is stored, and is not indexed.
    with await _journal(tmp_path / "redacted.db", {"r": events()}, bodies="redacted") as reader:
        assert reader.count("okapi") == 0 and reader.count("zebra") == 0
