"""Offline replay drives the live path's session: a journal written by the session (as the
connectors write it, here in process) recomputes to the same blocks, whatever the engine did —
including an engine that failed the request with `finish_reason: error`, and a retry on
another worker after an unreachable one."""

from __future__ import annotations

from typing import Any

import pytest

from journal.events import Block, Completed, Event, Routed
from replay.offline import check
from smg.pipeline.engine import EngineChunk, EngineDone, EngineError
from smg.pipeline.prepare import prepare
from smg.pipeline.render import render_prompt
from smg.pipeline.session import Session
from smg.protocol.parse import parse_create_message
from tests.pipeline import _toy

MODEL = "qwen3-fixture"


def journal_of(attempts: list[list[Any]], **fields: Any) -> list[Event]:
    """The events a connector journals for these attempts' engine answers."""
    tokenizer = _toy.fixture("qwen3")
    body = {"model": MODEL, "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}], **fields}
    request = parse_create_message(body)
    prepared = prepare(
        request, MODEL, True, tokenizer, render_prompt(tokenizer, request), "msg_o", None,
        tool_parser=None, reasoning_parser=None,
    )
    session: Session | None = None
    events: list[Event] = []
    for answers in attempts:
        events.append(Routed(backend="grpc", worker="grpc://w", model=MODEL, policy="random"))
        if session is None:
            session, rendered = Session.start(prepared, [4002], [])
            events.append(rendered)
        else:
            session.attempt()
        for answer in answers:
            events += session.fail(answer) if isinstance(answer, EngineError) else session.feed(answer)
            if session.over:
                break
    assert session is not None
    status = session.outcome.status if session.outcome is not None else 200
    return [*events, Completed(status=status, duration_ms=1.0)]


HELLO = _toy.fixture("qwen3").encode("Hello there")
CASES = {
    "answered": [[EngineChunk(HELLO[:1], 9, 1), EngineDone("stop", 9, 2, token_ids=HELLO[1:])]],
    "stop string": [[EngineChunk(_toy.fixture("qwen3").encode("a STOP b"), 9, 3)]],
    "finish reason error": [[EngineChunk(HELLO, 9, 2), EngineDone("error", 9, 2)]],
    "retried after an unreachable worker": [
        [EngineError("UNAVAILABLE", "refused")],
        [EngineDone("stop", 9, 2, token_ids=HELLO)],
    ],
}


@pytest.mark.parametrize("name", CASES)
def test_offline_replay_recomputes_what_the_session_journaled(name: str) -> None:
    fields = {"stop_sequences": ["STOP"]} if name == "stop string" else {}
    events = journal_of(CASES[name], **fields)
    assert any(isinstance(e, Block) for e in events)
    report = check(events, _toy.fixture("qwen3"))
    assert not report.partial
    assert report.identical, report.differences
