"""The router in front of engine connectors over playback engines: which worker and pool each
request reaches, failover when an engine does not answer, the retry limit, the circuit breaker
and a worker taken out when its engine dies mid-answer. No process and no socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace

import pytest

from journal.events import Block, Error, Event, Routed
from smg.backends.grpc.backend import EngineConnector
from smg.backends.grpc.engines.playback import Playbook
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.protocol.errors import ApiError
from smg.routing.breaker import BreakerConfig
from smg.routing.retry import RetryConfig
from smg.routing.router import Router, WorkerSpec
from tests.inprocess import MODEL, call, config, engine

URLS = [f"grpc://127.0.0.1:5000{i}" for i in range(3)]
NO_WAIT = RetryConfig(max_retries=3, initial_backoff_ms=0, max_backoff_ms=0, jitter_factor=0)


async def _router(
    book: Playbook,
    urls: list[str],
    *,
    policy: str = "round_robin",
    retry: RetryConfig = NO_WAIT,
    breaker: BreakerConfig | None = None,
) -> Router:
    settings = config(*urls)
    router_config = replace(settings.router, policy=policy, retry=retry, breaker=breaker or BreakerConfig())
    router = Router(router_config, {"grpc": EngineConnector(settings, clients=book)})
    await router.start([WorkerSpec(url=u) for u in urls])
    return router


@pytest.fixture
async def book() -> Playbook:
    book = Playbook()
    for url in URLS:
        book.add(url, engine())
    return book


@pytest.fixture
async def router(book: Playbook) -> AsyncIterator[Router]:
    router = await _router(book, URLS)
    try:
        yield router
    finally:
        await router.close()


async def _events(router: Router, body: dict[str, object] | None = None) -> list[Event]:
    return [event async for event in router.handle(call(body or {}))]


def _worker(events: list[Event]) -> str:
    """The worker that answered: the last attempt's."""
    worker = [e.worker for e in events if isinstance(e, Routed)][-1]
    assert worker is not None
    return worker


def _healthy(router: Router) -> set[str]:
    return {w.url for w in router.registry.all() if w.healthy}


async def test_round_robin_spreads_requests_over_the_engines(router: Router, book: Playbook) -> None:
    served = [_worker(await _events(router)) for _ in range(6)]
    assert sorted(served) == sorted(URLS * 2)
    assert [len(book.engines[u].received) for u in URLS] == [2, 2, 2]


async def test_an_engine_that_does_not_answer_is_failed_over_and_its_worker_taken_out(
    router: Router, book: Playbook
) -> None:
    book.engines[URLS[0]].down = True
    answered = set()
    for _ in range(4):
        events = await _events(router)
        assert any(isinstance(e, Block) and e.event["type"] == "message_stop" for e in events)
        answered.add(_worker(events))
    assert answered == set(URLS[1:])
    assert _healthy(router) == set(URLS[1:])
    routed = [e for e in events if isinstance(e, Routed)]
    assert [r.attempt for r in routed] == list(range(1, len(routed) + 1))


async def test_when_no_engine_answers_the_last_failure_is_the_answer_after_the_retry_limit(book: Playbook) -> None:
    for url in URLS:
        book.engines[url].down = True
    router = await _router(book, URLS, retry=replace(NO_WAIT, max_retries=1))
    try:
        seen: list[Event] = []
        with pytest.raises(ApiError) as refused:
            async for event in router.handle(call({})):
                seen.append(event)
        assert (refused.value.status, refused.value.code) == (503, "no_available_workers")
    finally:
        await router.close()
    # discovery found them down: no attempt at all
    assert seen == []


async def test_the_attempts_on_engines_that_do_not_answer_are_bounded_by_max_retries(book: Playbook) -> None:
    router = await _router(book, URLS, retry=replace(NO_WAIT, max_retries=2))
    try:
        for url in URLS:
            book.engines[url].down = True  # after discovery: the router still takes them for up
        seen: list[Event] = []
        with pytest.raises(ApiError) as refused:
            async for event in router.handle(call({})):
                seen.append(event)
        assert (refused.value.status, refused.value.code) == (502, "engine_unavailable")
        assert len([e for e in seen if isinstance(e, Routed)]) == 2  # `--retry-max-retries` counts every attempt
    finally:
        await router.close()


async def test_an_engine_own_failure_is_answered_once_and_opens_the_breaker(book: Playbook) -> None:
    breaker = BreakerConfig(failure_threshold=2, timeout_secs=3600)
    router = await _router(book, URLS[:2], breaker=breaker)
    failing, good = book.engines[URLS[0]], book.engines[URLS[1]]
    failing.script({"error": {"code": "INTERNAL", "message": "oom"}, "repeat": True})
    try:
        outcomes = []
        for _ in range(6):
            events = await _events(router)
            errors = [e for e in events if isinstance(e, Error)]
            outcomes.append((_worker(events), errors[0].code if errors else None))
    finally:
        await router.close()
    # round robin alternates until the failing worker's breaker opens after its second 500
    assert outcomes[:4] == [(URLS[0], "engine_error"), (URLS[1], None)] * 2
    assert outcomes[4:] == [(URLS[1], None)] * 2
    assert len(failing.received) == 2 and len(good.received) == 4
    [failing_worker] = [w for w in router.registry.all() if w.url == URLS[0]]
    assert failing_worker.breaker.state == "open"


async def test_an_engine_that_dies_mid_answer_is_not_retried_and_its_worker_is_taken_out(
    router: Router, book: Playbook
) -> None:
    book.engines[URLS[0]].script({"text": "one two three four", "exit_after": 2})
    events = await _events(router, {"stream": True})
    assert _worker(events) == URLS[0]
    error = events[-1]
    assert isinstance(error, Error) and error.code == "engine_stream_error"
    assert len([e for e in events if isinstance(e, Routed)]) == 1
    assert URLS[0] not in _healthy(router)
    assert {_worker(await _events(router)) for _ in range(4)} == set(URLS[1:])


async def test_each_model_is_served_by_the_pool_whose_engines_serve_it() -> None:
    grpc_urls, zmq_url = URLS[:2], "ipc:///tmp/smg-playback-pool.sock"  # nothing listens: played back
    book = Playbook()
    for url in grpc_urls:
        book.add(url, engine())
    other = book.add(zmq_url, engine("other-model"))
    settings = config(*grpc_urls, zmq_url)
    tokenizers = TokenizerRegistry()
    connectors = {
        "grpc": EngineConnector(settings, tokenizers, clients=book),
        "zmq": EngineConnector(settings, tokenizers, name="zmq", clients=book),
    }
    router = Router(replace(settings.router, policy="round_robin", retry=NO_WAIT, igw=True), connectors)
    await router.start([WorkerSpec(url=u) for u in [*grpc_urls, zmq_url]])
    try:
        for model, backend, urls in ((MODEL, "grpc", set(grpc_urls)), ("other-model", "zmq", {zmq_url})):
            seen = set()
            for _ in range(4):
                events = [e async for e in router.handle(call({"model": model}))]
                routed = next(e for e in events if isinstance(e, Routed))
                assert (routed.model, routed.backend) == (model, backend)
                seen.add(routed.worker)
            assert seen == urls
        with pytest.raises(ApiError) as refused:
            _ = [e async for e in router.handle(call({"model": "nobody-serves-this"}))]
        assert (refused.value.status, refused.value.code) == (404, "model_not_found")
    finally:
        await router.close()
    assert len(other.received) == 4
