"""The engine connector: the gateway implements the Messages API itself, over gRPC or ZMQ.

It composes the engine wing's parts and holds the lifecycle: its workers' engines and their
tokenizers (`smg.backends.grpc.workers`), a request's way to its first engine call
(`smg.backends.grpc.front`, around the pure `smg.pipeline.prepare`), and each attempt's engine
call driven through the sans-IO generation session (`smg.backends.grpc.calls`,
`smg.pipeline.session`). Each attempt's worker (the router's choice) has the prompt checked
against its context window. An engine's runtime is `--backend`'s, else detected from which
protocol it answers.

One class serves every engine wire: it is built with a client factory (`grpc_clients`, or the
ZMQ one in `smg.backends.zmq.connector`) and a name, the journal's backend name.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Callable, Sequence

from journal.events import Event
from smg.backends.base import Attempts, Call, Discovery, Target, WorkerUnreachable
from smg.backends.grpc.calls import EngineCalls, settle
from smg.backends.grpc.engines import connect
from smg.backends.grpc.engines.base import strip_scheme
from smg.backends.grpc.engines.detect import detect_runtime
from smg.backends.grpc.front import Front
from smg.backends.grpc.request import IMAGE_RUNTIMES, engine_call
from smg.backends.grpc.types import EngineClient, EngineError
from smg.backends.grpc.workers import ClientFactory, EngineWorkers
from smg.config import GatewayConfig
from smg.pipeline.prepare import Prepared, check_window
from smg.pipeline.session import Session
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.pipeline.vision import ImageProcessor

log = logging.getLogger("smg.grpc")


async def grpc_clients(target: Target) -> tuple[str, EngineClient]:
    """A gRPC engine's client, its runtime `--backend`'s or detected from what it answers."""
    address = strip_scheme(target.url)
    runtime = target.runtime
    if runtime is None:
        try:
            runtime = await detect_runtime(address)
        except EngineError as exc:
            raise WorkerUnreachable(f"runtime detection failed: {exc.message or exc.code}") from None
        log.info("worker %s speaks the %s engine protocol", target.url, runtime)
    return runtime, connect(runtime, address)


class EngineConnector:
    """Serves Messages and count_tokens from inference engines (gRPC, ZMQ)."""

    generates = True

    def __init__(
        self,
        config: GatewayConfig,
        tokenizers: TokenizerRegistry | None = None,
        *,
        name: str = "grpc",
        clients: ClientFactory = grpc_clients,
        live_loads: bool = False,
        image_runtimes: frozenset[str] = IMAGE_RUNTIMES,
        sends_images: Callable[[ImageProcessor], bool] | None = None,
    ) -> None:
        self.name = name
        self.tokenizers = tokenizers or TokenizerRegistry(
            autoload=config.tokenizer_autoload, cache=config.engine.tokenizer_cache()
        )
        self.workers = EngineWorkers(config, self.tokenizers, clients, live_loads=live_loads)
        self.front = Front(config, self.workers, name, image_runtimes=image_runtimes, sends_images=sends_images)
        self.calls = EngineCalls()

    # lifecycle

    async def start(self) -> None:
        self.workers.start()

    async def close(self) -> None:
        await self.front.close()
        await self.calls.close()
        await self.workers.close()

    async def discover(self, target: Target) -> Discovery:
        return await self.workers.discover(target)

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        return await self.workers.check_health(target, timeout)

    async def forget(self, target: Target) -> None:
        await self.workers.forget(target)

    async def load(self, target: Target) -> int | None:
        return await self.workers.load(target)

    def kv_tokens(self, target: Target) -> int | None:
        return self.workers.kv_tokens(target)

    def ready(self, targets: Sequence[Target]) -> bool:
        return self.workers.ready(targets)

    def runtime_of(self, target: Target) -> str | None:
        return self.workers.runtime_of(target)

    # requests

    async def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        taken = await self.front.take(call, pool)
        if not isinstance(taken, Prepared):
            for event in taken:
                yield event
            return
        session: Session | None = None
        async for lease in attempts:
            worker = lease.target
            engine = await self.workers.engine(worker)
            check_window(taken, worker.context_windows.get(taken.model))
            message_id = taken.message_id
            request_id = message_id if lease.attempt == 1 else f"{message_id}-{lease.attempt}"
            attempt_call = engine_call(
                taken,
                runtime=engine.runtime,
                defaults=engine.sampling_defaults,
                request_id=request_id,
                dp_rank=worker.dp_rank,
            )
            yield lease.routed
            if session is None:
                session, rendered = Session.start(
                    taken, engine.info.eos_token_ids if engine.info else [], attempt_call.stop_token_ids
                )
                yield rendered
            else:
                session.attempt()
            async for event in self.calls.drive(engine.client, attempt_call, session):
                yield event
            if not settle(lease, session):
                return
