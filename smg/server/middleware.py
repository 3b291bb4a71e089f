"""What runs around every route: the request's context and its count, CORS preflights, the hop
check (a request that has looped through this gateway is refused before any route), and the
response's request ids, CORS headers and metrics."""

from __future__ import annotations

import logging
import time
from typing import Any

from sanic import Sanic
from sanic.response import HTTPResponse

from smg.observability import metrics
from smg.protocol.errors import ApiError
from smg.protocol.hops import HOP_HEADER, check_hops
from smg.server import messages
from smg.server.context import ensure_context, is_preflight, metric_path
from smg.server.errors import api_error, to_http
from smg.server.state import Gateway

log = logging.getLogger("smg.server")


async def _context(request: Any) -> HTTPResponse | None:
    ensure_context(request)
    m = metrics.current
    if m is not None:
        m.http_requests.labels(request.method, metric_path(request)).inc()
    if is_preflight(request):
        return HTTPResponse(status=204)
    if HOP_HEADER in request.ctx.headers:
        try:
            check_hops(request.ctx.headers, request.app.ctx.gateway.config.instance_id)
        except ApiError as err:
            log.info("refused %s %s: %s", request.method, request.path, err.message)
            if request.path.startswith("/v1/messages"):
                return to_http(await messages.refuse(request, err))
            return api_error(request, err)
    return None


async def _decorate(request: Any, response: HTTPResponse) -> None:
    ensure_context(request)
    response.headers.setdefault("x-request-id", request.ctx.request_id)
    # Anthropic SDKs read `request-id` (e.g. `APIStatusError.request_id`); an upstream's own wins.
    response.headers.setdefault("request-id", request.ctx.request_id)
    gateway: Gateway = request.app.ctx.gateway
    for key, value in gateway.cors.response_headers(request.ctx.headers, is_preflight(request)).items():
        response.headers[key] = value
    m = metrics.current
    if m is not None and not getattr(request.ctx, "observed", False):
        # Whole responses only: a Messages handler counts its own when it ends.
        path = metric_path(request)
        m.http_responses.labels(path, str(response.status), getattr(request.ctx, "error_code", None) or "").inc()
        m.http_duration.labels(request.method, path).observe(time.perf_counter() - request.ctx.t0)


def install(app: Sanic[Any, Any]) -> None:
    app.on_request(_context)
    app.on_response(_decorate)  # type: ignore[no-untyped-call]
