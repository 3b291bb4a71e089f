"""What one request tells the operator, read off its events: the request-level metrics
(`smg_http_*`, `smg_router_*`, TTFT/TPOT/tokens, MCP tool calls), the stage spans of its trace,
and its `--log-json` access line.

`RequestObserver.see` runs once per event the router yields and only notes times and counts
(a few attribute writes); everything is recorded once, in `finish`, when the request ends.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from journal.events import Block, Event, McpResult, Rendered, Routed, Tokens, Upstream
from smg.observability import logs, metrics, tracing
from smg.observability.metrics import Metrics
from smg.observability.tracing import RequestTrace

# Router error types, as the reference labels them.
_NO_WORKERS = frozenset({"model_not_found", "no_available_workers", "no_healthy_workers", "not_implemented"})
_TIMEOUTS = frozenset({408, 504})
# Answers of the admission layer that count as `smg_http_rate_limit_total{result="rejected"}`.
RATE_LIMITED = frozenset({"admission_queue_full", "admission_queue_timeout", "tenant_rate_limit_exceeded"})
# The reference's `backend_type` per connector; its `router_type` is what the connector is
# (`Connector.generates`: `grpc`, the generating router, else `http`, the relaying one).
_BACKEND_TYPES = {"http-pd": "pd", "grpc-pd": "pd", "grpc-epd": "pd", "anthropic": "external"}


def error_type(status: int, code: str | None) -> str:
    """The reference's `error_type` label of `smg_router_request_errors_total`."""
    if code in _NO_WORKERS:
        return "no_workers"
    if status in _TIMEOUTS or (code is not None and "timeout" in code):
        return "timeout"
    if code == "internal_error":
        return "internal_error"
    if status < 500:
        return "validation_error"
    return "backend_error"


class RequestObserver:
    """One request's times and counts, for metrics, spans and the access log."""

    __slots__ = (
        "metrics", "trace", "path", "method", "endpoint", "tenant", "model", "stream", "validated", "routed",
        "routed_at", "rendered_at", "first_token", "last_token", "prompt_tokens", "first_output", "first_block",
        "last_block", "last_event", "mcp", "generates",
    )  # fmt: skip

    def __init__(
        self,
        method: str,
        path: str,
        endpoint: str,
        tenant: str | None,
        trace: RequestTrace | None,
        generates: Callable[[str], bool] = lambda backend: False,
    ) -> None:
        """`generates(backend)`: whether that connector generates answers (`Router.generates`)."""
        self.generates = generates
        self.metrics: Metrics | None = metrics.current
        self.trace = trace
        self.method = method
        self.path = path
        self.endpoint = endpoint
        self.tenant = tenant
        self.model: str | None = None
        self.stream = False
        self.validated: float | None = None
        self.routed: Routed | None = None  # the last attempt's
        self.routed_at: float | None = None  # the first attempt's
        self.rendered_at: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.prompt_tokens: int | None = None
        self.first_output: float | None = None
        self.first_block: float | None = None
        self.last_block: float | None = None
        self.last_event: float | None = None
        self.mcp: list[McpResult] = []

    def see(self, event: Event) -> None:
        t = event.t
        self.last_event = t
        if isinstance(event, Tokens):
            if self.first_token is None:
                self.first_token = t
            self.last_token = t
            if event.prompt_tokens is not None:
                self.prompt_tokens = event.prompt_tokens
        elif isinstance(event, Block):
            if self.first_block is None:
                self.first_block = t
                if self.first_output is None:
                    self.first_output = t
            self.last_block = t
        elif isinstance(event, Upstream):
            if self.first_output is None and event.part != "head":
                self.first_output = t
        elif isinstance(event, Routed):
            self.routed = event
            if self.routed_at is None:
                self.routed_at = t
        elif isinstance(event, Rendered):
            self.rendered_at = t
        elif isinstance(event, McpResult):
            self.mcp.append(event)

    def finish(
        self,
        *,
        request_id: str,
        status: int,
        code: str | None,
        duration: float,
        usage: dict[str, Any] | None,
        disconnected: bool,
    ) -> None:
        m = self.metrics
        if m is not None:
            self._record(m, status, code, duration, usage)
        if self.trace is not None:
            self._spans(self.trace, status, code, duration)
        routed = self.routed
        logs.access(
            {
                "request_id": request_id,
                "method": self.method,
                "path": self.path,
                "tenant": self.tenant,
                "model": self.model,
                "stream": self.stream,
                "backend": routed.backend if routed else None,
                "worker": routed.worker if routed else None,
                "attempts": routed.attempt if routed else 0,
                "status": status,
                "error_code": code,
                "disconnected": disconnected,
                "duration_ms": round(duration * 1000, 3),
                "ttft_ms": _ms(self.first_output),
                "input_tokens": (usage or {}).get("input_tokens"),
                "output_tokens": (usage or {}).get("output_tokens"),
                "trace_id": self.trace.trace_id if self.trace is not None else None,
            }
        )

    def _record(self, m: Metrics, status: int, code: str | None, duration: float, usage: dict[str, Any] | None) -> None:
        m.http_responses.labels(self.path, str(status), code or "").inc()
        m.http_duration.labels(self.method, self.path).observe(duration)
        m.rate_limit.labels("rejected" if code in RATE_LIMITED else "allowed").inc()
        for result in self.mcp:
            tool_model = self.model or "unknown"
            m.mcp_calls.labels(tool_model, result.tool, "error" if result.is_error else "success").inc()
            m.mcp_duration.labels(tool_model, result.tool).observe(result.duration_ms / 1000)
        if self.model is None:
            return  # refused before it named a model: no router request (as the reference)
        routed = self.routed
        connector = routed.backend if routed is not None else None
        router_type = "grpc" if connector is not None and self.generates(connector) else "http"
        backend_type = _BACKEND_TYPES.get(connector or "", "regular")
        connection = "grpc" if router_type == "grpc" else "http"
        # A model no worker serves is `other`: clients must not be able to mint label values.
        model = "other" if code == "model_not_found" else self.model
        endpoint = "messages" if self.endpoint == "messages" else "other"
        route = (router_type, backend_type, connection, model, endpoint)
        m.router_requests.labels(*route, "true" if self.stream else "false").inc()
        m.router_duration.labels(*route).observe(duration)
        if status >= 400:
            m.router_errors.labels(*route, error_type(status, code)).inc()
        if self.first_token is None:
            return
        inference = (router_type, backend_type, model, endpoint)
        output = int((usage or {}).get("output_tokens") or 0)
        prompt = self.prompt_tokens if self.prompt_tokens is not None else (usage or {}).get("input_tokens")
        m.ttft.labels(*inference).observe(self.first_token)
        start = self.routed_at if self.routed_at is not None else 0.0
        last = self.last_token if self.last_token is not None else self.first_token
        m.generation_duration.labels(*inference).observe(max(0.0, last - start))
        if output > 1:
            m.tpot.labels(*inference).observe(max(0.0, last - self.first_token) / (output - 1))
        if prompt:
            m.tokens.labels(*inference, "input").inc(int(prompt))
        m.tokens.labels(*inference, "output").inc(output)

    def _spans(self, trace: RequestTrace, status: int, code: str | None, duration: float) -> None:
        validated = self.validated if self.validated is not None else self.last_event or duration
        trace.span("admission", 0.0, validated)
        routed = self.routed
        if routed is not None and self.routed_at is not None:
            trace.span(
                "route",
                validated,
                self.routed_at,
                worker=routed.worker or "",
                policy=routed.policy or "",
                attempts=routed.attempt,
                backend=routed.backend,
            )
            start = routed.t
            end = self.last_event if self.last_event is not None else duration
            trace.span("engine_call", start, end, worker=routed.worker or "")
            first = self.first_token if self.first_token is not None else self.first_output
            if first is not None:
                trace.span("first_token", start, first)
            if self.first_block is not None and self.last_block is not None and self.first_token is not None:
                trace.span("parse", self.first_token, self.last_block)
        last = self.last_event if self.last_event is not None else validated
        trace.span("respond", last, duration)
        attributes: dict[str, Any] = {"smg.endpoint": self.endpoint}
        if self.model:
            attributes["gen_ai.request.model"] = self.model
        if code:
            attributes["error.type"] = code
        if self.tenant:
            attributes["smg.tenant"] = self.tenant
        trace.end(duration, status, **attributes)


def _ms(t: float | None) -> float | None:
    return None if t is None else round(t * 1000, 3)


def start_trace(method: str, path: str, headers: dict[str, str], t0: float, request_id: str) -> RequestTrace | None:
    if not tracing.enabled():
        return None
    return RequestTrace(
        f"{method} {path}", headers, t0, {"http.request.method": method, "url.path": path, "smg.request_id": request_id}
    )
