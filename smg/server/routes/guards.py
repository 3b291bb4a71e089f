"""Which key opens which route: serving routes take the shared key or a tenant key, admin routes
(the worker and tokenizer APIs) the shared key only. Each guard is None when the request may
pass, else the 401 to answer."""

from __future__ import annotations

from typing import Any

from sanic.response import HTTPResponse

from smg.protocol.errors import ApiError
from smg.server.auth import caller, check_admin
from smg.server.errors import api_error


def refused(request: Any) -> HTTPResponse | None:
    """The 401 for a serving route without a gateway key (Messages envelope for SDKs)."""
    try:
        caller(request.app.ctx.gateway, request.ctx.headers, request.ip or None)
    except ApiError as err:
        return api_error(request, err)
    return None


def refused_admin(request: Any) -> HTTPResponse | None:
    """The 401 for an admin route without the shared key (a tenant key does not open it)."""
    try:
        check_admin(request.app.ctx.gateway, request.ctx.headers)
    except ApiError as err:
        return api_error(request, err)
    return None
