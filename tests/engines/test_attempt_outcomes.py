"""How an engine attempt's end reaches the router, in process: the session's outcome settled on
the router's own leases (`smg.routing.dispatch`), as the single-engine connector and the PD
connector's decode leg both settle it. Each row: the engine's answers on each attempt, then
how many workers were tried, which are still healthy, and whether an error reached the client."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from journal.events import Error
from smg.backends.grpc.calls import settle
from smg.pipeline.engine import EngineChunk, EngineDone, EngineError
from smg.pipeline.prepare import prepare
from smg.pipeline.render import render_prompt
from smg.pipeline.session import Session
from smg.protocol.errors import ApiError
from smg.protocol.parse import parse_create_message
from smg.routing.dispatch import Dispatch
from smg.routing.policies import RouteContext, make_policy
from smg.routing.retry import RetryConfig
from smg.routing.workers import Worker
from tests.pipeline import _toy

MODEL = "qwen3-fixture"
HELLO = _toy.fixture("qwen3").encode("Hello")


def session() -> Session:
    tokenizer = _toy.fixture("qwen3")
    request = parse_create_message({"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    prepared = prepare(
        request, MODEL, False, tokenizer, render_prompt(tokenizer, request), "msg_a", None,
        tool_parser=None, reasoning_parser=None,
    )
    return Session.start(prepared, [], [])[0]


@dataclass
class Row:
    name: str
    attempts: list[list[Any]]
    tried: int
    healthy: tuple[bool, bool]
    error: str | None  # the client's error code, if one reached it


ROWS = [
    Row("answered", [[EngineDone("stop", 3, 1, token_ids=HELLO)]], 1, (True, True), None),
    Row("unreachable before any output: the next worker answers", [[EngineError("UNAVAILABLE", "refused")],
        [EngineDone("stop", 3, 1, token_ids=HELLO)]], 2, (False, True), None),
    Row("refused by the engine: answered, the worker stays", [[EngineError("INVALID_ARGUMENT", "bad")]], 1,
        (True, True), "engine_rejected_request"),
    Row("gone mid-answer: not retried, the worker is out", [[EngineChunk(HELLO, 3, 1),
        EngineError("UNAVAILABLE", "reset")]], 1, (False, True), "engine_stream_error"),
]


@pytest.mark.parametrize("row", ROWS, ids=lambda r: r.name)
async def test_an_attempts_outcome_reaches_the_router(row: Row) -> None:
    workers = [Worker(url=f"grpc://127.0.0.1:{port}", connection="grpc") for port in (1, 2)]
    for worker in workers:
        worker.discovered_as({MODEL: 4096}, True)
    dispatch = Dispatch(
        backend="grpc",
        generates=True,
        model=MODEL,
        workers=workers,
        policy=make_policy("round_robin"),
        context=RouteContext(model=MODEL),
        retry=RetryConfig(max_retries=5, initial_backoff_ms=0, max_backoff_ms=0),
        on_idle=lambda _: None,
    )
    gen = session()
    answers = list(row.attempts)
    tried: list[str] = []
    errors: list[Error] = []
    attempts = dispatch.attempts()
    try:
        async for lease in attempts:
            tried.append(lease.target.url)
            if len(tried) > 1:
                gen.attempt()
            for answer in answers.pop(0):
                events = gen.fail(answer) if isinstance(answer, EngineError) else gen.feed(answer)
                errors += [e for e in events if isinstance(e, Error)]
                if gen.over:
                    break
            if not settle(lease, gen):
                break
    except ApiError as err:  # the router's own answer once the attempts run out
        pytest.fail(f"the attempts ran out: {err}")
    finally:
        await attempts.aclose()
        dispatch.release()
    assert len(tried) == row.tried and len(set(tried)) == row.tried
    first = next(w for w in workers if w.url == tried[0])
    other = next(w for w in workers if w.url != tried[0])
    assert (first.healthy, other.healthy) == row.healthy
    assert [e.code for e in errors] == ([row.error] if row.error else [])
