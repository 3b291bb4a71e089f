"""The HTTP-worker relay: a validated request re-serialized to one worker, its answer relayed.

Success bodies and SSE streams pass through unchanged, as they arrive; error answers are
handed on as `upstream` events and re-shaped into the Messages envelope by the projection.
Which worker takes each attempt, and whether a failure or a status earns another attempt, is
the router's call (`Attempts`); this module only sends, classifies and relays.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Sequence

import httpx

from journal.events import Error, Event, Upstream
from journal.pieces import text_piece
from smg.backends.base import Attempts, Call, Discovery, Failure, FailureKind, Target
from smg.backends.http.client import Direct, DirectResponse, direct, make_client
from smg.backends.http.discovery import check_health, discover
from smg.backends.http.headers import forwarded_request_headers, relayed_response_headers, with_worker_key
from smg.backends.upstream import BodyTooLarge, read_capped, stream_parts
from smg.config import GatewayConfig
from smg.protocol import codec
from smg.protocol.errors import ApiError, describe_exception, describe_upstream_failure
from smg.protocol.request import OPTIONAL_FIELDS

log = logging.getLogger("smg.relay")

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


def pinned_body(body: bytes, rank: int) -> bytes:
    """A body for one data-parallel rank of a worker (`--dp-aware`): `data_parallel_rank` added,
    as the reference's rank-pinned workers send it."""
    pinned = codec.loads(body)
    pinned["data_parallel_rank"] = rank
    return codec.dumps(pinned)


class HttpConnector:
    """Relays Messages and count_tokens requests to HTTP workers."""

    name = "http"
    generates = False

    def __init__(self, config: GatewayConfig) -> None:
        self._config = config
        self._client: httpx.AsyncClient | None = None
        self._direct: Direct | None = None
        self._parsed_urls: dict[str, httpx.URL] = {}
        self._direct_urls: dict[str, tuple[str, str]] = {}

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None:
            raise RuntimeError("connector not started")
        return self._client

    async def start(self) -> None:
        if self._client is None:
            self._client = make_client(
                self._config.upstream_transport, self._config.request_timeout_secs, self._config.instance_id
            )
            self._direct = direct(self._client)

    async def close(self) -> None:
        if self._client:
            await self._client.aclose()
            self._client = None
            self._direct = None

    async def discover(self, target: Target) -> Discovery:
        return await discover(target, self.client, dp_aware=self._config.router.dp_aware)

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        return await check_health(target, self.client, timeout, endpoint)

    async def forget(self, target: Target) -> None:
        for key in [k for k in self._parsed_urls if k.startswith(target.url + "/")]:
            del self._parsed_urls[key]
        for key in [k for k in self._direct_urls if k.startswith(target.url + "/")]:
            del self._direct_urls[key]

    async def load(self, target: Target) -> int | None:
        return None

    def ready(self, targets: Sequence[Target]) -> bool:
        return any(t.models for t in targets)

    def _url(self, base: str, path: str) -> httpx.URL:
        # Parsed once per worker and path: httpx would otherwise parse the string per request.
        key = base + path
        url = self._parsed_urls.get(key)
        if url is None:
            url = self._parsed_urls[key] = httpx.URL(key)
        return url

    def _direct_url(self, base: str, path: str) -> tuple[str, str]:
        """The URL as httpx would send it and its Host header, once per worker and path."""
        key = base + path
        spelled = self._direct_urls.get(key)
        if spelled is None:
            url = self._url(base, path)
            spelled = self._direct_urls[key] = (str(url), url.netloc.decode("ascii"))
        return spelled

    async def _send(
        self, base: str, path: str, body: bytes, headers: dict[str, str]
    ) -> httpx.Response | DirectResponse:
        if self._direct is not None:
            url, netloc = self._direct_url(base, path)
            return await self._direct.post(url, netloc, body, headers)
        request = self.client.build_request("POST", self._url(base, path), content=body, headers=headers)
        return await self.client.send(request, stream=True)

    async def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        if call.endpoint == "messages" and getattr(call.request, "max_tokens", None) == 0:
            raise ApiError(
                400,
                "max_tokens: 0 cannot be relayed to an HTTP worker: the gateway renders no prompt "
                "on this backend, so it cannot build the empty message",
                code="max_tokens_zero_not_relayed",
            )
        body = relay_body(call)
        forwarded = forwarded_request_headers(call.headers, self._config.api_key, self._config.instance_id)
        path = _PATHS[call.endpoint]
        async for lease in attempts:
            worker = lease.target
            yield lease.routed
            url = self._url(worker.url, path)
            headers = with_worker_key(forwarded, worker.api_key)
            sent = body if worker.dp_rank is None else pinned_body(body, worker.dp_rank)
            try:
                response = await self._send(worker.url, path, sent, headers)
            except httpx.TimeoutException as exc:
                log.warning("worker %s: %s", url, describe_exception(exc))
                timeout = ApiError(504, describe_upstream_failure(exc), code="call_upstream_timeout")
                lease.failed(Failure("timeout", timeout))
                continue
            except httpx.HTTPError as exc:
                log.warning("worker %s: %s", url, describe_exception(exc))
                kind: FailureKind = "refused" if isinstance(exc, httpx.ConnectError) else "transport"
                error = ApiError(502, describe_upstream_failure(exc), code="call_upstream_connection_failed")
                lease.failed(Failure(kind, error))
                continue
            if lease.answered(response.status_code):
                await response.aclose()
                continue
            async for event in self.relay_response(call, worker, response):
                yield event
            return

    async def relay_response(
        self, call: Call, worker: Target, response: httpx.Response | DirectResponse
    ) -> AsyncGenerator[Event, None]:
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
                message = f"Upstream body could not be read: {describe_upstream_failure(exc)}"
                yield Error(
                    stage="upstream", status=502, error_type="api_error", message=message, code="upstream_read_failed"
                )
                return
            data, encoding = text_piece(raw)
            yield Upstream(part="body", data=data, encoding=encoding, raw=raw)  # sent as it came
        finally:
            await response.aclose()
