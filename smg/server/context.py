"""A request's own context, set once before anything reads it: its ids (the one echoed to the
client, the one the journal files it under, the client's own), its lowercased headers and its
clock; and the labels the metrics give it."""

from __future__ import annotations

import re
import time
from typing import Any

from smg.server.request_id import resolve_request_ids
from smg.server.state import Gateway

_PATTERNS: dict[str, str] = {}
_PARAM = re.compile(r"<(\w+)(?::[^>]*)?>")


def ensure_context(request: Any) -> None:
    ctx = request.ctx
    if getattr(ctx, "request_id", None):
        return
    ctx.t0 = time.perf_counter()
    ctx.headers = {}
    for name, value in request.headers.items():
        ctx.headers.setdefault(name.lower(), value)
    gateway: Gateway = request.app.ctx.gateway
    ids = resolve_request_ids(request.path, ctx.headers, gateway.config.request_id_headers)
    ctx.request_id = ids.echoed  # what the client is told
    ctx.journal_id = ids.key  # what the journal files the request under
    ctx.client_request_id = ids.client


def metric_path(request: Any) -> str:
    """The `path` label: the route's own path, its pattern (`/workers/{worker_id}`) when it has
    parameters, `other` for no route at all (clients must not be able to mint label values)."""
    route = request.route
    if route is None:
        return "other"
    if not route.params:
        return str(request.path)
    raw = str(route.path)
    pattern = _PATTERNS.get(raw)
    if pattern is None:
        pattern = _PATTERNS[raw] = "/" + _PARAM.sub(r"{\1}", raw).lstrip("/")
    return pattern


def is_preflight(request: Any) -> bool:
    return request.method == "OPTIONS" and "access-control-request-method" in request.ctx.headers
