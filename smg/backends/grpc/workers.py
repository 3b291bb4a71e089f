"""The engines an engine connector talks to: one client per worker, what each serves, and its
model's tokenizer.

A worker's client is made on first use (its runtime `--backend`'s, else detected) and kept until
the router forgets the worker. Discovery and health checks register the model's tokenizer: a
configured one is loaded before the worker serves; an autoloaded one (fetched from the worker,
seconds for a real model) loads while the gateway already serves, and a request for its model
waits for it up to `--tokenizer-wait-secs` before the registry's refusal. `ready` is the
connector's readiness; `load` its workers' queue lengths.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from smg.backends.base import Discovery, Target, WorkerUnreachable
from smg.backends.grpc.discovery import EngineWorker, check_health, describe, register_tokenizer
from smg.backends.grpc.request import sampling_defaults
from smg.backends.grpc.types import EngineClient, EngineError
from smg.config import GatewayConfig
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.pipeline.tokenizers.tokenizer import Tokenizer, warm_import
from smg.protocol.errors import ApiError

# A worker's engine runtime and its protocol client; raises `WorkerUnreachable`.
ClientFactory = Callable[[Target], Awaitable[tuple[str, EngineClient]]]


class EngineWorkers:
    """The engine clients by worker, and their models' tokenizers."""

    def __init__(
        self,
        config: GatewayConfig,
        tokenizers: TokenizerRegistry,
        clients: ClientFactory,
        *,
        live_loads: bool = False,
    ) -> None:
        self._config = config
        self.tokenizers = tokenizers
        self._clients = clients
        # The client's `loads` is local knowledge of whether its engine is alive (ZMQ): an
        # UNAVAILABLE there takes the worker out at once.
        self._live_loads = live_loads
        self._engines: dict[str, EngineWorker] = {}
        self._autoloads: dict[str, asyncio.Task[None]] = {}  # engine URL → its tokenizer's autoload
        self._configured_tokenizer = config.tokenizer_path or config.model_path
        self._chat_template = str(config.chat_template) if config.chat_template else None

    def start(self) -> None:
        if self.tokenizers.autoload and not self._configured_tokenizer:
            # Every tokenizer this gateway will hold comes from a worker, later: importing
            # transformers (seconds) now keeps it off a new worker's way to serving.
            threading.Thread(target=warm_import, name="smg-tokenizer-import", daemon=True).start()

    async def close(self) -> None:
        for task in self._autoloads.values():
            task.cancel()
        await asyncio.gather(*self._autoloads.values(), return_exceptions=True)
        await self.tokenizers.close()
        engines = {id(e): e for e in self._engines.values()}.values()  # the ranks of one engine share it
        await asyncio.gather(*(e.client.close() for e in engines), return_exceptions=True)

    async def engine(self, target: Target) -> EngineWorker:
        """The worker's engine client (connected on first use, its runtime detected if unknown)."""
        engine = self._engines.get(target.id)
        if engine is None and target.dp_rank is not None:
            # The ranks of one engine (`url@rank`) share its client and what it said of itself.
            engine = next((e for e in self._engines.values() if e.url == target.url), None)
            if engine is not None:
                self._engines[target.id] = engine
        if engine is None:
            runtime, client = await self._clients(target)
            engine = self._engines.get(target.id)  # another task may have made it meanwhile
            if engine is not None:
                await client.close()
                return engine
            engine = self._engines[target.id] = EngineWorker(url=target.url, client=client, runtime=runtime)
        return engine

    async def discover(self, target: Target) -> Discovery:
        engine = await self.engine(target)
        found = await describe(engine, dp_aware=self._config.router.dp_aware)
        assert engine.info is not None
        engine.sampling_defaults = sampling_defaults(engine.info.default_sampling)
        await self._register_tokenizer(engine)
        return found

    async def _register_tokenizer(self, engine: EngineWorker) -> None:
        if self._configured_tokenizer:
            await self._load_tokenizer(engine)
            return
        if engine.url in self._autoloads:
            return
        task = asyncio.get_running_loop().create_task(self._load_tokenizer(engine), name=f"smg-autoload-{engine.url}")
        self._autoloads[engine.url] = task
        task.add_done_callback(lambda _: self._autoloads.pop(engine.url, None))

    async def _load_tokenizer(self, engine: EngineWorker) -> None:
        await register_tokenizer(
            engine, self.tokenizers, configured_path=self._configured_tokenizer, chat_template=self._chat_template
        )

    async def tokenizer(self, model: str, pool: Sequence[Target]) -> Tokenizer:
        """The model's tokenizer; one still being fetched or loaded is waited for (up to
        `--tokenizer-wait-secs`, within the request's deadline) before the registry's refusal."""
        try:
            return self.tokenizers.get(model)
        except ApiError as refused:
            wait = self._config.engine.tokenizer_wait_secs
            if refused.code != "tokenizer_not_ready" or wait <= 0:
                raise
        pending: set[asyncio.Future[Any]] = {self._autoloads[t.url] for t in pool if t.url in self._autoloads}
        entry = self.tokenizers.lookup(model)
        loaded = asyncio.ensure_future(entry.done.wait()) if entry is not None and not entry.done.is_set() else None
        if loaded is not None:
            pending.add(loaded)
        try:
            if pending:
                # The loads go on for the next request if this one gives up (not cancelled).
                await asyncio.wait(pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if loaded is not None:
                loaded.cancel()
        return self.tokenizers.get(model)

    def tokenizer_source(self, model: str) -> str | None:
        entry = self.tokenizers.lookup(model)
        return entry.source if entry is not None else None

    async def check_health(self, target: Target, timeout: float) -> bool:
        engine = await self.engine(target)
        ok = await check_health(engine, timeout)
        if ok and engine.info is not None:
            # A model whose tokenizer failed to load is given another chance at each check.
            await self._register_tokenizer(engine)
        return ok

    async def forget(self, target: Target) -> None:
        engine = self._engines.pop(target.id, None)
        if engine is not None and all(e is not engine for e in self._engines.values()):
            await engine.client.close()

    async def load(self, target: Target) -> int | None:
        engine = self._engines.get(target.id)
        if engine is None:
            return None
        try:
            loads = await engine.client.loads()
        except EngineError as exc:
            if self._live_loads and exc.unavailable:
                raise WorkerUnreachable(exc.message) from None
            return None
        engine.loads = loads
        if loads is None:
            return None
        rank = loads.rank(target.dp_rank)
        return rank.requests if rank is not None else loads.running_requests + loads.waiting_requests

    def kv_tokens(self, target: Target) -> int | None:
        """The KV-cache tokens in use that the engine's last `GetLoads` gave the worker's rank
        (its total for an unpinned worker); None when it did not say."""
        engine = self._engines.get(target.id)
        loads = engine.loads if engine is not None else None
        if loads is None:
            return None
        rank = loads.rank(target.dp_rank)
        return rank.used_tokens if rank is not None else loads.used_tokens

    def ready(self, targets: Sequence[Target]) -> bool:
        """Every healthy worker's model has its tokenizer (unless autoload is off, when a
        missing tokenizer is an operator's choice)."""
        healthy = [t for t in targets if t.models]
        if not healthy:
            return False
        if not self.tokenizers.autoload and not self._configured_tokenizer:
            return True
        return all(self.tokenizers.has(m) for t in healthy for m in t.models)

    def runtime_of(self, target: Target) -> str | None:
        engine = self._engines.get(target.id)
        return engine.runtime if engine is not None else target.runtime

