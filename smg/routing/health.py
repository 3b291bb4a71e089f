"""One health and discovery loop for every worker, whatever its kind.

Each tick, workers that have not said what they serve are asked again, workers that are down
are probed, and the others' engine loads are read (where the engine reports them); every
`interval_secs`, healthy workers are probed too (unless health checks are off: then only a
worker taken out by a failed request is probed, to bring it back). The connector of the
worker's kind does the asking; the worker's own state machine (`Worker.health_checked`)
decides what an answer means.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from smg.backends.base import Connector, ReportsKvTokens, WorkerUnreachable
from smg.routing.registry import WorkerRegistry
from smg.routing.workers import HealthConfig, Worker

log = logging.getLogger("smg.health")

# Undiscovered and unhealthy workers are probed at least this often, whatever the interval.
RECHECK_SECS = 2.0


async def discover(worker: Worker, connector: Connector) -> bool:
    """Ask the worker what it serves; True when it answered."""
    try:
        found = await connector.discover(worker)
    except WorkerUnreachable as exc:
        worker.unreachable(f"model discovery failed: {exc}")
        return False
    if worker.removed:
        return False
    worker.discovered_as(found.models, found.healthy, found.runtime)
    if found.dp_size is not None:
        worker.dp_size = found.dp_size
    log.info(
        "worker %s (%s%s) serves %s",
        worker.url,
        connector.name,
        f", {worker.runtime}" if worker.runtime else "",
        ", ".join(f"{m} (context {found.models[m] or 'not advertised'})" for m in sorted(found.models)) or "no models",
    )
    return True


async def poll_load(worker: Worker, connector: Connector) -> None:
    try:
        worker.engine_load = await connector.load(worker)
    except WorkerUnreachable as exc:
        # The connector knows the worker is gone (a ZMQ engine that died): out now, not at the next probe.
        worker.refused(str(exc))
        return
    if isinstance(connector, ReportsKvTokens):
        worker.kv_tokens = connector.kv_tokens(worker)


async def probe(worker: Worker, connector: Connector, config: HealthConfig) -> None:
    try:
        ok = await connector.check_health(worker, config.timeout_secs, config.endpoint)
        error = None if ok else "health check answered unhealthy"
    except WorkerUnreachable as exc:
        ok, error = False, f"health check failed: {exc}"
    worker.health_checked(ok, error, config)


class HealthMonitor:
    def __init__(
        self,
        registry: WorkerRegistry,
        connector_of: Callable[[Worker], Connector | None],
        config: HealthConfig,
        on_discovered: Callable[[Worker], None] | None = None,
    ) -> None:
        self._registry = registry
        self._connector_of = connector_of
        self._config = config
        self._on_discovered = on_discovered
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="smg-health")

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _discover(self, worker: Worker, connector: Connector) -> None:
        if await discover(worker, connector) and self._on_discovered is not None:
            self._on_discovered(worker)

    async def _run(self) -> None:
        interval = self._config.interval_secs
        tick = min(RECHECK_SECS, interval)
        elapsed = 0.0
        while True:
            await asyncio.sleep(tick)
            elapsed += tick
            full_round = elapsed >= interval
            if full_round:
                elapsed = 0.0
            checks: list[Coroutine[Any, Any, object]] = []
            for worker in self._registry.all():
                connector = self._connector_of(worker)
                if connector is None:
                    continue  # an external provider this gateway only answers 501 for
                if not worker.discovered:
                    checks.append(self._discover(worker, connector))
                elif not worker.healthy or (self._config.enabled and full_round):
                    # A worker taken out by a failed request is probed back even with health checks off.
                    checks.append(probe(worker, connector, self._config))
                else:
                    checks.append(poll_load(worker, connector))
            # Concurrently: one slow worker must not delay the others' checks.
            results = await asyncio.gather(*checks, return_exceptions=True)
            for result in results:
                if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                    log.error("health check failed unexpectedly", exc_info=result)
