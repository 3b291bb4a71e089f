"""The policy enforced at the socket: resolve once, check every address, dial only a checked one.

A check made on a URL before the HTTP client opens its own connection would be worth little:
the client resolves the name again (DNS rebinding answers differently the second time) and
follows redirects the check never saw. So the HTTP client's network backend is replaced: each
new connection resolves its host here, refuses if any address is refused, and connects to the
address it checked (TLS still verifies the certificate against the name). Unix sockets are never
dialled.

The HTTP client is `httpx2` (the MCP SDK's, reused for image URLs): its transport takes no
network backend, so `guarded_transport` builds one whose pool has this backend.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from collections.abc import Iterable
from typing import Any

import httpcore2
import httpx2

from smg.fetch.policy import Address, DestinationPolicy, Refused, Target

log = logging.getLogger("smg.fetch")


class Unresolved(Exception):
    """The name has no address (said the same way as a failed connect)."""


async def resolve(policy: DestinationPolicy, host: str, port: int) -> list[Address]:
    """Every address of `host`, each checked; raises `Refused` (one is refused) or `Unresolved`."""
    try:
        literal: Address | None = ipaddress.ip_address(host.strip("[]").split("%", 1)[0])
    except ValueError:
        literal = None
    if literal is not None:
        policy.check(literal)
        return [literal]
    try:
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        raise Unresolved(host) from None
    out: list[Address] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        refusal = policy.refusal(address, host)
        if refusal is not None:
            log.info("refused a fetch from %s: it resolves to %s (%s)", host, address, refusal.detail)
            raise refusal
        if address not in out:
            out.append(address)
    if not out:
        raise Unresolved(host)
    return out


async def vet_url(policy: DestinationPolicy, url: str) -> Target:
    """`url` checked whole, its name resolved: what a caller does before handing a URL to a
    client it does not drive itself. Raises `BadUrl`, `Refused`, or `Unresolved`."""
    target = policy.target(url)
    await resolve(policy, target.host, target.port)
    return target


class GuardedBackend(httpcore2.AsyncNetworkBackend):
    """httpcore's network backend, with every TCP connection vetted by `policy`."""

    def __init__(self, policy: DestinationPolicy) -> None:
        self._policy = policy
        self._inner = httpcore2.AnyIOBackend()

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore2.AsyncNetworkStream:
        try:
            addresses = await resolve(self._policy, host, port)
        except Unresolved:
            raise httpcore2.ConnectError("the destination did not answer") from None
        failure: Exception | None = None
        for address in addresses:
            try:
                return await self._inner.connect_tcp(str(address), port, timeout, local_address, socket_options)
            except (httpcore2.ConnectError, httpcore2.ConnectTimeout) as exc:
                failure = exc
        assert failure is not None
        raise failure

    async def connect_unix_socket(
        self, path: str, timeout: float | None = None, socket_options: Iterable[Any] | None = None
    ) -> httpcore2.AsyncNetworkStream:
        raise Refused("Unix sockets are never dialled")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


def guarded_transport(policy: DestinationPolicy, **pool: Any) -> httpx2.AsyncHTTPTransport:
    """An httpx2 transport whose every connection is vetted by `policy`; environment proxies
    are ignored (a proxy would dial for us, unchecked). `pool`: httpcore pool settings."""
    transport = httpx2.AsyncHTTPTransport(trust_env=False)
    transport._pool = httpcore2.AsyncConnectionPool(
        ssl_context=httpx2.create_ssl_context(trust_env=False),
        network_backend=GuardedBackend(policy),
        **pool,
    )
    return transport
