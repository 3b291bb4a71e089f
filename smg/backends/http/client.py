"""The upstream HTTP client shared by relay backends: connection pooling, timeouts, and the
choice of transport (httpx's own, or aiohttp underneath httpx's interface)."""

from __future__ import annotations

import httpx

TRANSPORTS = ("httpx", "aiohttp")


def make_client(transport: str, timeout_secs: float) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256, keepalive_expiry=30.0)
    timeout = httpx.Timeout(timeout_secs, connect=min(10.0, timeout_secs))
    if transport == "aiohttp":
        from httpx_aiohttp import AiohttpTransport

        return httpx.AsyncClient(
            transport=AiohttpTransport(limits=limits, trust_env=False), timeout=timeout, trust_env=False
        )
    if transport != "httpx":
        raise ValueError(f"unknown upstream transport {transport!r} (choose from {', '.join(TRANSPORTS)})")
    return httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False)
