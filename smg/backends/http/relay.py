"""The HTTP-worker relay: a validated request re-serialized to one worker, its answer relayed.

Success bodies and SSE streams pass through unchanged, as they arrive; error answers are
handed on as `upstream` events and re-shaped into the Messages envelope by the projection.
Transport failures and retryable statuses are retried on another worker (or the same one
when it is alone) with exponential backoff, before any byte reaches the client.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator

import httpx

from journal.events import Error, Event, Routed, Upstream
from journal.pieces import text_piece
from smg.backends.base import Call, ModelCard, model_cards
from smg.backends.http.client import make_client
from smg.backends.http.discovery import check_health, discover
from smg.backends.http.headers import forwarded_request_headers, relayed_response_headers
from smg.backends.upstream import BodyTooLarge, read_capped, stream_parts
from smg.config import GatewayConfig, RetryConfig
from smg.protocol import codec
from smg.protocol.errors import ApiError, describe_exception
from smg.protocol.request import OPTIONAL_FIELDS
from smg.routing.workers import Worker, WorkerRegistry

log = logging.getLogger("smg.relay")

RETRYABLE_STATUSES = frozenset({408, 429, 500, 502, 503, 504})
_PATHS = {"messages": "/v1/messages", "count_tokens": "/v1/messages/count_tokens"}


def relay_body(call: Call) -> bytes:
    """The body a worker receives: the client's JSON with the canonical model id.

    When nothing needs changing the client's own bytes go out, which keeps every number,
    key order and unknown field exactly as sent; otherwise the parsed body is re-serialized.
    """
    body = call.body
    if not call.alias_used and not any(body.get(k, 0) is None for k in OPTIONAL_FIELDS) and call.raw:
        return call.raw
    body = {k: v for k, v in body.items() if not (v is None and k in OPTIONAL_FIELDS)}
    if "model" in body:
        body["model"] = call.model
    return codec.dumps(body)


def backoff_seconds(retry: RetryConfig, attempt: int) -> float:
    base = retry.initial_backoff_ms * retry.backoff_multiplier ** (attempt - 1)
    base = min(base, retry.max_backoff_ms)
    jitter = base * retry.jitter_factor * (2 * random.random() - 1)
    return max(0.0, base + jitter) / 1000.0


class HttpRelayBackend:
    """Relays Messages and count_tokens requests to HTTP workers."""

    name = "http"

    def __init__(self, config: GatewayConfig, registry: WorkerRegistry, urls: list[str]) -> None:
        self._config = config
        self._registry = registry
        self._urls = [u.rstrip("/") for u in urls]
        self._client: httpx.AsyncClient | None = None
        self._health_task: asyncio.Task[None] | None = None
        self._parsed_urls: dict[str, httpx.URL] = {}

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("backend not started")
        return self._client

    async def start(self) -> None:
        self._client = make_client(self._config.upstream_transport, self._config.request_timeout_secs)
        workers = [self._registry.add(Worker(url=u, kind="http")) for u in self._urls]
        await asyncio.gather(*(discover(w, self._client) for w in workers))
        self._health_task = asyncio.create_task(self._watch_health(), name="smg-http-health")

    async def close(self) -> None:
        if self._health_task:
            self._health_task.cancel()
            await asyncio.gather(self._health_task, return_exceptions=True)
        if self._client:
            await self._client.aclose()

    def models(self) -> list[ModelCard]:
        return model_cards(w for w in self._registry.all() if w.kind == "http")

    def _url(self, base: str, path: str) -> httpx.URL:
        # Parsed once per worker and path: httpx would otherwise parse the string per request.
        key = base + path
        url = self._parsed_urls.get(key)
        if url is None:
            url = self._parsed_urls[key] = httpx.URL(key)
        return url

    def ready(self) -> bool:
        return any(w.healthy and w.models for w in self._registry.all() if w.kind == "http")

    async def _watch_health(self) -> None:
        interval = self._config.health_check_interval_secs
        elapsed = 0.0
        tick = min(2.0, interval)
        while True:
            await asyncio.sleep(tick)
            elapsed += tick
            full_round = elapsed >= interval
            if full_round:
                elapsed = 0.0
            for worker in self._registry.all():
                if worker.kind != "http":
                    continue
                # Workers that are down or undiscovered are probed every tick; the rest each interval.
                if not worker.discovered:
                    await discover(worker, self.client)
                elif full_round or not worker.healthy:
                    await check_health(worker, self.client)

    async def handle(self, call: Call) -> AsyncGenerator[Event, None]:
        if call.endpoint == "messages" and getattr(call.request, "max_tokens", None) == 0:
            raise ApiError(
                400,
                "max_tokens: 0 cannot be relayed to an HTTP worker: the gateway renders no prompt "
                "on this backend, so it cannot build the empty message",
                code="max_tokens_zero_not_relayed",
            )
        body = relay_body(call)
        headers = forwarded_request_headers(call.headers)
        path = _PATHS[call.endpoint]
        retry = self._config.retry
        max_attempts = 1 + (retry.max_retries if retry else 0)
        tried: set[str] = set()
        failure: ApiError | None = None

        for attempt in range(1, max_attempts + 1):
            if attempt > 1 and retry:
                await asyncio.sleep(backoff_seconds(retry, attempt - 1))
            worker = self._pick(call.model, tried, failure)
            tried.add(worker.url)
            yield Routed(backend=self.name, worker=worker.url, model=call.model, policy="round_robin", attempt=attempt)
            url = self._url(worker.url, path)
            try:
                response = await self.client.send(
                    self.client.build_request("POST", url, content=body, headers=headers), stream=True
                )
            except httpx.TimeoutException as exc:
                failure = ApiError(504, f"{describe_exception(exc)}. URL: {url}", code="call_upstream_timeout")
                continue
            except httpx.HTTPError as exc:
                worker.record_failure(describe_exception(exc), refused=isinstance(exc, httpx.ConnectError))
                failure = ApiError(
                    502, f"{describe_exception(exc)}. URL: {url}", code="call_upstream_connection_failed"
                )
                continue

            worker.record_success()
            if response.status_code in RETRYABLE_STATUSES and attempt < max_attempts:
                await response.aclose()
                failure = None
                continue
            async for event in self._relay(call, worker, response):
                yield event
            return

        # Only transport failures leave the loop without returning: the last one is the answer.
        assert failure is not None
        raise failure

    def _pick(self, model: str, tried: set[str], failure: ApiError | None) -> Worker:
        try:
            return self._registry.select(model, frozenset(tried))
        except ApiError:
            if failure is None:
                raise
            # Every worker is down after a transport failure: report that failure, not the pool state.
            raise failure from None

    async def _relay(self, call: Call, worker: Worker, response: httpx.Response) -> AsyncGenerator[Event, None]:
        status = response.status_code
        head = relayed_response_headers(response.headers.multi_items())
        streaming = call.stream and status < 400
        if streaming:
            head["content-type"] = "text/event-stream"
        yield Upstream(part="head", status=status, headers=head, worker=worker.url)
        try:
            if streaming:
                async for event in stream_parts(response):
                    yield event
                return
            try:
                raw = await read_capped(response, self._config.max_payload_size)
            except (httpx.HTTPError, BodyTooLarge) as exc:
                message = f"Upstream body could not be read: {describe_exception(exc)}"
                yield Error(
                    stage="upstream", status=502, error_type="api_error", message=message, code="upstream_read_failed"
                )
                return
            data, encoding = text_piece(raw)
            yield Upstream(part="body", data=data, encoding=encoding)
        finally:
            await response.aclose()
