"""The Prometheus metrics, named and labelled as the reference gateway's (`smg_http_*`,
`smg_router_*`, `smg_worker_*`, `smg_mcp_*`), so that its dashboards and alerts work unchanged,
plus the journal's own (`smg_journal_*`), and the listener that serves them.

Counting happens where work already ends: a request's end (`smg.server.observe`), an attempt's
lease and settlement (`smg.routing.dispatch`). State that is already kept — a worker's health,
breaker and in-flight count, the journal writer's counters — is read when Prometheus scrapes
(`StateCollector`), so it costs nothing per request. Nothing here awaits or runs per token.

`current` is the process's metrics, or None when `--prometheus-port` is not given; callers test
it once (`m = metrics.current` then `if m is not None`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger("smg.metrics")

# Circuit breaker states as the reference's gauge encodes them.
CB_STATE_CODES = {"closed": 0, "open": 1, "half_open": 2}


class Metrics:
    """One process's metrics, in a registry of their own."""

    def __init__(self, buckets: Iterable[float]) -> None:
        # `_created` series are not part of the reference's exposition.
        disable_created_metrics()  # type: ignore[no-untyped-call]
        b = tuple(buckets)
        self.registry = registry = CollectorRegistry(auto_describe=True)

        def counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> Counter:
            return Counter(name, doc, labels, registry=registry)

        def histogram(name: str, doc: str, labels: tuple[str, ...]) -> Histogram:
            return Histogram(name, doc, labels, registry=registry, buckets=b)

        # Layer 1: HTTP
        self.http_requests = counter(
            "smg_http_requests_total", "Total HTTP requests by method and path", ("method", "path")
        )
        self.http_responses = counter(
            "smg_http_responses_total",
            "Total HTTP responses by path, status_code and error_code",
            ("path", "status_code", "error_code"),
        )
        self.http_duration = histogram(
            "smg_http_request_duration_seconds", "HTTP request duration by method and path", ("method", "path")
        )
        self.http_connections = Gauge(
            "smg_http_connections_active", "Currently active HTTP connections", registry=registry
        )
        self.rate_limit = counter(
            "smg_http_rate_limit_total", "Rate limiting decisions by result (allowed/rejected)", ("result",)
        )
        # Layer 2: router
        route = ("router_type", "backend_type", "connection_mode", "model", "endpoint")
        inference = ("router_type", "backend_type", "model", "endpoint")
        self.router_requests = counter(
            "smg_router_requests_total",
            "Total routed requests by router_type, backend_type, connection_mode, model, endpoint, streaming",
            (*route, "streaming"),
        )
        self.router_duration = histogram(
            "smg_router_request_duration_seconds",
            "Router request duration by router_type, backend_type, connection_mode, model, endpoint",
            route,
        )
        self.router_errors = counter(
            "smg_router_request_errors_total",
            "Router errors by router_type, backend_type, connection_mode, model, endpoint, error_type",
            (*route, "error_type"),
        )
        self.upstream_responses = counter(
            "smg_router_upstream_responses_total",
            "Upstream backend HTTP responses by router_type, status_code, error_code",
            ("router_type", "status_code", "error_code"),
        )
        self.ttft = histogram(
            "smg_router_ttft_seconds",
            "Time to first token by router_type, backend_type, model, endpoint (gRPC only)",
            inference,
        )
        self.tpot = histogram(
            "smg_router_tpot_seconds",
            "Time per output token by router_type, backend_type, model, endpoint (gRPC only)",
            inference,
        )
        self.generation_duration = histogram(
            "smg_router_generation_duration_seconds",
            "Total generation time by router_type, backend_type, model, endpoint (gRPC only)",
            inference,
        )
        self.tokens = counter(
            "smg_router_tokens_total",
            "Total tokens processed by router_type, backend_type, model, endpoint, token_type (gRPC only)",
            (*inference, "token_type"),
        )
        # Layer 3: workers
        self.selection = counter(
            "smg_worker_selection_total",
            "Worker selection events by worker_type, connection_mode, model, policy",
            ("worker_type", "connection_mode", "model", "policy"),
        )
        self.worker_requests = counter(
            "smg_worker_requests_total",
            "Requests dispatched to a worker by worker (URL) and model, counted at each send",
            ("worker", "model"),
        )
        self.retries = counter(
            "smg_worker_retries_total", "Total retry attempts by worker_type and endpoint", ("worker_type", "endpoint")
        )
        self.retries_exhausted = counter(
            "smg_worker_retries_exhausted_total",
            "Requests that exhausted all retries by worker_type and endpoint",
            ("worker_type", "endpoint"),
        )
        self.cb_outcomes = counter(
            "smg_worker_cb_outcomes_total",
            "Circuit breaker outcomes by worker and outcome (success/failure)",
            ("worker", "outcome"),
        )
        self.cb_transitions = counter(
            "smg_worker_cb_transitions_total",
            "Circuit breaker state transitions by worker, from, to",
            ("worker", "from", "to"),
        )
        # Layer 5: MCP
        self.mcp_calls = counter(
            "smg_mcp_tool_calls_total",
            "Total MCP tool invocations by model, tool_name, result",
            ("model", "tool_name", "result"),
        )
        self.mcp_duration = histogram(
            "smg_mcp_tool_duration_seconds", "MCP tool execution duration by model, tool_name", ("model", "tool_name")
        )
        self.state = StateCollector()
        registry.register(self.state)

    def exposition(self) -> bytes:
        """The text format Prometheus scrapes."""
        return generate_latest(self.registry)


class StateCollector(Collector):
    """Gauges and counters read from state the gateway keeps anyway, at scrape time."""

    def __init__(self) -> None:
        # `smg.routing.workers.Worker`s: url, connection, role, models, healthy, removed, in_flight, breaker.
        self.workers: Callable[[], Iterable[Any]] = list
        self.journal: Callable[[], Mapping[str, int]] = dict
        # `journal.pg.shipper.Shipper.stats` (`--journal-sink`): empty without a sink.
        self.sink: Callable[[], Mapping[str, float]] = dict

    def describe(self) -> Iterable[Metric]:
        return []  # the families depend on what exists at scrape time

    def collect(self) -> Iterator[Metric]:
        yield from self._workers()
        yield from self._journal()
        yield from self._sink()

    def _workers(self) -> Iterator[Metric]:
        pool = GaugeMetricFamily(
            "smg_worker_pool_size",
            "Current worker pool size by worker_type, connection_mode, model",
            labels=("worker_type", "connection_mode", "model"),
        )
        active = GaugeMetricFamily(
            "smg_worker_requests_active", "Currently running requests per worker", labels=("worker",)
        )
        health = GaugeMetricFamily(
            "smg_worker_health", "Worker health status (1=healthy, 0=unhealthy)", labels=("worker",)
        )
        cb = GaugeMetricFamily(
            "smg_worker_cb_state",
            "Circuit breaker state per worker (0=closed, 1=open, 2=half_open)",
            labels=("worker",),
        )
        sizes: dict[tuple[str, str, str], int] = {}
        for worker in self.workers():
            if worker.removed:
                continue
            for model in worker.models:
                key = (worker.role, worker.connection, model)
                sizes[key] = sizes.get(key, 0) + 1
            active.add_metric((worker.url,), worker.in_flight)
            health.add_metric((worker.url,), 1 if worker.healthy else 0)
            cb.add_metric((worker.url,), CB_STATE_CODES.get(worker.breaker.state, 0))
        for labels, size in sizes.items():
            pool.add_metric(labels, size)
        yield from (pool, active, health, cb)

    def _journal(self) -> Iterator[Metric]:
        stats = self.journal()
        if not stats:
            return
        gauges = {
            "queue_depth": ("smg_journal_queue_depth", "Events waiting in memory for the journal writer"),
            "pending_events": ("smg_journal_pending_events", "Events prepared but not yet committed"),
            "max_batch_seen": ("smg_journal_batch_size_max", "Largest batch of events committed at once"),
            "failing": ("smg_journal_failing", "1 while the journal's commits are failing"),
        }
        counters = {
            "events_written": ("smg_journal_events_written", "Events committed to the journal"),
            "events_dropped": ("smg_journal_events_dropped", "Events dropped (journal failing or its queue full)"),
            "batches": (
                "smg_journal_batches",
                "Batches (transactions) committed; events_written / batches is the mean batch size",
            ),
            "batches_failed": ("smg_journal_batches_failed", "Batches whose commit failed"),
        }
        yield from _families(stats, gauges, counters)
        if "commit_us_total" in stats:
            yield CounterMetricFamily(
                "smg_journal_commit_seconds",
                "Time spent committing batches; over batches_total, the mean commit latency",
                value=stats["commit_us_total"] / 1e6,
            )
            yield GaugeMetricFamily(
                "smg_journal_commit_seconds_last",
                "The last commit's latency",
                value=stats.get("commit_us_last", 0) / 1e6,
            )
            yield GaugeMetricFamily(
                "smg_journal_commit_seconds_max",
                "The slowest commit's latency",
                value=stats.get("commit_us_max", 0) / 1e6,
            )

    def _sink(self) -> Iterator[Metric]:
        stats = self.sink()
        if not stats:
            return
        gauges = {
            "lag_seconds": (
                "smg_journal_sink_lag_seconds",
                "Age of the oldest completed request not yet shipped to the fleet journal (0 when none waits)",
            ),
            "unshipped": ("smg_journal_sink_unshipped_requests", "Completed requests waiting to ship"),
            "shipping": ("smg_journal_sink_shipping", "1 while this process ships and the fleet journal answers"),
            "past_retention": (
                "smg_journal_sink_unshipped_past_retention",
                "Unshipped requests older than --journal-retention, kept by retention until they ship",
            ),
        }
        counters = {
            "batches": ("smg_journal_sink_batches", "Batches (PostgreSQL transactions) shipped"),
            "failures": ("smg_journal_sink_failures", "Shipping attempts that failed (outage, refusal)"),
            "requests_shipped": ("smg_journal_sink_requests_shipped", "Requests inserted into the fleet journal"),
            "events_shipped": ("smg_journal_sink_rows_shipped", "Event rows inserted into the fleet journal"),
            "duplicates": (
                "smg_journal_sink_duplicates",
                "Requests sent again that the fleet journal already had (after a crash), inserted nothing",
            ),
            "refused": ("smg_journal_sink_refused", "Requests the fleet journal refused alone, left unshipped"),
        }
        yield from _families(stats, gauges, counters)


def _families(
    stats: Mapping[str, float], gauges: Mapping[str, tuple[str, str]], counters: Mapping[str, tuple[str, str]]
) -> Iterator[Metric]:
    """A gauge or a counter per key of `stats` named in `gauges` or `counters` (name, help); a key
    the stats lack yields nothing, so a writer or shipper without that counter shows no series."""
    for key, (name, doc) in gauges.items():
        if key in stats:
            yield GaugeMetricFamily(name, doc, value=stats[key])
    for key, (name, doc) in counters.items():
        if key in stats:
            yield CounterMetricFamily(name, doc, value=stats[key])


current: Metrics | None = None
"""The process's metrics; None when they are off."""


def install(buckets: Iterable[float]) -> Metrics:
    global current
    current = Metrics(buckets)
    return current


def uninstall() -> None:
    global current
    current = None


class MetricsServer:
    """`GET /metrics` on a listener of its own, in the gateway's event loop (the scrape reads
    router state that only the loop may touch)."""

    def __init__(self, metrics: Metrics, host: str, port: int) -> None:
        self._metrics = metrics
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, self._host, self._port)
        log.info("metrics on http://%s:%d/metrics", self._host, self._port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10.0)
            method, _, rest = head.partition(b" ")
            target = rest.partition(b" ")[0].split(b"?", 1)[0]
            if method not in (b"GET", b"HEAD"):
                status, body, ctype = b"405 Method Not Allowed", b"", b"text/plain"
            elif target == b"/metrics":
                status, body = b"200 OK", self._metrics.exposition()
                ctype = b"text/plain; version=0.0.4; charset=utf-8"
            else:
                status, body, ctype = b"404 Not Found", b"not found\n", b"text/plain"
            payload = b"" if method == b"HEAD" else body
            writer.write(
                b"HTTP/1.1 "
                + status
                + b"\r\nContent-Type: "
                + ctype
                + b"\r\nContent-Length: "
                + str(len(body)).encode()
                + b"\r\nConnection: close\r\n\r\n"
                + payload
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError):
            pass
        finally:
            writer.close()
