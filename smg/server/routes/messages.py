"""`POST /v1/messages` and `POST /v1/messages/count_tokens` (any other method: 405, any other
path below them: 404), each journaled as a Messages request whatever its answer."""

from __future__ import annotations

from typing import Any

from sanic import Sanic
from sanic.response import HTTPResponse

from smg.backends.base import Endpoint
from smg.protocol.errors import ApiError
from smg.server import messages
from smg.server.errors import to_http

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


async def _endpoint(request: Any, endpoint: Endpoint) -> HTTPResponse | None:
    if request.method != "POST":
        allowed = ApiError(
            405,
            f"Method {request.method} is not allowed on {request.path}; use POST",
            code="method_not_allowed",
            headers={"Allow": "POST, OPTIONS"},
        )
        return to_http(await messages.refuse(request, allowed))
    await messages.serve(request, endpoint)
    return None


async def _messages(request: Any) -> HTTPResponse | None:
    return await _endpoint(request, "messages")


async def _count_tokens(request: Any) -> HTTPResponse | None:
    return await _endpoint(request, "count_tokens")


async def _messages_unknown(request: Any, rest: str) -> HTTPResponse:
    missing = ApiError(404, f"Not Found: {request.method} {request.path}", code="route_not_found")
    return to_http(await messages.refuse(request, missing))


def install(app: Sanic[Any, Any]) -> None:
    app.route("/v1/messages", methods=ALL_METHODS, name="messages")(_messages)
    app.route("/v1/messages/count_tokens", methods=ALL_METHODS, name="count_tokens")(_count_tokens)
    app.route("/v1/messages/<rest:path>", methods=ALL_METHODS, name="messages_unknown")(_messages_unknown)
