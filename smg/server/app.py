"""The Sanic application: routes, per-request context (id, headers, clock), CORS, and the
lifecycle of the router, the journal writer, the metrics listener and the trace exporter."""

from __future__ import annotations

import asyncio
import gc
import logging
import re
import time
from typing import Any

from sanic import Sanic
from sanic.exceptions import PayloadTooLarge, SanicException
from sanic.response import HTTPResponse
from sanic.response import json as json_response

from smg.admission import Gates, build_admission
from smg.backends.base import Endpoint
from smg.config import GatewayConfig
from smg.observability import metrics, tracing
from smg.observability.metrics import MetricsServer
from smg.projection import Whole, error_response
from smg.protocol.errors import ApiError, reason_phrase
from smg.protocol.hops import HOP_HEADER, check_hops
from smg.routing.router import Router, WorkerSpec
from smg.server import memory, messages, tokenizers, workers
from smg.server.auth import caller, check_admin
from smg.server.cors import CorsPolicy
from smg.server.lingering import discard_bound, discard_refused_body
from smg.server.models import list_models, retrieve_model
from smg.server.request_id import resolve_request_ids
from smg.server.state import Gateway
from smg.shared import link as shared_link
from smg.shared.link import RedisCollector

log = logging.getLogger("smg.server")

ALL_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "HEAD"]


def _ensure_context(request: Any) -> None:
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


def _to_http(whole: Whole) -> HTTPResponse:
    headers = dict(whole.headers)
    content_type = headers.pop("content-type", "application/json")
    return HTTPResponse(whole.body, status=whole.status, headers=headers, content_type=content_type)


_PATTERNS: dict[str, str] = {}
_PARAM = re.compile(r"<(\w+)(?::[^>]*)?>")


def _metric_path(request: Any) -> str:
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


def _is_preflight(request: Any) -> bool:
    return request.method == "OPTIONS" and "access-control-request-method" in request.ctx.headers


def build_app(
    config: GatewayConfig,
    router: Router,
    journal: Any,
    static: list[WorkerSpec],
    name: str = "smg",
    admission: Gates | None = None,
) -> Sanic[Any, Any]:
    # configure_logging=False: the CLI configures logging once; Sanic would print every line twice.
    app: Sanic[Any, Any] = Sanic(name, configure_logging=False)
    app.config.REQUEST_MAX_SIZE = config.max_payload_size
    app.config.RESPONSE_TIMEOUT = int(config.request_timeout_secs) + 60
    # Sanic's own request timeout restarts on every byte; the total deadline is the protocol's
    # (smg.server.connections). This one only sets how often the timeouts are checked.
    app.config.REQUEST_TIMEOUT = min(60.0, config.header_read_timeout_secs)
    # A kept-alive connection waits for its next request no longer than a request may take to
    # arrive: idle connections must not hold the connection cap (smg.server.connections).
    app.config.KEEP_ALIVE_TIMEOUT = min(75.0, config.header_read_timeout_secs)
    app.config.FALLBACK_ERROR_FORMAT = "json"
    app.config.NOISY_EXCEPTIONS = False
    admission = admission or build_admission(config.api_key)
    app.ctx.gateway = Gateway(
        config=config,
        router=router,
        journal=journal,
        cors=CorsPolicy(config.cors_allowed_origins),
        admission=admission,
    )

    observability = config.observability
    metrics_server: list[MetricsServer] = []
    if observability.prometheus_port is not None:
        meter = metrics.install(observability.buckets())
        meter.state.workers = router.registry.all
        meter.state.journal = lambda: journal.stats
        meter.registry.register(RedisCollector())
        metrics_server.append(MetricsServer(meter, observability.prometheus_host, observability.prometheus_port))

        @app.signal("http.lifecycle.begin")
        async def _connection_opened(conn_info: Any) -> None:
            meter.http_connections.inc()

        @app.signal("http.lifecycle.complete")
        async def _connection_closed(conn_info: Any) -> None:
            meter.http_connections.dec()

    @app.before_server_start
    async def _start(app: Sanic[Any, Any]) -> None:
        memory.map_large_blocks()
        if observability.enable_trace:
            tracing.install(observability.otlp_traces_endpoint)
        for server in metrics_server:
            await server.start()
        await journal.start()
        await admission.start()
        await router.start(static)
        # What start-up built (modules, the app, routes, schemas, templates) lives as long as the
        # process: out of the collector's sight, a full collection walks only what requests
        # allocate, instead of pausing every request in flight for tens of milliseconds.
        gc.freeze()

    @app.after_server_stop
    async def _stop(app: Sanic[Any, Any]) -> None:
        await router.close()
        await admission.stop()
        admission.close()
        await shared_link.close_all()
        await journal.close()
        for server in metrics_server:
            await server.close()
        if tracing.enabled():
            await asyncio.to_thread(tracing.shutdown)  # exports what is still buffered

    @app.on_request
    async def _context(request: Any) -> HTTPResponse | None:
        _ensure_context(request)
        m = metrics.current
        if m is not None:
            m.http_requests.labels(request.method, _metric_path(request)).inc()
        if _is_preflight(request):
            return HTTPResponse(status=204)
        if HOP_HEADER in request.ctx.headers:
            try:
                check_hops(request.ctx.headers, request.app.ctx.gateway.config.instance_id)
            except ApiError as err:
                log.info("refused %s %s: %s", request.method, request.path, err.message)
                if request.path.startswith("/v1/messages"):
                    return _to_http(await messages.refuse(request, err))
                return _api_error(request, err)
        return None

    @app.on_response  # type: ignore[untyped-decorator]
    async def _decorate(request: Any, response: HTTPResponse) -> None:
        _ensure_context(request)
        response.headers.setdefault("x-request-id", request.ctx.request_id)
        # Anthropic SDKs read `request-id` (e.g. `APIStatusError.request_id`); an upstream's own wins.
        response.headers.setdefault("request-id", request.ctx.request_id)
        gateway: Gateway = request.app.ctx.gateway
        for key, value in gateway.cors.response_headers(request.ctx.headers, _is_preflight(request)).items():
            response.headers[key] = value
        m = metrics.current
        if m is not None and not getattr(request.ctx, "observed", False):
            # Whole responses only: a Messages handler counts its own when it ends.
            path = _metric_path(request)
            m.http_responses.labels(path, str(response.status), getattr(request.ctx, "error_code", None) or "").inc()
            m.http_duration.labels(request.method, path).observe(time.perf_counter() - request.ctx.t0)

    async def _endpoint(request: Any, endpoint: Endpoint) -> HTTPResponse | None:
        if request.method != "POST":
            allowed = ApiError(
                405,
                f"Method {request.method} is not allowed on {request.path}; use POST",
                code="method_not_allowed",
                headers={"Allow": "POST, OPTIONS"},
            )
            return _to_http(await messages.refuse(request, allowed))
        await messages.serve(request, endpoint)
        return None

    @app.route("/v1/messages", methods=ALL_METHODS, name="messages")
    async def _messages(request: Any) -> HTTPResponse | None:
        return await _endpoint(request, "messages")

    @app.route("/v1/messages/count_tokens", methods=ALL_METHODS, name="count_tokens")
    async def _count_tokens(request: Any) -> HTTPResponse | None:
        return await _endpoint(request, "count_tokens")

    @app.route("/v1/messages/<rest:path>", methods=ALL_METHODS, name="messages_unknown")
    async def _messages_unknown(request: Any, rest: str) -> HTTPResponse:
        missing = ApiError(404, f"Not Found: {request.method} {request.path}", code="route_not_found")
        return _to_http(await messages.refuse(request, missing))

    def _refused(request: Any) -> HTTPResponse | None:
        """The 401 for a serving route without a gateway key (Messages envelope for SDKs)."""
        try:
            caller(request.app.ctx.gateway, request.ctx.headers, request.ip or None)
        except ApiError as err:
            return _api_error(request, err)
        return None

    def _refused_admin(request: Any) -> HTTPResponse | None:
        """The 401 for an admin route without the shared key (a tenant key does not open it)."""
        try:
            check_admin(request.app.ctx.gateway, request.ctx.headers)
        except ApiError as err:
            return _api_error(request, err)
        return None

    def _api_error(request: Any, err: ApiError) -> HTTPResponse:
        request.ctx.error_code = err.code
        if "anthropic-version" in request.ctx.headers:
            return _to_http(error_response(request.ctx.request_id, messages.error_event(err)))
        body = {"error": {"type": err.type, "message": err.message}}
        return json_response(body, status=err.status, headers=err.response_headers())

    @app.get("/v1/models", name="models")
    async def _models(request: Any) -> HTTPResponse:
        refused = _refused(request)
        if refused is not None:
            return refused
        try:
            return await list_models(request.app.ctx.gateway, request.ctx.headers, request.query_string)
        except ApiError as err:
            return _api_error(request, err)

    @app.get("/v1/models/<model_id:path>", name="model")
    async def _model(request: Any, model_id: str) -> HTTPResponse:
        refused = _refused(request)
        if refused is not None:
            return refused
        try:
            return await retrieve_model(request.app.ctx.gateway, request.ctx.headers, model_id, request.ctx.request_id)
        except ApiError as err:
            return _api_error(request, err)

    @app.route("/v1/tokenizers", methods=["GET", "POST"], name="tokenizers")
    async def _tokenizers(request: Any) -> HTTPResponse:
        refused = _refused_admin(request)
        if refused is not None:
            return refused
        return await (tokenizers.register(request) if request.method == "POST" else tokenizers.list_all(request))

    @app.route("/v1/tokenizers/<key:path>", methods=["GET", "DELETE"], name="tokenizer")
    async def _tokenizer(request: Any, key: str) -> HTTPResponse:
        refused = _refused_admin(request)
        if refused is not None:
            return refused
        if request.method == "DELETE":
            return await tokenizers.remove(request, key)
        if key.endswith("/status"):
            return await tokenizers.status(request, key.removesuffix("/status"))
        return await tokenizers.info(request, key)

    @app.route("/workers", methods=["GET", "POST"], name="workers")
    async def _workers(request: Any) -> HTTPResponse:
        refused = _refused_admin(request)
        if refused is not None:
            return refused
        return await (workers.add(request) if request.method == "POST" else workers.list_all(request))

    @app.route("/workers/<worker_id>", methods=["GET", "DELETE"], name="worker")
    async def _worker(request: Any, worker_id: str) -> HTTPResponse:
        refused = _refused_admin(request)
        if refused is not None:
            return refused
        if request.method == "DELETE":
            return await workers.remove(request, worker_id)
        return await workers.show(request, worker_id)

    @app.get("/health", name="health")
    async def _health(request: Any) -> HTTPResponse:
        return json_response({"status": "ok"})

    @app.get("/liveness", name="liveness")
    async def _liveness(request: Any) -> HTTPResponse:
        return json_response({"status": "ok"})

    @app.get("/readiness", name="readiness")
    async def _readiness(request: Any) -> HTTPResponse:
        gateway: Gateway = request.app.ctx.gateway
        router = gateway.router
        all_workers = router.registry.all()
        healthy = sum(w.healthy for w in all_workers)
        # A journal that cannot commit does not stop serving, but it is not a healthy gateway:
        # say so, with why, so an operator sees it before the held events are dropped.
        problem = gateway.journal.problem
        reason = f"journal: {problem}" if problem is not None else router.not_ready_reason()
        if reason is None:
            return json_response({"status": "ready", "healthy_workers": healthy, "total_workers": len(all_workers)})
        return json_response({"status": "not ready", "reason": reason}, status=503)

    @app.exception(SanicException)
    async def _sanic_error(request: Any, exc: SanicException) -> HTTPResponse:
        request = _parsed(request)  # journaled under the client's request id, with its headers
        _ensure_context(request)
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
            return _to_http(await messages.refuse(request, err))
        return json_response(
            {"error": {"type": reason_phrase(status), "message": str(exc) or reason_phrase(status)}},
            status=status,
        )

    return app
