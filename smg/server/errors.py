"""The answers to what is refused outside a Messages request's own events, rendered in one place:
an `ApiError` on any route (the Anthropic envelope when the client speaks the Anthropic API, else
the reference's), and Sanic's own refusals (a head or body too large, a malformed request),
journaled as Messages requests when they were meant for one."""

from __future__ import annotations

from typing import Any

from sanic import Sanic
from sanic.exceptions import PayloadTooLarge, SanicException
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.projection import Whole, error_response
from smg.protocol.errors import ApiError, reason_phrase
from smg.server import messages
from smg.server.context import ensure_context
from smg.server.lingering import discard_bound, discard_refused_body


def to_http(whole: Whole) -> HTTPResponse:
    headers = dict(whole.headers)
    content_type = headers.pop("content-type", "application/json")
    return HTTPResponse(whole.body, status=whole.status, headers=headers, content_type=content_type)


def api_error(request: Any, err: ApiError) -> HTTPResponse:
    """`err` answered on a route other than the Messages ones."""
    request.ctx.error_code = err.code
    if "anthropic-version" in request.ctx.headers:
        return to_http(error_response(request.ctx.request_id, messages.error_event(err)))
    body = {"error": {"type": err.type, "message": err.message}}
    return json_response(body, status=err.status, headers=err.response_headers())


def _parsed(request: Any) -> Any:
    """The request as the client sent it. When Sanic refuses a request while reading its head
    (a bad Content-Length, an unknown Expect), it hands the error handler a stand-in without
    headers (method `NONE`); the request it had parsed by then is `Request._current`, unless
    the failure came before the headers were read (that one is still the connection's previous
    request, which has been through the middleware and so has its ids already)."""
    if request.method != "NONE":
        return request
    current = type(request)._current.get(None)
    if (
        current is None
        or current is request
        or current.transport is not request.transport
        or getattr(current.ctx, "request_id", None)
    ):
        return request
    return current


async def sanic_error(request: Any, exc: SanicException) -> HTTPResponse:
    request = _parsed(request)  # journaled under the client's request id, with its headers
    ensure_context(request)
    status = int(getattr(exc, "status_code", 500) or 500)
    if isinstance(exc, PayloadTooLarge) and "header" in str(exc).lower():
        status = 431  # Sanic says 413 for a head past its limit: that is 431 (RFC 6585)
    elif isinstance(exc, PayloadTooLarge):
        config = request.app.ctx.gateway.config
        discard_refused_body(request, discard_bound(config.max_payload_size), config.header_read_timeout_secs)
    if request.path.startswith("/v1/messages") or "anthropic-version" in request.ctx.headers:
        code = {413: "request_body_too_large", 431: "request_header_fields_too_large"}.get(status)
        message = str(exc) or reason_phrase(status)
        err = ApiError(status, message, code=code, minted=code is not None)
        return to_http(await messages.refuse(request, err))
    return json_response(
        {"error": {"type": reason_phrase(status), "message": str(exc) or reason_phrase(status)}},
        status=status,
    )


def install(app: Sanic[Any, Any]) -> None:
    app.exception(SanicException)(sanic_error)
