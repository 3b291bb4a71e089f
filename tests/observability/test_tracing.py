"""Traces: the span tree of one request with the SDK's in-memory exporter, then a gateway over
loopback exporting to a real OTLP/gRPC receiver, continuing the client's `traceparent`, telling
the worker its own span, and journaling the trace id where `trace:` finds it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from journal.events import Received
from journal.query import QueryError, compile_query
from journal.reader import JournalReader
from smg.observability import tracing
from smg.observability.tracing import RequestTrace, client_trace_id
from tests.conftest import MODEL, Scripted, wait_for_events
from tests.grpc.conftest import QWEN3, target_of
from tools.engine_control import EngineControl
from tools.otlp_receiver import OtlpReceiver, ReceivedSpan
from tools.spawn import Spawned, spawn_engine, spawn_gateway

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE}-{CLIENT_SPAN}-01"
BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "trace me"}]}
ROOT = "POST /v1/messages"
# The gateway's span is exported promptly; a test then waits for it rather than for shutdown.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}


def test_a_request_trace_continues_the_client_and_parents_every_stage() -> None:
    exporter = InMemorySpanExporter()
    tracing.install(exporter=exporter)
    try:
        t0 = time.perf_counter()
        trace = RequestTrace(ROOT, {"traceparent": TRACEPARENT, "tracestate": "vendor=1"}, t0, {"smg.request_id": "r"})
        with tracing.stage("render"):
            with tracing.stage("inner"):
                pass
        upstream = trace.propagation_headers()
        trace.span("admission", 0.0, 0.001)
        trace.span("respond", 0.004, 0.003)  # an end before the start is clamped, never negative
        trace.end(0.005, 503)
        spans = {s.name: s for s in exporter.get_finished_spans()}
    finally:
        tracing.shutdown()
    root = spans[ROOT]
    assert trace.trace_id == TRACE
    assert root.parent is not None and format(root.parent.span_id, "016x") == CLIENT_SPAN
    root_id = root.context.span_id
    for name in ("render", "admission", "respond"):
        assert spans[name].context.trace_id == int(TRACE, 16)
        assert spans[name].parent is not None and spans[name].parent.span_id == root_id
    assert spans["inner"].parent is not None and spans["inner"].parent.span_id == spans["render"].context.span_id
    assert upstream["traceparent"] == f"00-{TRACE}-{root_id:016x}-01"
    assert upstream["tracestate"] == "vendor=1"
    assert spans["admission"].start_time == root.start_time
    assert spans["respond"].end_time == spans["respond"].start_time
    assert root.end_time is not None and root.end_time - root.start_time == 5_000_000
    assert root.attributes is not None and root.attributes["http.response.status_code"] == 503
    assert not root.status.is_ok
    assert not tracing.enabled()


def test_with_tracing_off_stages_cost_nothing_and_the_client_trace_id_is_still_read() -> None:
    assert not tracing.enabled()
    assert tracing.stage("render") is tracing.stage("tokenize")  # one shared no-op
    assert client_trace_id({"traceparent": TRACEPARENT}) == TRACE
    assert client_trace_id({"traceparent": f"00-{'0' * 32}-{CLIENT_SPAN}-01"}) is None
    assert client_trace_id({"traceparent": "garbage"}) is None
    assert client_trace_id({}) is None


def test_trace_term_compiles_to_a_bound_lookup_and_refuses_a_bad_id() -> None:
    sql, params = compile_query(f"trace:{TRACE.upper()} status:200")
    assert params[0] == TRACE and "trace_id = ?" in sql  # the indexed column (journal.search)
    with pytest.raises(QueryError):
        compile_query("trace:1234")
    with pytest.raises(QueryError):
        compile_query(f"trace:!={TRACE}")


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as running:
        yield running


def _tree(spans: list[ReceivedSpan], trace_id: str) -> tuple[ReceivedSpan, dict[str, ReceivedSpan]]:
    mine = [s for s in spans if s.trace_id == trace_id]
    root = next(s for s in mine if s.name == ROOT)
    return root, {s.name: s for s in mine if s.parent_span_id == root.span_id}


def test_spans_reach_an_otlp_receiver_with_the_client_as_parent(
    receiver: OtlpReceiver, worker: Spawned, tmp_path: Path
) -> None:
    handle = Scripted(worker.url)
    handle.reset()
    journal = tmp_path / "journal.db"
    gw = spawn_gateway(
        [worker.url],
        journal=journal,
        extra=["--enable-trace", "--otlp-traces-endpoint", receiver.endpoint],
        env=FAST_EXPORT,
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0) as client:
            traced = client.post("/v1/messages", json=BODY, headers={"traceparent": TRACEPARENT})
            assert traced.status_code == 200
            fresh = client.post("/v1/messages", json={**BODY, "stream": True})
            assert fresh.status_code == 200
        spans = receiver.wait_for(lambda got: sum(s.name == ROOT for s in got) >= 2)
        traced_events = wait_for_events(journal, traced.headers["request-id"])
        fresh_events = wait_for_events(journal, fresh.headers["request-id"])
        with JournalReader(journal) as reader:
            found = [row["id"] for row in reader.list_requests(query=f"trace:{TRACE}")]
    finally:
        gw.stop()

    root, children = _tree(spans, TRACE)
    assert root.parent_span_id == CLIENT_SPAN
    assert root.service == "smg" and root.kind == 2  # SERVER
    assert root.attributes["http.response.status_code"] == 200
    assert root.attributes["gen_ai.request.model"] == MODEL
    assert {"admission", "route", "select_worker", "engine_call", "first_token", "respond"} <= set(children)
    for child in children.values():
        assert root.start_ns <= child.start_ns <= child.end_ns <= root.end_ns
    # The worker continues the gateway's span, in the client's trace.
    sent = handle.received()
    assert sent[0]["headers"]["traceparent"] == f"00-{TRACE}-{root.span_id}-01"
    # Without a traceparent the gateway starts a trace of its own, journaled the same way.
    assert isinstance(traced_events[0], Received) and traced_events[0].trace_id == TRACE
    assert isinstance(fresh_events[0], Received)
    fresh_trace = fresh_events[0].trace_id
    assert fresh_trace is not None and fresh_trace != TRACE
    fresh_root, fresh_children = _tree(spans, fresh_trace)
    assert fresh_root.parent_span_id == ""
    assert sent[1]["headers"]["traceparent"].split("-")[1] == fresh_trace
    assert found == [traced_events[0].request_id]


def test_grpc_render_and_tokenize_are_spans_of_the_request(receiver: OtlpReceiver) -> None:
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", "qwen3-traced"])
    try:
        gw = spawn_gateway(
            [engine.url],
            extra=["--model-path", str(QWEN3), "--enable-trace", "--otlp-traces-endpoint", receiver.endpoint],
            env=FAST_EXPORT,
        )
        try:
            body = {"model": "qwen3-traced", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
            answer = httpx.post(f"{gw.url}/v1/messages", json=body, headers={"traceparent": TRACEPARENT}, timeout=60)
            assert answer.status_code == 200
            spans = receiver.wait_for(lambda got: any(s.name == ROOT for s in got))
            with EngineControl(target_of(engine.url)) as control:
                sent = control.trace_context()
        finally:
            gw.stop()
    finally:
        engine.stop()
    root, children = _tree(spans, TRACE)
    assert {"admission", "render", "tokenize", "route", "engine_call", "first_token", "parse", "respond"} <= set(
        children
    )
    assert children["render"].end_ns <= children["tokenize"].start_ns
    # The engine is told the gateway's span, as gRPC metadata.
    assert sent == [{"traceparent": f"00-{TRACE}-{root.span_id}-01"}]
    assert children["first_token"].end_ns <= children["engine_call"].end_ns
