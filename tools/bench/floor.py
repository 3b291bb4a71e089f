"""The floor of the relay bench: the smallest relay this gateway's stack can be.

A Sanic app (the gateway's server framework, run the way `smg launch` runs it: one process,
no access log) whose one route forwards the request body to the worker on the gateway's own
upstream session (`smg.backends.http.client`'s aiohttp session, which the relay sends on
directly) and answers with what came back: a JSON body whole, a stream chunk by chunk. No validation, no routing, no
journal, no metrics. What the gateway costs beyond this is the gateway's; what this costs beyond
the worker is the stack's.

With ``--httpx`` the route goes through the httpx client on top of that session
(`make_client("aiohttp", ...)`, what the gateway's other upstream calls use): what the httpx
interface costs per request.

Run: ``python -m tools.bench.floor --port P --worker-url URL [--httpx]``; ``GET /health``
answers once up.
"""

from __future__ import annotations

import argparse
from typing import Any

import aiohttp
import httpx
from sanic import Request, Sanic
from sanic.response import HTTPResponse, raw

from smg.backends.http.client import _session, make_client

_FORWARDED = ("content-type", "anthropic-version")


def build(worker_url: str, through_httpx: bool = False) -> Sanic[Any, Any]:
    app: Sanic[Any, Any] = Sanic("smg_floor", configure_logging=False)
    upstream = f"{worker_url.rstrip('/')}/v1/messages"
    clients: list[httpx.AsyncClient] = []
    sessions: list[aiohttp.ClientSession] = []

    @app.before_server_start
    async def _client(_: Sanic[Any, Any]) -> None:
        if through_httpx:
            clients.append(make_client("aiohttp", 600.0))
        else:
            sessions.append(_session(httpx.Limits(max_connections=1024, keepalive_expiry=30.0)))

    @app.after_server_stop
    async def _close(_: Sanic[Any, Any]) -> None:
        for client in clients:
            await client.aclose()
        for session in sessions:
            await session.close()

    @app.get("/health")
    async def health(_: Request) -> HTTPResponse:
        return raw(b"ok")

    @app.post("/v1/messages")
    async def messages(request: Request) -> HTTPResponse | None:
        headers = {k: v for k in _FORWARDED if (v := request.headers.get(k)) is not None}
        if not through_httpx:
            return await _bare(request, sessions[0], upstream, headers)
        sent = clients[0].build_request("POST", upstream, content=request.body, headers=headers)
        answer = await clients[0].send(sent, stream=True)
        content_type = answer.headers.get("content-type", "application/json")
        try:
            if not content_type.startswith("text/event-stream"):
                return raw(await answer.aread(), status=answer.status_code, content_type=content_type)
            response = await request.respond(status=answer.status_code, content_type=content_type)
            async for chunk in answer.aiter_raw():
                await response.send(chunk)
            await response.eof()
            return None
        finally:
            await answer.aclose()

    return app


async def _bare(
    request: Request, session: aiohttp.ClientSession, upstream: str, headers: dict[str, str]
) -> HTTPResponse | None:
    async with session.post(upstream, data=request.body, headers=headers) as answer:
        content_type = answer.headers.get("content-type", "application/json")
        if not content_type.startswith("text/event-stream"):
            return raw(await answer.read(), status=answer.status, content_type=content_type)
        response = await request.respond(status=answer.status, content_type=content_type)
        async for chunk in answer.content.iter_any():
            await response.send(chunk)
        await response.eof()
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.floor", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--worker-url", required=True)
    parser.add_argument("--httpx", action="store_true", help="through the httpx client on top of the session")
    args = parser.parse_args(argv)
    build(args.worker_url, args.httpx).run(
        host=args.host, port=args.port, single_process=True, access_log=False, motd=False, debug=False
    )


if __name__ == "__main__":
    main()
