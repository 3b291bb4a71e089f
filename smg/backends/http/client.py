"""The upstream HTTP client shared by relay backends: connection pooling, timeouts, and the
choice of transport (aiohttp underneath httpx's interface by default, measured faster in
`tools/bench`; or httpx's own).

The client sends one header of its own, the hop header with the gateway's id (a worker URL
that leads back to the gateway is refused at its first probe, `smg.protocol.hops`); no
user-agent, accept or accept-encoding: a worker or the Anthropic API sees only what the
backend forwards, plus what HTTP itself needs.

On the aiohttp transport a relayed request can skip httpx's client layer (`Direct`): the same
aiohttp session, the same request, headers, timeouts and error types, without building an
`httpx.Request` and `httpx.Response` and passing every chunk through their streams, which
costs about as much CPU per request as the rest of a bare relay (the floor of
`tools/bench/relay.py`). It keeps no cookie jar: a worker's `Set-Cookie` is relayed, never
sent back upstream on other clients' requests.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import AiohttpResponseStream, map_aiohttp_exceptions

from smg.protocol.hops import HOP_HEADER

TRANSPORTS = ("aiohttp", "httpx")


def _classified(exc: httpx.TransportError) -> httpx.TransportError:
    """The httpx error that matches what really happened.

    httpx-aiohttp reports every `aiohttp.ClientConnectionError` (a refused connection, a
    server that hung up) as `ConnectTimeout`; the gateway answers those differently (502, not
    504), so the aiohttp cause decides.
    """
    cause = exc.__cause__
    message = str(cause) if cause is not None else str(exc)
    if isinstance(cause, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message)
    if isinstance(cause, (aiohttp.ServerTimeoutError, asyncio.TimeoutError)):
        return httpx.ReadTimeout(message)
    if isinstance(cause, (aiohttp.ServerDisconnectedError, aiohttp.ClientPayloadError)):
        return httpx.RemoteProtocolError(message or "Server disconnected")
    if isinstance(cause, aiohttp.ClientConnectionError):
        return httpx.ReadError(message)
    return exc


class _Transport(AiohttpTransport):
    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            response = await super().handle_async_request(request)
        except httpx.TransportError as exc:
            raise _classified(exc) from exc.__cause__
        if isinstance(response.stream, AiohttpResponseStream):
            response.stream = _Received(response.stream)
        return response

    def session(self) -> aiohttp.ClientSession:
        """The aiohttp session under this transport (created on first use, as httpx's calls do)."""
        if not isinstance(self.client, aiohttp.ClientSession):
            self.client = self.get_client()
        return self.client


class _Received(httpx.AsyncByteStream):
    """A body as aiohttp reads it; when the connection dies, the bytes that had already
    arrived come out before the failure. aiohttp's reader raises the failure first and drops
    what it holds, so a stream read after its worker hung up (the decode leg of an HTTP PD
    pair waits while the prefill leg is read) lost every frame before the cut: the client
    got only the error, the journal not even the `message_start` that says the prompt's
    tokens."""

    def __init__(self, inner: AiohttpResponseStream) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpx.TransportError:
            left = _held(self._inner._aiohttp_response.content)
            if left:
                yield left
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _held(content: Any) -> bytes:
    """What aiohttp's reader received and nobody has read yet (b"" if its internals differ)."""
    buffer, offset = getattr(content, "_buffer", None), getattr(content, "_buffer_offset", 0)
    if not isinstance(buffer, deque) or not isinstance(offset, int):
        return b""
    held = b"".join(buffer)[offset:]
    buffer.clear()
    content._buffer_offset = content._size = 0
    return held


class DirectResponse:
    """An answer read straight off the aiohttp response, the part of `httpx.Response` the
    relay reads: status, headers, the body as it arrives (`aiter_bytes`), `aclose`. A body
    with a `content-encoding` is decoded by httpx's own decoders, as through the client."""

    __slots__ = ("status_code", "_response", "_headers", "_decoded")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self.status_code = response.status
        self._response = response
        self._headers: httpx.Headers | None = None
        self._decoded: httpx.Response | None = None
        if "content-encoding" in response.headers:
            stream = AiohttpResponseStream(response)
            self._decoded = httpx.Response(response.status, headers=response.raw_headers, stream=stream)

    @property
    def headers(self) -> httpx.Headers:
        if self._headers is None:
            self._headers = httpx.Headers(self._response.raw_headers)
        return self._headers

    async def aiter_bytes(self) -> AsyncIterator[bytes]:
        if self._decoded is not None:
            async for chunk in self._decoded.aiter_bytes():
                yield chunk
            return
        try:
            with map_aiohttp_exceptions():
                async for chunk in self._response.content.iter_chunked(AiohttpResponseStream.CHUNK_SIZE):
                    yield chunk
        except httpx.TransportError:
            left = _held(self._response.content)  # as `_Received`: what arrived before the cut first
            if left:
                yield left
            raise

    async def aclose(self) -> None:
        if self._decoded is not None:
            await self._decoded.aclose()
            return
        with map_aiohttp_exceptions():
            await self._response.__aexit__(None, None, None)


class Direct:
    """POSTs on the session under a `make_client("aiohttp", ...)` client, as that client would
    send them (`client.send(client.build_request("POST", ...), stream=True)`): the same header
    names, values and order, timeouts, and the same httpx error for each failure."""

    def __init__(self, client: httpx.AsyncClient, transport: _Transport) -> None:
        timeout = client.timeout
        self._timeout = aiohttp.ClientTimeout(
            sock_connect=timeout.connect, sock_read=timeout.read, connect=timeout.pool
        )
        self._defaults = {k.lower(): v for k, v in client.headers.items()}
        self._transport = transport

    async def post(self, url: str, netloc: str, content: bytes, headers: Mapping[str, str]) -> DirectResponse:
        """`url` as httpx spells it and its `netloc` (the Host header); `headers` lowercase."""
        # httpx's order: Host, the client's headers the request does not set, the request's, Content-Length.
        defaults = {k: v for k, v in self._defaults.items() if k not in headers} if self._defaults else {}
        sent = {"host": netloc, **defaults, **headers, "content-length": str(len(content))}
        try:
            with map_aiohttp_exceptions():
                response = (
                    await self._transport.session()
                    .request(
                        "POST",
                        url,
                        headers=sent,
                        data=content or None,
                        allow_redirects=False,
                        auto_decompress=False,
                        compress=False,
                        timeout=self._timeout,
                    )
                    .__aenter__()
                )
        except httpx.TransportError as exc:
            raise _classified(exc) from exc.__cause__
        return DirectResponse(response)


def direct(client: httpx.AsyncClient) -> Direct | None:
    """The direct path for `client` when it runs on the aiohttp transport, else None."""
    transport = client._transport
    return Direct(client, transport) if isinstance(transport, _Transport) else None


def _session(limits: httpx.Limits) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(
        limit=limits.max_connections or 0,
        keepalive_timeout=limits.keepalive_expiry or 30.0,
    )
    return aiohttp.ClientSession(
        connector=connector,
        trust_env=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding"),
    )


def make_client(transport: str, timeout_secs: float, instance_id: str | None = None) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=30.0)
    timeout = httpx.Timeout(timeout_secs, connect=min(10.0, timeout_secs))
    if transport == "aiohttp":
        client = httpx.AsyncClient(
            transport=_Transport(limits=limits, trust_env=False, client=lambda: _session(limits)),
            timeout=timeout,
            trust_env=False,
        )
    elif transport == "httpx":
        client = httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
    else:
        raise ValueError(f"unknown upstream transport {transport!r} (choose from {', '.join(TRANSPORTS)})")
    for name in list(client.headers.keys()):
        del client.headers[name]
    if instance_id is not None:
        client.headers[HOP_HEADER] = instance_id  # a relayed request sends its whole chain instead
    return client
