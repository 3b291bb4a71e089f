"""Real MCP servers for loopback tests, built with the `mcp` SDK's server side (Streamable HTTP).

Three kinds, chosen with ``--kind``:

- ``answer``: tools that answer — ``get_weather(city)``, ``add(a, b)``, ``echo(text)``
  (and ``lookup(key)``, for toolsets that expose only some tools);
- ``fail``: tools that fail — ``explode(reason)`` raises, so every call answers
  ``is_error: true`` with the reason as its text;
- ``auth``: like ``answer`` (a ``whoami`` tool), but every MCP request must carry
  ``Authorization: Bearer <--token>``; anything else is refused with 401.

Every server serves MCP at ``/mcp``, ``GET /health`` for readiness, ``GET /_calls``: the
tool calls it ran, in order, with the ``Authorization`` header each MCP request carried
(what a test reads to prove sequencing and bearer tokens), and ``POST /_reset`` to forget them.

Run: ``python -m tools.mcp_servers --kind answer --port N [--token T]``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

KINDS = ("answer", "fail", "auth")

_calls: list[dict[str, Any]] = []
_auth_seen: list[str | None] = []


def _record(tool: str, arguments: dict[str, Any]) -> None:
    _calls.append({"tool": tool, "arguments": arguments, "time": time.time()})


def build_server(kind: str) -> MCPServer:
    server: MCPServer = MCPServer(name=f"smg-test-{kind}")

    if kind in ("answer", "auth"):

        @server.tool(description="The weather in a city")
        def get_weather(city: str) -> str:
            _record("get_weather", {"city": city})
            return f"Sunny, 21°C in {city}"

        @server.tool(description="Add two integers")
        def add(a: int, b: int) -> str:
            _record("add", {"a": a, "b": b})
            return str(a + b)

        @server.tool(description="Echo the text back")
        def echo(text: str) -> str:
            _record("echo", {"text": text})
            return text

        @server.tool(description="Look a key up")
        def lookup(key: str) -> str:
            _record("lookup", {"key": key})
            return f"value-of-{key}"

    if kind == "auth":

        @server.tool(description="Who the server thinks you are")
        def whoami() -> str:
            _record("whoami", {})
            return "an authorized caller"

    if kind == "fail":

        @server.tool(description="Always fails")
        def explode(reason: str) -> str:
            _record("explode", {"reason": reason})
            raise ToolError(f"tool exploded: {reason}")

    @server.custom_route("/health", methods=["GET"])  # type: ignore[untyped-decorator]
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "kind": kind})

    @server.custom_route("/_calls", methods=["GET"])  # type: ignore[untyped-decorator]
    async def calls(request: Request) -> Response:
        return JSONResponse({"calls": _calls, "authorization": _auth_seen})

    @server.custom_route("/_reset", methods=["POST"])  # type: ignore[untyped-decorator]
    async def reset(request: Request) -> Response:
        _calls.clear()
        _auth_seen.clear()
        return JSONResponse({"reset": True})

    return server


class _Bearer:
    """ASGI middleware: MCP requests need `Authorization: Bearer <token>`; the rest pass."""

    def __init__(self, app: Any, token: str | None) -> None:
        self._app = app
        self._token = token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].startswith("/mcp"):
            headers = {k.decode().lower(): v.decode() for k, v in scope.get("headers", [])}
            presented = headers.get("authorization")
            _auth_seen.append(presented)
            if self._token is not None and presented != f"Bearer {self._token}":
                response = JSONResponse({"error": "unauthorized"}, status_code=401)
                await response(scope, receive, send)
                return
        await self._app(scope, receive, send)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.mcp_servers", description=__doc__)
    parser.add_argument("--kind", choices=KINDS, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--token", default="s3cret", help="the bearer token the auth kind requires")
    args = parser.parse_args(argv)

    import uvicorn

    server = build_server(args.kind)
    app = server.streamable_http_app(host=args.host, stateless_http=False)
    wrapped = _Bearer(app, args.token if args.kind == "auth" else None)
    uvicorn.run(wrapped, host=args.host, port=args.port, log_level="warning", lifespan="on")


if __name__ == "__main__":
    main()
