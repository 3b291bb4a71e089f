"""The upstream HTTP client shared by relay backends: connection pooling, timeouts, and the
choice of transport (aiohttp underneath httpx's interface by default, measured faster in
`tools/bench`; or httpx's own).

The client sends one header of its own, the hop header with the gateway's id (a worker URL
that leads back to the gateway is refused at its first probe, `smg.protocol.hops`); no
user-agent, accept or accept-encoding: a worker or the Anthropic API sees only what the
backend forwards, plus what HTTP itself needs.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport
from httpx_aiohttp.transport import AiohttpResponseStream

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
