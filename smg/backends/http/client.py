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

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

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
            return await super().handle_async_request(request)
        except httpx.TransportError as exc:
            raise _classified(exc) from exc.__cause__


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
