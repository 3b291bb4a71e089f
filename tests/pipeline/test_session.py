"""The generation session, sans I/O: engine answers in, journal events, `over`, `abort_engine`
and the failed attempt's outcome out. Each row is one engine conversation and what it must
decide; nothing here opens a socket."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from journal.events import Block, Error, Event, Rendered, Tokens
from smg.pipeline.engine import EngineChunk, EngineDone, EngineError, EngineEvent
from smg.pipeline.prepare import Prepared, prepare
from smg.pipeline.render import render_prompt
from smg.pipeline.session import Session
from smg.protocol.parse import parse_create_message
from tests.pipeline import _toy

MODEL = "qwen3-fixture"


def prepared(**fields: Any) -> Prepared:
    tokenizer = _toy.fixture("qwen3")
    body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    request = parse_create_message(body)
    prompt = render_prompt(tokenizer, request)
    return prepare(
        request, MODEL, False, tokenizer, prompt, "msg_s", "fixture", tool_parser=None, reasoning_parser=None
    )


def ids(text: str) -> list[int]:
    return _toy.fixture("qwen3").encode(text)


def feed(session: Session, answers: list[EngineEvent | EngineError | str]) -> list[Event]:
    """Drive the session as a connector does: stop feeding once it is over."""
    events: list[Event] = []
    for answer in answers:
        if isinstance(answer, EngineError):
            events += session.fail(answer)
        elif answer == "end":
            events += session.end()
        else:
            assert not isinstance(answer, str)
            events += session.feed(answer)
        if session.over:
            break
    return events


def text_of(events: list[Event]) -> str:
    return "".join(
        e.event["delta"].get("text", "")
        for e in events
        if isinstance(e, Block) and e.event["type"] == "content_block_delta"
    )


def stop_reason(events: list[Event]) -> str | None:
    deltas = [e.event for e in events if isinstance(e, Block) and e.event["type"] == "message_delta"]
    return deltas[-1]["delta"]["stop_reason"] if deltas else None


@dataclass
class Row:
    name: str
    answers: list[Any]
    text: str | None = None
    stop: str | None = None
    settled: bool = True  # False: the engine is to be aborted
    error: tuple[int, str] | None = None  # the error event's status and code
    retry: bool = False
    worker_down: bool = False
    fields: dict[str, Any] = field(default_factory=dict)


HELLO = ids("Hello there")
ROWS = [
    Row("chunks then the end", [EngineChunk(HELLO[:1], 9, 1), EngineChunk(HELLO[1:], 9, len(HELLO)),
                                EngineDone("stop", 9, len(HELLO))], text="Hello there", stop="end_turn"),
    Row("one final answer", [EngineDone("length", 9, len(HELLO), token_ids=HELLO)], text="Hello there",
        stop="max_tokens"),
    Row("a stop string the gateway matches: over, engine unsettled",
        [EngineChunk(ids("one two"), 9, 2), EngineChunk(ids(" STOP three"), 9, 4), EngineDone("stop", 9, 9)],
        text="one two ", stop="stop_sequence", settled=False, fields={"stop_sequences": ["STOP"]}),
    Row("finish reason error is a failure, never an empty success",
        [EngineChunk(HELLO, 9, len(HELLO)), EngineDone("error", 9, len(HELLO))],
        text="Hello there", error=(500, "engine_stream_error")),
    Row("refused before any output", [EngineError("INVALID_ARGUMENT", "prompt too long")],
        error=(400, "engine_rejected_request")),
    Row("overloaded", [EngineError("RESOURCE_EXHAUSTED", "queue full")], error=(503, "engine_overloaded")),
    Row("unreachable before any output: retried elsewhere, no event", [EngineError("UNAVAILABLE", "refused")],
        retry=True),
    Row("gone mid-answer: the worker is down", [EngineChunk(HELLO, 9, 2), EngineError("UNAVAILABLE", "reset")],
        text="Hello there", error=(500, "engine_stream_error"), worker_down=True),
    Row("a stream closed without its end", [EngineChunk(HELLO, 9, 2), "end"], text="Hello there",
        error=(500, "engine_stream_error")),
    Row("the client leaves mid-answer", [EngineChunk(HELLO, 9, 2)], text="Hello there", settled=False),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
def test_session(row: Row) -> None:
    session, rendered = Session.start(prepared(**row.fields), [4002], [])
    assert isinstance(rendered, Rendered) and rendered.settings is not None
    events = feed(session, row.answers)
    if row.text is not None:
        assert text_of(events) == row.text
    assert stop_reason(events) == row.stop
    assert session.abort_engine is not row.settled
    errors = [e for e in events if isinstance(e, Error)]
    assert [(e.status, e.code) for e in errors] == ([row.error] if row.error else [])
    if row.retry or row.error:
        assert session.outcome is not None
        assert (session.outcome.retry, session.outcome.worker_down) == (row.retry, row.worker_down)
    else:
        assert session.outcome is None


def test_message_start_waits_for_the_engines_first_answer() -> None:
    session, _ = Session.start(prepared(), [4002], [])
    assert not session.started
    events = session.feed(EngineChunk([], 9, 0))
    assert session.started
    assert [type(e) for e in events][:2] == [Block, Tokens]
    assert isinstance(events[0], Block) and events[0].event["type"] == "message_start"


def test_a_retry_keeps_the_generation_and_restarts_the_counts() -> None:
    session, _ = Session.start(prepared(), [4002], [])
    assert feed(session, [EngineError("UNAVAILABLE", "refused")]) == []
    assert session.outcome is not None and session.outcome.retry
    session.attempt()
    assert session.outcome is None and not session.over and not session.started
    events = feed(session, [EngineDone("stop", 9, len(HELLO), token_ids=HELLO)])
    assert text_of(events) == "Hello there" and stop_reason(events) == "end_turn"
    assert not session.abort_engine


def test_the_first_engines_eos_ids_join_the_tokenizers_in_the_rendered_settings() -> None:
    prep = prepared()
    _, rendered = Session.start(prep, [77, 4002], [5, 6])
    assert rendered.settings is not None
    assert rendered.settings["eos_token_ids"] == sorted({77, 4002, *prep.tokenizer.eos_token_ids})
    assert rendered.stop_ids == [5, 6] and rendered.prompt_tokens == len(prep.prompt.ids)
