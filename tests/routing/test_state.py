"""The router's state machines without sockets: circuit breaker, worker health, the registry,
and one request's attempts (which worker, how many, what each outcome does to the worker)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from smg.backends.base import Failure, Lease
from smg.protocol.errors import ApiError
from smg.routing.breaker import BreakerConfig, CircuitBreaker, outcome_of_status
from smg.routing.dispatch import Dispatch
from smg.routing.policies import RouteContext, make_policy
from smg.routing.registry import DuplicateWorker, WorkerRegistry
from smg.routing.retry import RetryConfig
from smg.routing.workers import HealthConfig, Worker, worker_kind
from tests.routing._pool import Clock

NO_WAIT = RetryConfig(max_retries=5, initial_backoff_ms=0, max_backoff_ms=0)


# --- circuit breaker ---------------------------------------------------------------------------


def test_breaker_opens_after_consecutive_failures_and_a_success_resets_the_count() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=3), clock)
    for _ in range(2):
        breaker.record(False)
    breaker.record(True)
    breaker.record(False)
    breaker.record(False)
    assert breaker.state == "closed"
    breaker.record(False)
    assert breaker.state == "open" and not breaker.allows()


def test_breaker_half_opens_after_the_timeout_then_closes_after_enough_successes() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, success_threshold=2, timeout_secs=60), clock)
    breaker.record(False)
    clock.advance(59)
    assert breaker.state == "open"
    clock.advance(1)
    assert breaker.state == "half_open" and breaker.allows()
    breaker.record(True)
    assert breaker.state == "half_open"
    breaker.record(True)
    assert breaker.state == "closed"


def test_a_failure_while_half_open_opens_it_again() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=1, timeout_secs=10), clock)
    breaker.record(False)
    clock.advance(10)
    assert breaker.state == "half_open"
    breaker.record(False)
    assert breaker.state == "open"
    clock.advance(9)
    assert not breaker.allows()


def test_failures_older_than_the_window_do_not_count() -> None:
    clock = Clock()
    breaker = CircuitBreaker(BreakerConfig(failure_threshold=2, window_secs=120), clock)
    breaker.record(False)
    clock.advance(121)
    breaker.record(False)
    assert breaker.state == "closed"


def test_a_disabled_breaker_never_opens() -> None:
    breaker = CircuitBreaker(BreakerConfig(enabled=False, failure_threshold=1))
    for _ in range(5):
        breaker.record(False)
    assert breaker.allows()


def test_what_a_status_counts_as() -> None:
    assert [outcome_of_status(s) for s in (200, 400, 404, 429, 500, 502, 503, 504, 408)] == [
        True,
        True,
        True,
        None,
        False,
        False,
        False,
        False,
        False,
    ]


# --- worker health -----------------------------------------------------------------------------


def _worker(url: str = "http://127.0.0.1:1", **kwargs: object) -> Worker:
    worker = Worker(url=url, connection=worker_kind(url), **kwargs)  # type: ignore[arg-type]
    worker.discovered_as({"m": 4096}, True)
    return worker


def test_health_checks_take_a_worker_out_and_bring_it_back_by_the_thresholds() -> None:
    config = HealthConfig(failure_threshold=3, success_threshold=2)
    worker = _worker()
    for _ in range(2):
        worker.health_checked(False, "503", config)
    assert worker.healthy
    worker.health_checked(False, "503", config)
    assert not worker.healthy and not worker.available
    worker.health_checked(True, None, config)
    assert not worker.healthy
    worker.health_checked(True, None, config)
    assert worker.healthy and worker.available


def test_a_refused_connection_takes_a_worker_out_at_once_and_recovery_half_opens_its_breaker() -> None:
    clock = Clock()
    worker = _worker(breaker=CircuitBreaker(BreakerConfig(failure_threshold=1, timeout_secs=60), clock))
    worker.breaker.record(False)
    worker.refused("connection refused")
    assert not worker.healthy and worker.last_error == "connection refused"
    config = HealthConfig(success_threshold=1)
    worker.health_checked(True, None, config)
    assert worker.healthy and worker.breaker.state == "half_open"


def test_discovery_fills_in_models_and_windows() -> None:
    worker = Worker(url="grpc://127.0.0.1:2", connection="grpc")
    worker.discovered_as({"a": 8192, "b": None}, True, "vllm")
    assert worker.models == {"a", "b"} and worker.context_windows == {"a": 8192}
    assert worker.runtime == "vllm" and worker.serves("a") and not worker.serves("c")


def test_an_external_worker_serves_its_provider_models_by_name() -> None:
    worker = Worker(url="https://api.example", connection="http", external=True, prefixes=("claude-",))
    assert worker.serves("claude-sonnet-4") and not worker.serves("gpt-5")


def test_load_is_the_larger_of_the_gateway_count_and_the_engine_count() -> None:
    worker = _worker()
    worker.in_flight = 2
    assert worker.load == 2
    worker.engine_load = 5
    assert worker.load == 5
    worker.engine_load = 1
    assert worker.load == 2


def test_worker_ids_are_distinct_uuid7s() -> None:
    ids = {Worker(url=f"http://127.0.0.1:{n}", connection="http").id for n in range(1, 50)}
    assert len(ids) == 49
    assert all(i[14] == "7" for i in ids)


# --- registry ----------------------------------------------------------------------------------


def test_registry_refuses_a_second_worker_at_one_url_and_tells_listeners_of_removals() -> None:
    registry = WorkerRegistry()
    gone: list[str] = []
    registry.on_remove(lambda w: gone.append(w.id))
    first = registry.add(_worker())
    with pytest.raises(DuplicateWorker):
        registry.add(_worker())
    assert registry.remove(first.id) is first
    assert first.removed and gone == [first.id] and len(registry) == 0
    assert registry.remove(first.id) is None


# --- dispatch ----------------------------------------------------------------------------------


def _dispatch(workers: Sequence[Worker], retry: RetryConfig = NO_WAIT, idle: list[Worker] | None = None) -> Dispatch:
    return Dispatch(
        backend="http",
        model="m",
        workers=workers,
        policy=make_policy("round_robin"),
        context=RouteContext(model="m"),
        retry=retry,
        on_idle=(idle if idle is not None else []).append,
    )


def _failure(kind: str = "refused") -> Failure:
    return Failure(kind, ApiError(502, "connection refused", code="call_upstream_connection_failed"))  # type: ignore[arg-type]


async def _drive(dispatch: Dispatch, outcomes: list[Failure | int]) -> tuple[list[Lease], ApiError | None]:
    """Consume the attempts as a connector would: each lease gets the next outcome."""
    seen: list[Lease] = []
    attempts = dispatch.attempts()
    try:
        async for lease in attempts:
            seen.append(lease)
            outcome = outcomes.pop(0)
            if isinstance(outcome, Failure):
                lease.failed(outcome)
                continue
            if lease.answered(outcome):
                continue
            break
    except ApiError as err:
        return seen, err
    finally:
        await attempts.aclose()
        dispatch.release()
    return seen, None


async def test_a_refused_worker_is_retried_on_another_and_taken_out() -> None:
    a, b = _worker("http://127.0.0.1:1"), _worker("http://127.0.0.1:2")
    leases, error = await _drive(_dispatch([a, b]), [_failure(), 200])
    assert error is None
    assert [lease.target.url for lease in leases] == [a.url, b.url]
    assert [lease.attempt for lease in leases] == [1, 2]
    assert not a.healthy and b.healthy
    assert a.in_flight == 0 and b.in_flight == 0


async def test_a_retryable_status_is_retried_until_the_attempts_run_out_then_relayed() -> None:
    a = _worker()
    leases, error = await _drive(_dispatch([a], RetryConfig(max_retries=3, initial_backoff_ms=0)), [503, 503, 503])
    assert error is None and len(leases) == 3
    assert leases[-1].routed.attempt == 3


async def test_a_worker_own_500_is_answered_at_once() -> None:
    leases, error = await _drive(_dispatch([_worker()]), [500])
    assert error is None and len(leases) == 1


async def test_a_timeout_is_not_retried() -> None:
    leases, error = await _drive(_dispatch([_worker(), _worker("http://127.0.0.1:2")]), [_failure("timeout")])
    assert len(leases) == 1 and error is not None and error.status == 502


async def test_when_every_worker_is_down_the_last_failure_is_the_answer() -> None:
    a = _worker()
    leases, error = await _drive(_dispatch([a]), [_failure()])
    assert len(leases) == 1
    assert error is not None and error.code == "call_upstream_connection_failed"


async def test_no_available_worker_is_503() -> None:
    a = _worker()
    a.refused("down")
    leases, error = await _drive(_dispatch([a]), [])
    assert leases == [] and error is not None and (error.status, error.code) == (503, "no_available_workers")


async def test_a_lease_holds_the_worker_in_flight_until_the_request_ends() -> None:
    a = _worker()
    dispatch = _dispatch([a])
    attempts = dispatch.attempts()
    lease = await attempts.__anext__()
    lease.answered(200)
    assert a.in_flight == 1
    await attempts.aclose()
    dispatch.release()
    assert a.in_flight == 0


async def test_the_breaker_follows_what_each_attempt_got() -> None:
    a = _worker(breaker=CircuitBreaker(BreakerConfig(failure_threshold=2)))
    await _drive(_dispatch([a], RetryConfig(max_retries=1)), [502])
    await _drive(_dispatch([a], RetryConfig(max_retries=1)), [502])
    assert a.breaker.state == "open" and not a.available


async def test_a_removed_worker_is_released_once_its_last_request_ends() -> None:
    a = _worker()
    idle: list[Worker] = []
    dispatch = _dispatch([a], idle=idle)
    attempts = dispatch.attempts()
    lease = await attempts.__anext__()
    lease.answered(200)
    a.removed = True
    assert idle == []
    await attempts.aclose()
    dispatch.release()
    assert idle == [a]


def test_backoff_grows_by_the_multiplier_up_to_the_cap() -> None:
    retry = RetryConfig(initial_backoff_ms=50, backoff_multiplier=2, max_backoff_ms=150, jitter_factor=0)
    assert [retry.backoff_seconds(n) for n in (1, 2, 3, 4)] == [0.05, 0.1, 0.15, 0.15]
    assert RetryConfig(enabled=False).max_attempts == 1 and RetryConfig(max_retries=5).max_attempts == 5
