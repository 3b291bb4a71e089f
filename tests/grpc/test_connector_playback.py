"""The engine connector alone, over playback engines: what it asks an engine, what it makes of
each answer, and what it reports to the router's leases. No process and no socket.

Each test plays a script (the scripted engine's format) and checks the events the connector
yields, the `GenerateCall`s and aborts the engine saw, and the lease outcomes."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from journal.events import Block, Counted, Error, Event, Rendered, Routed, Tokens
from smg.backends.base import Failure
from smg.backends.grpc.engines.playback import PlaybackEngine, Playbook, Recording
from smg.protocol.errors import ApiError
from tests.inprocess import Leases, call, config, connector, discovered, engine, qwen3, served

A, B = "grpc://127.0.0.1:50001", "grpc://127.0.0.1:50002"


def _blocks(events: list[Event]) -> list[dict[str, Any]]:
    return [e.event for e in events if isinstance(e, Block)]


def _text(events: list[Event]) -> str:
    out = []
    for payload in _blocks(events):
        delta = payload.get("delta")
        if payload["type"] == "content_block_delta" and isinstance(delta, dict):
            out.append(str(delta.get("text", "")))
    return "".join(out)


def _message_delta(events: list[Event]) -> dict[str, Any]:
    return next(p for p in _blocks(events) if p["type"] == "message_delta")


@pytest.fixture
async def book() -> Playbook:
    book = Playbook()
    book.add(A, engine())
    book.add(B, engine())
    return book


def _engine(book: Playbook, url: str = A) -> PlaybackEngine:
    return book.engines[url]


async def test_a_generation_is_routed_rendered_then_tokens_and_blocks(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    _engine(book).script({"text": "Hello there, friend.", "chunk_size": 3})
    leases = Leases(pool)
    events = await served(conn, call({"max_tokens": 64}), pool, leases)
    kinds = [e.kind for e in events]
    assert kinds[:2] == ["routed", "rendered"] and kinds[-1] == "block"
    assert _text(events) == "Hello there, friend."
    [sent] = _engine(book).received
    [rendered] = [e for e in events if isinstance(e, Rendered)]
    assert rendered.prompt_tokens == len(sent.input_ids)
    assert (
        qwen3()
        .decode(sent.input_ids, skip_special_tokens=False)
        .endswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")
    )
    assert sent.max_tokens == 64 and sent.stream is False
    tokens = [e for e in events if isinstance(e, Tokens)]
    assert tokens[-1].finish_reason == "stop"
    delta = _message_delta(events)
    assert delta["delta"] == {"stop_reason": "end_turn"}
    assert leases.outcomes == [(A, 200)]
    await conn.close()
    assert _engine(book).closed


async def test_an_unreachable_engine_is_reported_failed_and_the_next_worker_answers(book: Playbook) -> None:
    conn = connector(config(A, B), book)
    pool = await discovered(conn, A, B)
    _engine(book, A).down = True
    _engine(book, B).script({"text": "from B"})
    leases = Leases(pool)
    events = await served(conn, call({}), pool, leases)
    assert [e.worker for e in events if isinstance(e, Routed)] == [A, B]
    [(url, failure), (other, status)] = leases.outcomes
    assert isinstance(failure, Failure) and (url, failure.kind, failure.retryable) == (A, "unavailable", True)
    assert failure.error.code == "engine_unavailable" and failure.error.status == 502
    assert (other, status) == (B, 200)
    assert _text(events) == "from B"
    # the failed attempt's engine call is not journaled twice: one rendered, one message
    assert [e.kind for e in events].count("rendered") == 1
    assert _engine(book, B).received[0].request_id.endswith("-2")


@pytest.mark.parametrize(
    ("code", "status", "machine"),
    [
        ("INVALID_ARGUMENT", 400, "engine_rejected_request"),
        ("RESOURCE_EXHAUSTED", 503, "engine_overloaded"),
        ("INTERNAL", 500, "engine_error"),
    ],
)
async def test_an_engine_refusal_before_any_output_is_answered_as_its_status(
    book: Playbook, code: str, status: int, machine: str
) -> None:
    conn = connector(config(A, B), book)
    pool = await discovered(conn, A, B)
    _engine(book).script({"error": {"code": code, "message": "prompt too long", "after_tokens": 0}})
    leases = Leases(pool)
    events = await served(conn, call({"stream": True}), pool, leases)
    [error] = [e for e in events if isinstance(e, Error)]
    assert (error.status, error.code) == (status, machine)
    assert "prompt too long" in error.message
    assert not _blocks(events)  # no message_start before the engine's first answer
    assert leases.outcomes == [(A, status)]  # the engine's own answer: never tried elsewhere
    assert _engine(book).aborts == []  # the engine dropped the request itself


async def test_an_engine_that_does_not_answer_in_time_is_a_failed_attempt(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    _engine(book).script({"error": {"code": "DEADLINE_EXCEEDED", "message": "slow"}})
    leases = Leases(pool)
    with pytest.raises(ApiError) as refused:
        await served(conn, call({}), pool, leases)
    assert (refused.value.status, refused.value.code) == (504, "engine_timeout")
    [(url, failure)] = leases.outcomes
    assert isinstance(failure, Failure) and failure.kind == "unavailable"


async def test_an_engine_error_after_output_ends_the_message_with_a_stream_error(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    oom = {"code": "INTERNAL", "message": "oom", "after_tokens": 2}
    _engine(book).script({"text": "partial answer that breaks", "error": oom})
    leases = Leases(pool)
    events = await served(conn, call({"stream": True}), pool, leases)
    assert events[-1].kind == "error"
    error = events[-1]
    assert isinstance(error, Error) and (error.status, error.code) == (500, "engine_stream_error")
    assert error.message == "Stream error: oom"
    assert [p["type"] for p in _blocks(events)][0] == "message_start"
    assert "message_stop" not in [p["type"] for p in _blocks(events)]
    assert leases.outcomes == [(A, 500)]


async def test_an_engine_that_dies_mid_answer_takes_its_worker_out_without_a_retry(book: Playbook) -> None:
    conn = connector(config(A, B), book)
    pool = await discovered(conn, A, B)
    _engine(book).script({"text": "one two three four five", "exit_after": 2})
    leases = Leases(pool)
    events = await served(conn, call({"stream": True}), pool, leases)
    error = events[-1]
    assert isinstance(error, Error) and (error.status, error.code) == (500, "engine_stream_error")
    [(url, failure)] = leases.outcomes
    assert isinstance(failure, Failure) and (url, failure.kind, failure.retryable) == (A, "unavailable", False)
    assert _engine(book, B).received == []


async def test_an_engine_that_dies_before_answering_is_a_502(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    _engine(book).script({"text": "never sent", "exit_after": 0})
    leases = Leases(pool)
    with pytest.raises(ApiError) as refused:
        await served(conn, call({}), pool, leases)
    assert (refused.value.status, refused.value.code) == (502, "engine_unavailable")
    [(url, failure)] = leases.outcomes
    assert isinstance(failure, Failure) and failure.kind == "unavailable" and failure.retryable


@pytest.mark.parametrize("stream", [False, True])
async def test_a_finish_reason_error_is_an_engine_error_never_an_empty_success(book: Playbook, stream: bool) -> None:
    # vLLM's answer for a request the engine failed: an empty `complete`, "error".
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    _engine(book).script({"token_ids": [], "eos": False, "finish_reason": "error"})
    leases = Leases(pool)
    events = await served(conn, call({"stream": stream}), pool, leases)
    error = events[-1]
    assert isinstance(error, Error) and (error.status, error.code) == (500, "engine_error")
    assert not _blocks(events)
    assert leases.outcomes == [(A, 500)]


async def test_a_stop_sequence_the_gateway_matches_aborts_the_engine(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    playback = _engine(book)
    playback.script({"text": "Counting: one two THE END three four", "chunk_size": 1})
    events = await served(conn, call({"stop_sequences": ["THE END"], "max_tokens": 64, "stream": True}), pool)
    assert _text(events) == "Counting: one two "
    assert _message_delta(events)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "THE END"}
    [sent] = playback.received
    assert sent.stop_token_ids == []  # a multi-token stop: only the gateway can match it
    await conn.close()  # waits for the abort task
    assert playback.aborts == [sent.request_id] and playback.cancelled == [sent.request_id]


async def test_a_single_token_stop_is_sent_as_a_stop_id_and_reported_as_the_string(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    stop_id = qwen3().token_id("</tool_call>")
    assert stop_id is not None
    _engine(book).script({"text": "before</tool_call>after"})
    events = await served(conn, call({"stop_sequences": ["</tool_call>"]}), pool)
    assert _engine(book).received[0].stop_token_ids == [stop_id]
    assert _text(events) == "before"
    assert _message_delta(events)["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "</tool_call>"}


async def test_a_client_that_goes_away_mid_answer_has_the_engine_request_aborted(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    playback = _engine(book)
    playback.script({"text": "a long answer that the client will not wait for", "hold_after": 2})
    seen: list[Event] = []

    async def client() -> None:
        async for event in conn.handle(call({"stream": True, "max_tokens": 64}), pool, Leases(pool).__aiter__()):
            seen.append(event)

    reading = asyncio.create_task(client())
    await playback.held.wait()  # two tokens sent, the engine holds the rest
    reading.cancel()  # the client went away: its request's task is cancelled
    with pytest.raises(asyncio.CancelledError):
        await reading
    await conn.close()
    assert sum(len(e.ids) for e in seen if isinstance(e, Tokens)) == 2
    [sent] = playback.received
    assert playback.aborts == [sent.request_id] == playback.cancelled


async def test_count_tokens_and_max_tokens_zero_are_answered_without_an_engine(book: Playbook) -> None:
    conn = connector(config(A), book)
    pool = await discovered(conn, A)
    counted = await served(conn, call({}, endpoint="count_tokens"), pool)
    assert [e.kind for e in counted] == ["routed", "rendered", "counted"]
    [count] = [e for e in counted if isinstance(e, Counted)]
    empty = await served(conn, call({"max_tokens": 0}), pool)
    start = _blocks(empty)[0]
    assert [p["type"] for p in _blocks(empty)] == ["message_start", "message_delta", "message_stop"]
    assert start["message"]["usage"]["input_tokens"] == count.input_tokens
    assert _message_delta(empty)["delta"] == {"stop_reason": "max_tokens"}
    assert _engine(book).received == []


async def test_a_prompt_beyond_the_worker_window_is_refused_before_the_engine(book: Playbook) -> None:
    small = Playbook()
    small.add(A, engine(max_context_length=8))
    conn = connector(config(A), small)
    pool = await discovered(conn, A)
    with pytest.raises(ApiError) as refused:
        await served(conn, call({"max_tokens": 4}), pool)
    assert refused.value.status == 400 and small.engines[A].received == []


async def test_a_journaled_generation_played_back_gives_the_same_blocks(book: Playbook) -> None:
    conn = connector(config(A, B), book)
    pool = await discovered(conn, A, B)
    _engine(book, A).script({"text": "Hello! 你好 🎉 — recorded once.", "chunk_size": 2})
    first = await served(conn, call({"stream": True}), pool[:1])
    _engine(book, B).script(Recording.from_events(first))
    again = await served(conn, call({"stream": True}), pool[1:])
    strip = [p for p in _blocks(first) if p["type"] != "message_start"]
    assert [p for p in _blocks(again) if p["type"] != "message_start"] == strip
    assert [e.ids for e in again if isinstance(e, Tokens)] == [e.ids for e in first if isinstance(e, Tokens)]
