"""The router: which pool serves a request, and the attempts on its workers.

Per request: the model's workers (404 `model_not_found` when none serves it), then the pool —
an external provider's worker first (Anthropic → the Anthropic connector; any other provider
→ 501), else one of the self-hosted pools (gRPC, ZMQ, HTTP), weighted by their available workers;
count_tokens and `max_tokens: 0` prefer a pool whose gateway answers them itself (gRPC, ZMQ). The
pool's policy picks the worker of each attempt (`Dispatch`). Without IGW only one kind of
worker is configured, and the same code path runs with one pool.

The router also owns the worker lifecycle: static workers at start, workers added and removed
at run time (`add_worker`, `delete_worker`; with `--worker-registry` through the fleet's
registry in Redis, `shared_registry`), and the one health loop for all of them.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import AsyncGenerator, Coroutine, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from journal.events import Event
from smg.backends.base import Call, Connector, ModelCard, WorkerUnreachable, model_cards
from smg.protocol.errors import ApiError
from smg.routing.breaker import CircuitBreaker
from smg.routing.config import RouterConfig
from smg.routing.dispatch import Dispatch, PairDispatch, no_available_workers
from smg.routing.health import HealthMonitor, discover
from smg.routing.policies import (
    NEEDS_TEXT,
    MinimumTokensPolicy,
    Policy,
    RouteContext,
    affinity_key,
    estimated_cost,
    make_policy,
    routing_key,
    routing_text,
)
from smg.routing.pools import GRPC, GRPC_EPD, GRPC_PD, ZMQ, PoolKey
from smg.routing.registry import DuplicateWorker, WorkerRegistry
from smg.routing.self_address import ListeningAddress
from smg.routing.shared_registry import SharedWorkers, WorkerUrlTaken
from smg.routing.worker_urls import WorkerRefused, check_worker_url
from smg.routing.workers import Connection, Role, Worker, worker_kind

log = logging.getLogger("smg.router")

__all__ = ["PROVIDER_MODEL_PREFIXES", "Router", "WorkerRefused", "WorkerSpec"]  # WorkerRefused: worker_urls'

# Models an external provider serves when its own model list is not known (by name, as the
# reference detects providers).
PROVIDER_MODEL_PREFIXES: dict[str, tuple[str, ...]] = {
    "anthropic": ("claude-",),
    "openai": ("gpt-", "o1", "o3", "o4", "chatgpt-"),
    "gemini": ("gemini-",),
    "xai": ("grok-",),
}
# The longest a request for a model no worker serves waits for first discoveries in flight.
DISCOVERY_WAIT_SECS = 2.0
# Pools whose gateway answers count_tokens and `max_tokens: 0` itself, best first.
_SELF_ANSWERING = (GRPC, ZMQ, GRPC_PD, GRPC_EPD)
# Policies that route on the request's text; the others never pay for extracting it.
_TEXT_POLICIES = NEEDS_TEXT | {"prefix_hash"}


@dataclass(frozen=True)
class WorkerSpec:
    """A worker to register: from `--worker-urls` or `POST /workers`."""

    url: str
    external: bool = False
    provider: str | None = None
    api_key: str | None = None
    runtime: str | None = None
    role: Role = "regular"
    bootstrap_port: int | None = None
    models: tuple[str, ...] = ()  # known up front (external workers), else discovered
    wildcard: bool = False  # serves every model (`--backend anthropic`)


def _has_role(workers: list[Worker], role: str) -> bool:
    return any(w.role == role for w in workers)


def _available(key: PoolKey, workers: list[Worker]) -> int:
    """A pool's weight: its available workers; a disaggregated pool's, its available pairs."""
    if not key.disaggregated:
        return sum(w.available for w in workers)
    return min(sum(w.available for w in workers if w.role == role) for role in ("prefill", "decode"))


def gateway_itself(url: str) -> WorkerRefused:
    return WorkerRefused(
        f"Worker URL {url!r} leads to this gateway itself: it would relay every request to itself",
        "WORKER_IS_GATEWAY",
    )


def ipc_not_shared(url: str) -> WorkerRefused:
    return WorkerRefused(
        f"Worker URL {url!r} is a socket on this host: the shared worker registry holds workers every "
        "replica can reach; give ipc:// workers to each replica with --worker-urls",
        "IPC_WORKER_NOT_SHARED",
    )


def no_prefill_servers() -> ApiError:
    return ApiError(503, "No prefill servers available", code="no_prefill_servers")


def no_decode_servers() -> ApiError:
    return ApiError(503, "No decode servers available", code="no_decode_servers")


def no_encode_servers() -> ApiError:
    return ApiError(503, "No encode servers available", code="no_encode_servers")


class Router:
    def __init__(
        self,
        config: RouterConfig,
        connectors: Mapping[PoolKey, Connector] | Mapping[str, Connector],
        registry: WorkerRegistry | None = None,
        rng: random.Random | None = None,
        listening: ListeningAddress | None = None,
    ) -> None:
        self.config = config
        self._listening = listening  # the gateway's own address: never a worker of its own
        self.registry = registry or WorkerRegistry()
        # A pool's connector, by its key (or its name: `"grpc"`, `"grpc-pd"`).
        self._connectors = {PoolKey.parse(k) if isinstance(k, str) else k: c for k, c in connectors.items()}
        self._rng = rng or random.Random()
        self._policies: dict[tuple[PoolKey, str | None], Policy] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._discovering: dict[str, asyncio.Task[Any]] = {}  # first discoveries in flight, by worker id
        self._ranks = MinimumTokensPolicy() if config.dp_minimum_tokens_scheduler else None
        self._monitor = HealthMonitor(self.registry, self._connector_of, config.health, self._expand_dp)
        self.registry.on_remove(self._forget_in_policies)
        self.shared: SharedWorkers | None = None  # --worker-registry: the fleet's workers

    # lifecycle

    async def start(self, static: list[WorkerSpec]) -> None:
        for connector in self._connectors.values():
            await connector.start()
        workers = [self._register(spec, source="static") for spec in static]
        await asyncio.gather(*(self._discover(w) for w in workers))
        if self.shared is not None:
            await self.shared.start()
        self._monitor.start()

    async def close(self) -> None:
        if self.shared is not None:
            await self.shared.close()
        await self._monitor.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for connector in self._connectors.values():
            await connector.close()

    # workers

    def connector_key(self, worker: Worker) -> PoolKey:
        return PoolKey.of(worker, self.config.epd)

    def _connector_of(self, worker: Worker) -> Connector | None:
        return self._connectors.get(self.connector_key(worker))

    def _register(self, spec: WorkerSpec, source: str, worker_id: str = "") -> Worker:
        url = spec.url.rstrip("/")
        try:
            connection: Connection = "http" if spec.external else worker_kind(url)
        except ValueError as exc:
            raise WorkerRefused(str(exc)) from None
        check_worker_url(url, provider=spec.provider if spec.external else None, config=self.config.urls)
        worker = Worker(
            url=url,
            connection=connection,
            runtime=spec.provider if spec.external else (spec.runtime or self.config.runtime),
            role=spec.role,
            external=spec.external,
            api_key=spec.api_key,
            bootstrap_port=spec.bootstrap_port,
            wildcard=spec.wildcard,
            source="api" if source == "api" else "static",
            breaker=CircuitBreaker(self.config.breaker),
            id=worker_id,
        )
        if spec.external:
            if worker.runtime not in PROVIDER_MODEL_PREFIXES:
                known = ", ".join(PROVIDER_MODEL_PREFIXES)
                raise WorkerRefused(f"unknown provider {spec.provider!r} for an external worker (known: {known})")
            worker.models = set(spec.models)
        key = self.connector_key(worker)
        if key not in self._connectors and not worker.external:
            kinds = ", ".join(sorted(k.name for k in self._connectors)) or "none"
            raise WorkerRefused(
                f"this gateway serves {kinds} workers; a {key} worker needs IGW mode (--enable-igw)"
                if not self.config.igw
                else f"no connector for {key} workers"
            )
        return self.registry.add(worker)

    async def _discover(self, worker: Worker) -> None:
        """A worker's first discovery (in a task of its own: requests for a model no worker
        serves yet wait for the ones in flight)."""
        task = asyncio.current_task()
        if task is not None:
            self._discovering[worker.id] = task
            task.add_done_callback(lambda _: self._discovering.pop(worker.id, None))
        connector = self._connector_of(worker)
        if worker.external and not worker.wildcard:
            # A provider's API is up once registered. Its models: as given, else its own list
            # (read with the worker's key), else the provider's model names.
            if not worker.models and worker.api_key and connector is not None:
                try:
                    found = await connector.discover(worker)
                    worker.models = set(found.models)
                except WorkerUnreachable as exc:
                    log.warning("worker %s: model list not read (%s); serving %s models by name", worker.url, exc,
                                worker.runtime)
            if not worker.models:
                worker.prefixes = PROVIDER_MODEL_PREFIXES.get(worker.runtime or "", ())
            worker.discovered_as({m: None for m in worker.models}, True)
            return
        if connector is not None and await discover(worker, connector):
            self._expand_dp(worker)

    def _expand_dp(self, worker: Worker) -> None:
        """Under `--dp-aware`, an engine with N data-parallel ranks is served as N workers, each
        pinned to its rank (`url@rank`): the policies choose among ranks, each with its own
        load and circuit breaker, as the reference's expanded workers."""
        size = worker.dp_size
        if not self.config.dp_aware or size is None or size < 2 or worker.dp_rank is not None or worker.removed:
            return
        old_key = worker.key
        worker.dp_rank = 0
        self.registry.rekey(worker, old_key)
        windows = {m: worker.context_windows.get(m) for m in worker.models}
        for rank in range(1, size):
            sibling = Worker(
                url=worker.url,
                connection=worker.connection,
                runtime=worker.runtime,
                role=worker.role,
                api_key=worker.api_key,
                bootstrap_port=worker.bootstrap_port,
                dp_rank=rank,
                dp_size=size,
                source=worker.source,
                breaker=CircuitBreaker(self.config.breaker),
            )
            sibling.discovered_as(windows, worker.healthy)
            try:
                self.registry.add(sibling)
            except DuplicateWorker:
                continue  # registered already (by the worker API)
        log.info("worker %s: %d data-parallel ranks, served as %s@0..%d", worker.url, size, worker.url, size - 1)

    async def add_worker(self, spec: WorkerSpec) -> Worker:
        """Register a worker at run time; it is discovered in the background and routed to
        once it answers. Raises `WorkerRefused`, having sent nothing to the URL. With a shared
        registry the fleet registers it before it is discovered (raises `DuplicateWorker` when
        another replica has its URL, `SharedStateDown` when Redis is away; either way it is taken
        out again)."""
        check_worker_url(spec.url, provider=spec.provider if spec.external else None, config=self.config.urls)
        if self._listening is not None and await asyncio.to_thread(self._listening.leads_here, spec.url):
            raise gateway_itself(spec.url)
        if self.shared is not None and spec.url.startswith("ipc://"):
            raise ipc_not_shared(spec.url)
        worker = self._register(spec, source="api")
        if self.shared is not None:
            try:
                await self.shared.add(worker.id, spec)
            except WorkerUrlTaken as taken:
                self.registry.remove(worker.id)
                message = f"a worker with URL {worker.key} is registered already"
                raise DuplicateWorker(message, taken.worker_id) from None
            except BaseException:
                self.registry.remove(worker.id)
                raise
        self.spawn_discovery(worker)
        return worker

    async def register(self, spec: WorkerSpec, worker_id: str) -> Worker:
        """A worker another replica added (its id is the fleet's); discovered by the caller.
        Raises `WorkerRefused` (this gateway's own address among them: the replica that added
        it checked only its own)."""
        if self._listening is not None and await asyncio.to_thread(self._listening.leads_here, spec.url):
            raise gateway_itself(spec.url)
        return self._register(spec, source="api", worker_id=worker_id)

    async def discover_worker(self, worker: Worker) -> None:
        await self._discover(worker)

    def spawn_discovery(self, worker: Worker) -> None:
        task = self._spawn(self._discover(worker), f"smg-discover-{worker.id}")
        # In flight from now, not from the task's first step: a request that comes before the
        # loop has run the task (the next one on the connection that added the worker) waits too.
        self._discovering[worker.id] = task
        task.add_done_callback(lambda _: self._discovering.pop(worker.id, None))

    async def delete_worker(self, worker_id: str) -> Worker | None:
        """`DELETE /workers/{id}`: out of the fleet's registry first (raises `SharedStateDown`
        when Redis is away), then out of this replica's."""
        if self.shared is not None:
            await self.shared.remove(worker_id)
        return self.remove_worker(worker_id)

    def remove_worker(self, worker_id: str) -> Worker | None:
        """No new request goes to the worker; the ones in flight finish."""
        worker = self.registry.remove(worker_id)
        if worker is not None and worker.in_flight == 0:
            self._release(worker)
        return worker

    def _release(self, worker: Worker) -> None:
        connector = self._connector_of(worker)
        if connector is not None:
            self._spawn(connector.forget(worker), f"smg-forget-{worker.id}")

    def _forget_in_policies(self, worker: Worker) -> None:
        for policy in self._policies.values():
            policy.forget(worker.id)

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # what the gateway serves

    def models(self) -> list[ModelCard]:
        return model_cards(w for w in self.registry.all() if w.discovered and not w.wildcard)

    def ready(self) -> bool:
        return self.not_ready_reason() is None

    def not_ready_reason(self) -> str | None:
        """None when some worker can take a request and every connector is ready for its
        workers (a gRPC model's tokenizer is loaded); else why not."""
        groups: dict[PoolKey, list[Worker]] = {}
        for worker in self.registry.all():
            if worker.available:
                groups.setdefault(self.connector_key(worker), []).append(worker)
        if not groups:
            return "insufficient healthy workers"
        for key, workers in groups.items():
            connector = self._connectors.get(key)
            if connector is not None and not connector.ready(workers):
                return (
                    f"{key} workers not ready (a model's tokenizer is still loading or failed, or a role of a "
                    "disaggregated pool has no healthy worker)"
                )
        return None

    def generates(self, backend: str) -> bool:
        """Whether the connector a `routed` event names (its journal name) generates the answer
        itself (`Connector.generates`) rather than relaying one."""
        return any(c.generates for c in self._connectors.values() if c.name == backend)

    def connector(self, key: PoolKey | str) -> Connector | None:
        """A pool's connector, by its key or its name (`"grpc-pd"`)."""
        return self._connectors.get(PoolKey.parse(key) if isinstance(key, str) else key)

    def provider_worker(self, provider: str) -> Worker | None:
        """An available worker of an external provider (for answers the provider's API gives
        itself, such as its model list)."""
        workers = [w for w in self.registry.all() if w.external and w.runtime == provider and w.available]
        return min(workers, key=lambda w: w.load) if workers else None

    # requests

    def _policy(self, pool: PoolKey, role: str | None, name: str | None = None) -> Policy:
        policy = self._policies.get((pool, role))
        if policy is None:
            chosen = name or self.config.policy
            policy = self._policies[pool, role] = make_policy(chosen, self.config.policies, rng=self._rng)
        return policy

    def route(self, call: Call) -> tuple[PoolKey, list[Worker]]:
        """The pool that serves the call and its workers of the model. Raises `ApiError`."""
        serving = self.registry.serving(call.model)
        if not serving:
            if any(not w.discovered for w in self.registry.all()):
                raise ApiError(
                    503,
                    f"No reachable worker for model '{call.model}': some workers have not answered yet",
                    code="no_available_workers",
                )
            raise ApiError(404, f"No worker available for model '{call.model}'", code="model_not_found")
        external = [w for w in serving if w.external]
        if external:
            provider = external[0].runtime or ""
            if PoolKey(provider) in self._connectors:
                return PoolKey(provider), [w for w in external if w.runtime == provider]
            raise ApiError(501, "Messages API not yet implemented for this router", code="not_implemented")
        pools: dict[PoolKey, list[Worker]] = {}
        for worker in serving:
            key = PoolKey.of(worker, self.config.epd)
            if key in self._connectors:
                pools.setdefault(key, []).append(worker)
        if not pools:
            raise ApiError(404, f"No worker available for model '{call.model}'", code="model_not_found")
        counting = call.endpoint == "count_tokens"
        if counting:
            # A disaggregated pool answers count_tokens with its prefill workers alone.
            pools = {k: ws for k, ws in pools.items() if not k.disaggregated or _has_role(ws, "prefill")}
        if len(pools) == 1:
            return next(iter(pools.items()))
        answers_itself = counting or getattr(call.request, "max_tokens", None) == 0
        if answers_itself:
            for key in _SELF_ANSWERING:
                if key in pools:
                    return key, pools[key]
        weights = {key: _available(key, workers) for key, workers in pools.items()}
        if not any(weights.values()):
            key = min(pools, key=str)  # every pool is down: any of them gives the same 503
            return key, pools[key]
        keys = [k for k, n in weights.items() if n]
        key = self._rng.choices(keys, weights=[weights[k] for k in keys])[0]
        return key, pools[key]

    def _context(self, call: Call) -> RouteContext:
        policy = self.config.policy
        return RouteContext(
            model=call.model,
            text=routing_text(call.request) if policy in _TEXT_POLICIES else "",
            routing_key=routing_key(call.headers, self.config.policies.routing_key_headers),
            affinity_key=affinity_key(call.headers) if policy == "consistent_hashing" else None,
            cost=estimated_cost(routing_text(call.request)) if self._ranks is not None else 1,
        )

    def _dispatch(
        self, key: PoolKey, connector: Connector, call: Call, workers: list[Worker], role: str | None = None
    ) -> Dispatch:
        policy_name = {
            "prefill": self.config.prefill_policy,
            "decode": self.config.decode_policy,
            "encode": self.config.encode_policy,
        }.get(role or "")
        empty = {"prefill": no_prefill_servers, "decode": no_decode_servers, "encode": no_encode_servers}.get(
            role or "", no_available_workers
        )
        return Dispatch(
            backend=connector.name,
            generates=connector.generates,
            model=call.model,
            workers=[w for w in workers if role is None or w.role == role],
            policy=self._policy(key, role, policy_name),
            context=self._context(call),
            retry=self.config.retry,
            on_idle=self._release,
            empty=empty,
            endpoint=call.endpoint,
            ranks=self._ranks,
        )

    async def _await_discovery(self, model: str) -> None:
        """A worker added moments ago may serve this model: first discoveries in flight (tens of
        milliseconds each) are waited for, one at a time, until one brings the model or
        `DISCOVERY_WAIT_SECS` have passed; a model no worker serves is refused then, not once
        the slowest worker has answered (or timed out)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + DISCOVERY_WAIT_SECS
        while self._discovering and not self.registry.serving(model):
            left = deadline - loop.time()
            if left <= 0:
                return
            await asyncio.wait(set(self._discovering.values()), timeout=left, return_when=asyncio.FIRST_COMPLETED)

    async def handle(self, call: Call) -> AsyncGenerator[Event, None]:
        if self._discovering and not self.registry.serving(call.model):
            await self._await_discovery(call.model)
        key, workers = self.route(call)
        connector = self._connectors[key]
        dispatch: Dispatch | PairDispatch
        if not key.disaggregated:
            dispatch = self._dispatch(key, connector, call, workers)
        elif call.endpoint == "count_tokens":
            dispatch = self._dispatch(key, connector, call, workers, "prefill")
        else:
            prefill = self._dispatch(key, connector, call, workers, "prefill")
            decode = self._dispatch(key, connector, call, workers, "decode")
            encode = self._dispatch(key, connector, call, workers, "encode") if key.encodes else None
            dispatch = PairDispatch(prefill, decode, self.config.retry, encode)
        attempts = dispatch.attempts()
        try:
            async with aclosing(connector.handle(call, workers, attempts)) as events:
                async for event in events:
                    yield event
        finally:
            await attempts.aclose()
            dispatch.release()
