"""Deployments built in the test's own event loop: engine connectors over playback engines
(`smg.backends.grpc.engines.playback`), the real `Router`, and the real app driven through its
ASGI interface by httpx. No process and no socket; the journal is a real SQLite file and the
tokenizer the real fixture's.

`Leases` is the router's side of a connector test: the workers of each attempt, in order, and
what the connector reported of each (`lease.failed(...)`, `lease.answered(status)`).
"""

from __future__ import annotations

import asyncio
import functools
import io
import itertools
import zipfile
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx
from sanic import Sanic

from journal.events import Event, Routed
from journal.reader import JournalReader
from journal.writer import JournalWriter
from smg.backends.base import Call, Connector, Failure, Target
from smg.backends.grpc.backend import EngineConnector
from smg.backends.grpc.engines.playback import PlaybackEngine, Playbook
from smg.config import GatewayConfig
from smg.pipeline.tokenizers.registry import TokenizerRegistry
from smg.pipeline.tokenizers.tokenizer import Tokenizer
from smg.protocol.parse import parse_count_tokens, parse_create_message
from smg.routing.router import Router, WorkerSpec
from smg.routing.workers import Worker, worker_kind
from smg.server.app import build_app

QWEN3 = Path(__file__).resolve().parent / "fixtures" / "qwen3"
MODEL = "qwen3-fixture"
WINDOW = 4096
USER = [{"role": "user", "content": "Say hello."}]

_app_names = itertools.count()


@functools.cache
def qwen3() -> Tokenizer:
    """The fixture's tokenizer, loaded once per test process (it encodes the engines' scripts)."""
    return Tokenizer.load(QWEN3)


def engine(model: str = MODEL, **kwargs: Any) -> PlaybackEngine:
    """A playback engine serving the qwen3 fixture under `model` (overrides: `PlaybackEngine`'s)."""
    kwargs.setdefault("tokenizer", qwen3())
    kwargs.setdefault("max_context_length", WINDOW)
    return PlaybackEngine(model, **kwargs)


def config(*urls: str, **settings: Any) -> GatewayConfig:
    """A gateway's settings for `urls`, its tokenizer the fixture's (`--model-path`)."""
    settings.setdefault("model_path", str(QWEN3))
    return GatewayConfig(worker_urls=tuple(urls), **settings)


def connector(settings: GatewayConfig, book: Playbook, tokenizers: TokenizerRegistry | None = None) -> EngineConnector:
    return EngineConnector(settings, tokenizers, clients=book)


# --- a connector alone ---------------------------------------------------------------------------


def call(body: Mapping[str, Any], *, endpoint: str = "messages", request_id: str = "req-1") -> Call:
    """A validated request, as the server hands it to the router."""
    data = {"model": MODEL, "messages": USER, **body}
    if endpoint == "count_tokens":
        request: Any = parse_count_tokens(data)
    else:
        data.setdefault("max_tokens", 32)
        request = parse_create_message(data)
    return Call(
        request_id=request_id,
        endpoint=endpoint,  # type: ignore[arg-type]
        model=request.model,
        stream=bool(getattr(request, "stream", False)),
        body=data,
        request=request,
        headers={},
    )


async def discovered(conn: EngineConnector, *urls: str) -> list[Worker]:
    """The workers at `urls`, discovered by the connector as the router does it."""
    workers = []
    for url in urls:
        worker = Worker(url=url, connection=worker_kind(url))
        found = await conn.discover(worker)
        worker.discovered_as(found.models, found.healthy, found.runtime)
        workers.append(worker)
    return workers


@dataclass
class _Lease:
    target: Target
    attempt: int
    leases: Leases

    @property
    def routed(self) -> Routed:
        return Routed(backend="grpc", worker=self.target.url, model=MODEL, policy="scripted", attempt=self.attempt)

    def failed(self, failure: Failure) -> None:
        self.leases.outcomes.append((self.target.url, failure))

    def answered(self, status: int) -> bool:
        self.leases.outcomes.append((self.target.url, status))
        return False


@dataclass
class Leases:
    """Attempts on `targets`, one each, in order; `outcomes` is what the connector reported.
    When the last one failed, its error is the answer (raised), as the router's dispatch does."""

    targets: Sequence[Target]
    outcomes: list[tuple[str, Failure | int]] = field(default_factory=list)

    async def __aiter__(self) -> AsyncIterator[_Lease]:
        for attempt, target in enumerate(self.targets, start=1):
            yield _Lease(target, attempt, self)
        if self.outcomes and isinstance(self.outcomes[-1][1], Failure):
            raise self.outcomes[-1][1].error


async def served(conn: Connector, request: Call, pool: Sequence[Target], leases: Leases | None = None) -> list[Event]:
    """Every event the connector yields for `request`, its attempts on `leases` (default: the pool's)."""
    attempts = leases if leases is not None else Leases(pool)
    return [event async for event in conn.handle(request, pool, attempts.__aiter__())]


# --- the whole app -------------------------------------------------------------------------------


class InProcessGateway:
    """`build_app(...)` over `router`, started and stopped through the ASGI lifespan, its
    requests sent by `client` (an httpx client on the ASGI transport). An async context manager."""

    def __init__(
        self,
        settings: GatewayConfig,
        router: Router,
        journal: Path,
        static: Sequence[WorkerSpec] | None = None,
        engines: Mapping[str, PlaybackEngine] | None = None,
    ) -> None:
        self.config = settings
        self.engines = dict(engines or {})  # the playback engines behind it, by worker URL
        self.router = router
        self.journal_path = journal
        self.journal = JournalWriter(journal)
        specs = list(static) if static is not None else [WorkerSpec(url=u) for u in settings.worker_urls]
        # Sanic rewrites some of its own methods when an app starts; in test mode (what Sanic's
        # own test client sets, for this process only) it keeps the originals, so that the next
        # app can start too.
        Sanic.test_mode = True
        self.app: Sanic[Any, Any] = build_app(settings, router, self.journal, specs, name=f"inproc{next(_app_names)}")
        self.client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=self.app), base_url="http://gateway.test", timeout=30.0
        )
        self._to_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._from_app: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._lifespan: asyncio.Task[None] | None = None

    async def _lifespan_event(self, kind: str) -> None:
        await self._to_app.put({"type": f"lifespan.{kind}"})
        answer = await self._from_app.get()
        assert answer["type"] == f"lifespan.{kind}.complete", answer

    async def __aenter__(self) -> InProcessGateway:
        scope = {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}
        self._lifespan = asyncio.get_running_loop().create_task(self.app(scope, self._to_app.get, self._from_app.put))
        await self._lifespan_event("startup")
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await self.client.aclose()
            await self._lifespan_event("shutdown")
            if self._lifespan is not None:
                await self._lifespan
        finally:
            Sanic.unregister_app(self.app)

    async def post(self, body: Mapping[str, Any], path: str = "/v1/messages", **kwargs: Any) -> httpx.Response:
        """A Messages request for the fixture's model (`body` adds to or overrides its fields)."""
        data = {"model": MODEL, "messages": USER, **body}
        if path == "/v1/messages":
            data.setdefault("max_tokens", 32)
        return await self.client.post(path, json=data, **kwargs)

    async def events(self, request_id: str) -> list[Event]:
        """The request's journaled events (its handler has ended: they are all offered)."""
        await self.journal.flush()
        with JournalReader(self.journal_path) as reader:
            return [event for _, event in reader.events(request_id)]


def bundle(directory: Path = QWEN3) -> bytes:
    """A `GetTokenizer` bundle: the directory's files, flat at the zip's root."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for file in sorted(directory.iterdir()):
            archive.write(file, file.name)
    return buffer.getvalue()


def gateway(
    tmp_path: Path,
    engines: Mapping[str, PlaybackEngine],
    *,
    static: Sequence[str] | None = None,
    tokenizers: TokenizerRegistry | None = None,
    **settings: Any,
) -> InProcessGateway:
    """A gRPC gateway in front of `engines` (by worker URL), its `--worker-urls` the `static`
    ones (default: every engine's; the others are the test's to add), its journal and fetched
    tokenizer bundles in `tmp_path`."""
    book = Playbook()
    for url, playback in engines.items():
        book.add(url, playback)
    settings.setdefault("journal_path", tmp_path / "journal.db")
    gateway_config = config(*(engines if static is None else static), **settings)
    registry = tokenizers or TokenizerRegistry(
        autoload=gateway_config.tokenizer_autoload, bundle_dir=str(tmp_path / "bundles")
    )
    router = Router(gateway_config.router, {"grpc": connector(gateway_config, book, registry)})
    journal = gateway_config.journal_path or tmp_path / "journal.db"
    return InProcessGateway(gateway_config, router, journal, engines=engines)
