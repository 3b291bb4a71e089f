"""What starts before the gateway serves and stops after it: the journal writer, the admission
gates, the router and its workers, the metrics listener (with its connection gauge) and the
trace exporter."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from sanic import Sanic

from smg.admission import Gates
from smg.config import GatewayConfig
from smg.observability import metrics, tracing
from smg.observability.metrics import MetricsServer
from smg.routing.router import Router, WorkerSpec
from smg.server import memory
from smg.shared import link as shared_link
from smg.shared.link import RedisCollector


def install(
    app: Sanic[Any, Any],
    config: GatewayConfig,
    router: Router,
    journal: Any,
    static: list[WorkerSpec],
    admission: Gates,
) -> None:
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
