"""One request's attempts: the policy picks a worker of the pool for each (and, with
`--dp-minimum-tokens-scheduler`, the rank policy the rank of its engine), the worker's
in-flight count and circuit breaker follow what happened, and the retry rules decide whether
another attempt follows. Connectors consume `attempts()`; they never pick a worker.

The per-attempt metrics (worker selection, retries, upstream answers, breaker outcomes and
transitions) are counted here, where each attempt is leased and settled."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import replace

from journal.events import Routed
from smg.backends.base import Failure, Lease, Target
from smg.observability import metrics, tracing
from smg.protocol.errors import ApiError
from smg.routing.breaker import outcome_of_status
from smg.routing.policies import Policy, RouteContext
from smg.routing.policies.dp_rank import MinimumTokensPolicy
from smg.routing.retry import RETRYABLE_FAILURES, RETRYABLE_STATUSES, RetryConfig
from smg.routing.workers import Worker

_CANDIDATES_JOURNALED = 16


def no_available_workers() -> ApiError:
    return ApiError(503, "All workers are unavailable (circuit breaker open or unhealthy)", code="no_available_workers")


class _Lease:
    __slots__ = ("worker", "attempt", "routed", "failure", "status", "retry", "_more", "settled")

    def __init__(self, worker: Worker, attempt: int, routed: Routed, more: bool) -> None:
        self.worker = worker
        self.attempt = attempt
        self.routed = routed
        self.failure: Failure | None = None
        self.status: int | None = None
        self.retry = False
        self._more = more
        self.settled = False

    @property
    def target(self) -> Target:
        return self.worker

    def failed(self, failure: Failure) -> None:
        self.failure = failure

    def answered(self, status: int) -> bool:
        self.status = status
        self.retry = self._more and status in RETRYABLE_STATUSES
        return self.retry


class Dispatch:
    """The attempts of one request on one pool."""

    def __init__(
        self,
        *,
        backend: str,
        generates: bool = False,
        model: str,
        workers: Sequence[Worker],
        policy: Policy,
        context: RouteContext,
        retry: RetryConfig,
        on_idle: Callable[[Worker], None],
        empty: Callable[[], ApiError] = no_available_workers,
        endpoint: str = "messages",
        ranks: MinimumTokensPolicy | None = None,
    ) -> None:
        self._empty = empty
        self._ranks = ranks
        self._backend = backend
        self._generates = generates
        self._endpoint = "messages" if endpoint == "messages" else "other"  # the reference's label
        self._model = model
        self._workers = workers
        self._policy = policy
        self._context = context
        self._retry = retry
        self._on_idle = on_idle
        self._held: _Lease | None = None

    async def attempts(self) -> AsyncGenerator[Lease, None]:
        tried: set[str] = set()
        last: Failure | None = None
        max_attempts = self._retry.max_attempts
        for number in range(1, max_attempts + 1):
            if number > 1:
                await asyncio.sleep(self._retry.backoff_seconds(number - 1))
            lease = self._lease(number, tried, last, more=number < max_attempts)
            tried.add(lease.worker.id)
            try:
                yield lease
            finally:
                self._settle(lease)
            if lease.failure is not None:
                last = lease.failure
                if lease.failure.retryable and lease.failure.kind in RETRYABLE_FAILURES and number < max_attempts:
                    continue
                raise lease.failure.error
            if not lease.retry:
                return
        if last is not None:
            raise last.error

    def release(self) -> None:
        """The request is over: settle the attempt still held (a stream that ended, a client gone)."""
        if self._held is not None:
            self._settle(self._held)

    def keyed_lease(self, number: int, key: str) -> _Lease:
        """A lease whose worker the policy chooses with `key` as the routing key (an EPD media
        item's content hash: the same image goes to the same encode worker)."""
        context = self._context
        self._context = replace(context, routing_key=key, text="")
        try:
            return self._lease(number, set(), None, more=False)
        finally:
            self._context = context

    def _lease(self, number: int, tried: set[str], last: Failure | None, *, more: bool) -> _Lease:
        available = [w for w in self._workers if w.available]
        # A retry prefers another worker, but falls back to the same one when it is the only one.
        preferred = [w for w in available if w.id not in tried] or available
        if not preferred:
            # Every worker is down after a failure: report that failure, not the pool state.
            raise last.error if last is not None else self._empty()
        with tracing.stage("select_worker", policy=self._policy.name, attempt=number):
            choice = self._policy.choose(preferred, self._context)
            if self._ranks is not None:
                choice = self._ranks.choose_rank(choice, preferred, self._context.cost)
        worker = choice.worker
        m = metrics.current
        if m is not None:
            m.selection.labels(worker.role, worker.connection, self._model, self._policy.name).inc()
            m.worker_requests.labels(worker.url, self._model).inc()
            if number > 1:
                m.retries.labels(worker.role, self._endpoint).inc()
        routed = Routed(
            backend=self._backend,
            worker=worker.key,
            model=self._model,
            policy=self._policy.name,
            attempt=number,
            candidates=[w.key for w in preferred[:_CANDIDATES_JOURNALED]],
            reason=choice.reason,
        )
        worker.in_flight += 1
        lease = _Lease(worker, number, routed, more)
        self._held = lease
        return lease

    def _settle(self, lease: _Lease) -> None:
        if lease.settled:
            return
        lease.settled = True
        if self._held is lease:
            self._held = None
        worker = lease.worker
        worker.in_flight -= 1
        failure = lease.failure
        outcome: bool | None = None
        before = worker.breaker.state
        if failure is not None:
            outcome = False
            worker.breaker.record(False)
            if failure.kind in ("refused", "unavailable"):
                # The address did not answer: every data-parallel rank behind it (`url@rank`) is out.
                for other in self._workers:
                    if other.url == worker.url:
                        other.refused(failure.error.message)
        elif lease.status is not None:
            outcome = outcome_of_status(lease.status)
            if outcome is not None:
                worker.breaker.record(outcome)
        m = metrics.current
        if m is not None:
            self._count_settlement(m, lease, outcome, before)
        if worker.removed and worker.in_flight == 0:
            self._on_idle(worker)

    def _count_settlement(self, m: metrics.Metrics, lease: _Lease, outcome: bool | None, before: str) -> None:
        worker = lease.worker
        if lease.attempt > 1 and lease.attempt == self._retry.max_attempts:
            failure = lease.failure
            if (failure is not None and failure.retryable and failure.kind in RETRYABLE_FAILURES) or (
                failure is None and lease.status in RETRYABLE_STATUSES
            ):
                m.retries_exhausted.labels(worker.role, self._endpoint).inc()
        if lease.status is not None:
            m.upstream_responses.labels(self._backend_label, str(lease.status), "").inc()
        if outcome is not None:
            m.cb_outcomes.labels(worker.url, "success" if outcome else "failure").inc()
            state = worker.breaker.state
            if state != before:
                m.cb_transitions.labels(worker.url, before, state).inc()

    @property
    def _backend_label(self) -> str:
        # The reference's router types: its gRPC router generates, its HTTP router relays.
        return "grpc" if self._generates else "http"


class _PairLease(_Lease):
    """The decode leg's lease, carrying the prefill leg's (and an EPD attempt's encode legs)."""

    __slots__ = ("prefill", "encoders", "_encode")

    def __init__(self, decode: _Lease, prefill: _Lease, encode: Dispatch | None = None) -> None:
        super().__init__(decode.worker, decode.attempt, decode.routed, decode._more)
        self.prefill = prefill
        self.encoders: list[_Lease] = []
        self._encode = encode

    def encoder(self, key: str) -> _Lease:
        if self._encode is None:
            raise ApiError(503, "No encode servers available", code="no_encode_servers")
        lease = self._encode.keyed_lease(self.attempt, key)
        self.encoders.append(lease)
        return lease


class PairDispatch:
    """The attempts of one request on a prefill/decode pool: each attempt is a pair, chosen by
    the prefill and the decode policies; a failure of either leg decides like a single one. An
    EPD pool's pairs lease encode workers too, one per media item, by the encode policy."""

    def __init__(
        self, prefill: Dispatch, decode: Dispatch, retry: RetryConfig, encode: Dispatch | None = None
    ) -> None:
        self._prefill = prefill
        self._decode = decode
        self._encode = encode
        self._retry = retry
        self._held: tuple[_PairLease, _Lease] | None = None

    async def attempts(self) -> AsyncGenerator[Lease, None]:
        tried_prefill: set[str] = set()
        tried_decode: set[str] = set()
        last: Failure | None = None
        max_attempts = self._retry.max_attempts
        for number in range(1, max_attempts + 1):
            if number > 1:
                await asyncio.sleep(self._retry.backoff_seconds(number - 1))
            more = number < max_attempts
            prefill = self._prefill._lease(number, tried_prefill, last, more=more)
            try:
                decode = self._decode._lease(number, tried_decode, last, more=more)
            except ApiError:
                self._prefill._settle(prefill)
                raise
            tried_prefill.add(prefill.worker.id)
            tried_decode.add(decode.worker.id)
            pair = _PairLease(decode, prefill, self._encode)
            self._decode._held = pair
            self._held = (pair, prefill)
            try:
                yield pair
            finally:
                self._settle(pair, prefill)
            failure = pair.failure or prefill.failure
            if failure is not None:
                last = failure
                if failure.retryable and failure.kind in RETRYABLE_FAILURES and more:
                    continue
                raise failure.error
            if not (pair.retry or prefill.retry):
                return
        if last is not None:
            raise last.error

    def release(self) -> None:
        if self._held is not None:
            self._settle(*self._held)

    def _settle(self, pair: _PairLease, prefill: _Lease) -> None:
        self._held = None
        self._decode._settle(pair)
        self._prefill._settle(prefill)
        if self._encode is not None:
            for lease in pair.encoders:
                self._encode._settle(lease)
