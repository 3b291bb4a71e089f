"""OpenTelemetry spans of each request, exported over OTLP/gRPC (`--enable-trace
--otlp-traces-endpoint HOST:PORT`, the reference's flags and default, localhost:4317).

A request's root span continues the client's `traceparent`/`tracestate` (W3C trace context) and
is what a worker is told as its parent (HTTP headers; gRPC metadata on `Generate`). Work that
runs in one piece opens its span where it runs (`stage`: render, tokenize, the policy's
choice); the stages that the request's events already time (admission, first token, engine
call, parse, respond) are spans built from those times when the request ends
(`RequestTrace.span`), so no stage pays twice.

With tracing off, `stage` is a shared no-op context manager and nothing else runs.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
_NO_SPAN: AbstractContextManager[Any] = nullcontext()
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-([0-9a-f]{32})-[0-9a-f]{16}-[0-9a-f]{2}")

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None


def install(endpoint: str | None = None, exporter: SpanExporter | None = None) -> TracerProvider:
    """Start exporting: to the OTLP/gRPC collector at `endpoint` (HOST:PORT) in batches, or to
    `exporter` span by span (tests: the SDK's in-memory exporter)."""
    global _provider, _tracer
    provider = TracerProvider(resource=Resource.create({"service.name": "smg"}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    else:
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://{endpoint}", insecure=True)))
    _provider, _tracer = provider, provider.get_tracer("smg")
    return provider


def shutdown() -> None:
    """Export what is buffered and stop."""
    global _provider, _tracer
    if _provider is not None:
        _provider.shutdown()
    _provider = _tracer = None


def enabled() -> bool:
    return _tracer is not None


def stage(name: str, **attributes: Any) -> AbstractContextManager[Any]:
    """A span around work that runs in one piece, child of the request's span."""
    if _tracer is None:
        return _NO_SPAN
    return _tracer.start_as_current_span(name, attributes=attributes or None)


def grpc_metadata() -> tuple[tuple[str, str], ...] | None:
    """`traceparent`/`tracestate` of the current span as gRPC metadata; None with tracing off."""
    if _tracer is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return tuple(carrier.items()) or None


def client_trace_id(headers: Mapping[str, str]) -> str | None:
    """The trace id of a well-formed `traceparent` the client sent (journaled even with tracing off)."""
    match = _TRACEPARENT.match(headers.get("traceparent", ""))
    if match is None or match.group(1) == "0" * 32:
        return None
    return match.group(1)


class RequestTrace:
    """One request's root span and the stage spans built from its event times.

    Times are seconds since the request's clock started (`t0`, `time.perf_counter()`), as the
    events carry them; `epoch_ns` maps them to the wall clock spans need.
    """

    __slots__ = ("root", "_token", "_epoch_ns", "_context")

    def __init__(self, name: str, headers: Mapping[str, str], t0: float, attributes: Mapping[str, Any]) -> None:
        assert _tracer is not None
        self._epoch_ns = time.time_ns() - int((time.perf_counter() - t0) * 1e9)
        parent = _PROPAGATOR.extract(headers)
        self.root = _tracer.start_span(
            name, context=parent, kind=trace.SpanKind.SERVER, attributes=dict(attributes), start_time=self._epoch_ns
        )
        self._context = trace.set_span_in_context(self.root)
        self._token: object | None = otel_context.attach(self._context)

    @property
    def trace_id(self) -> str:
        return format(self.root.get_span_context().trace_id, "032x")

    def propagation_headers(self) -> dict[str, str]:
        """`traceparent` (and `tracestate`) naming the root span, for the worker."""
        carrier: dict[str, str] = {}
        _PROPAGATOR.inject(carrier, context=self._context)
        return carrier

    def span(self, name: str, start: float, end: float, **attributes: Any) -> None:
        """A finished child span between two event times."""
        assert _tracer is not None
        span = _tracer.start_span(
            name, context=self._context, attributes=attributes or None, start_time=self._ns(start)
        )
        span.end(end_time=self._ns(max(start, end)))

    def end(self, at: float, status: int, **attributes: Any) -> None:
        self.root.set_attributes({"http.response.status_code": status, **attributes})
        if status >= 500:
            self.root.set_status(trace.Status(trace.StatusCode.ERROR))
        self.root.end(end_time=self._ns(at))
        self.detach()

    def detach(self) -> None:
        if self._token is not None:
            otel_context.detach(self._token)  # type: ignore[arg-type]
            self._token = None

    def _ns(self, t: float) -> int:
        return self._epoch_ns + int(t * 1e9)
