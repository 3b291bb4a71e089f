"""The one small interface every connector implements, and what it is handed.

A connector speaks one worker kind's wire (HTTP relay, gRPC engine, the Anthropic API) and
knows nothing of routing: the router hands it a `Call` (the validated request plus what it
needs of the client's headers), the pool's workers as `Target`s, and `Attempts` — the workers
the router chose, one `Lease` per attempt. The connector yields journal events: each lease's
`routed`, then `upstream` parts (relay) or `rendered`/`tokens`/`block` events (engines). It tells
the lease how an attempt failed or what the worker answered; the router decides whether
another attempt follows. It raises `ApiError` for a failure before its first response byte;
after that, it yields an `Error` event and stops.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from journal.events import Event, Routed
from smg.protocol.errors import ApiError

Endpoint = Literal["messages", "count_tokens"]


@dataclass
class Call:
    request_id: str
    endpoint: Endpoint
    model: str  # canonical model id (aliases resolved)
    stream: bool
    body: dict[str, Any]  # the client's JSON object, as sent
    request: Any  # the parsed protocol model (CreateMessageRequest | CountTokensRequest)
    headers: Mapping[str, str]  # the client's headers, lower-case names
    raw: bytes = b""  # the body bytes as received
    alias_used: bool = False
    tenant: str | None = None  # who the request is charged to (`auth:…`, `ip:…`; smg.admission.tenants)


@dataclass
class ModelCard:
    id: str
    owned_by: str
    context_window: int | None = None


class Target(Protocol):
    """A worker as a connector sees it (the router's `Worker` is one)."""

    id: str
    url: str
    runtime: str | None
    api_key: str | None
    bootstrap_port: int | None
    dp_rank: int | None  # the data-parallel rank this worker is pinned to (--dp-aware), else None
    models: set[str]
    context_windows: dict[str, int]
    healthy: bool

    @property
    def role(self) -> str:
        """"regular", or a disaggregated deployment's "prefill", "decode", "encode"."""
        ...


@dataclass
class Discovery:
    """What a worker said about itself: model id → context window (None when not advertised)."""

    models: dict[str, int | None]
    healthy: bool = True
    runtime: str | None = None
    dp_size: int | None = None  # data-parallel ranks behind the worker (asked only under --dp-aware)


class WorkerUnreachable(Exception):
    """Discovery or a health check got no answer; the message says why."""


FailureKind = Literal["refused", "connect", "timeout", "transport", "unavailable"]


@dataclass
class Failure:
    """An attempt that failed before any byte of an answer: how, and what the client would be told."""

    kind: FailureKind
    error: ApiError
    retryable: bool = True  # False: this connector's wire never repeats a request (the Anthropic API)


class Lease(Protocol):
    """One attempt on one worker, chosen by the router."""

    @property
    def target(self) -> Target: ...

    @property
    def attempt(self) -> int: ...

    @property
    def routed(self) -> Routed:
        """The journal's record of the choice; the connector yields it before using the worker."""
        ...

    def failed(self, failure: Failure) -> None:
        """The attempt failed before any answer; the next lease (if the router allows one) follows."""
        ...

    def answered(self, status: int) -> bool:
        """The worker answered `status`. True when the router wants another attempt instead: the
        connector then drops this answer and takes the next lease."""
        ...


class PairLease(Lease, Protocol):
    """A prefill/decode attempt: the lease itself is the decode leg's (what the client gets);
    `prefill` is the prefill leg's. A PD connector's `Attempts` yield these."""

    @property
    def prefill(self) -> Lease: ...

    def encoder(self, key: str) -> Lease:
        """An EPD attempt's encode worker for one media item, chosen by the encode policy with
        `key` (the item's content hash) as its routing key; settled with the pair. Raises
        `ApiError` when the pool has no encode worker available."""
        ...


Attempts = AsyncIterator[Lease]


def model_cards(workers: Iterable[Target]) -> list[ModelCard]:
    """One card per served model; a model's context window is the smallest its workers advertise."""
    cards: dict[str, ModelCard] = {}
    for worker in workers:
        for model in worker.models:
            window = worker.context_windows.get(model)
            card = cards.setdefault(model, ModelCard(id=model, owned_by="smg", context_window=window))
            if window and (card.context_window is None or window < card.context_window):
                card.context_window = window
    return sorted(cards.values(), key=lambda c: c.id)


@runtime_checkable
class ReportsKvTokens(Protocol):
    """A connector whose engines report the KV-cache tokens each worker (or rank) holds, read at
    the load poll (gRPC: `GetLoads`); the data-parallel rank policy routes by it."""

    def kv_tokens(self, target: Target) -> int | None:
        """Tokens in use as the worker's last load poll said; None when not known."""
        ...


class Connector(Protocol):
    # The journal's backend name, the name of the pool it serves (`smg.routing.pools`): "http",
    # "grpc", "zmq", "grpc-pd", "grpc-epd", "http-pd", "anthropic".
    name: str
    # What the connector is: True when the gateway generates the answer itself (renders and
    # tokenizes the prompt, drives an engine token by token: gRPC, ZMQ, gRPC PD/EPD), so it
    # knows the prompt's tokens before the engine is called; False when it relays a worker's
    # or an API's own answer. Budgets charge the first kind; metrics label it `grpc`.
    generates: bool

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def discover(self, target: Target) -> Discovery:
        """Ask the worker what it serves. Raises `WorkerUnreachable`."""
        ...

    async def check_health(self, target: Target, timeout: float, endpoint: str) -> bool:
        """One health probe (`endpoint`: HTTP workers' health path). Raises `WorkerUnreachable`
        when nothing answers."""
        ...

    async def forget(self, target: Target) -> None:
        """The worker left the registry and has nothing in flight: release what it held."""
        ...

    async def load(self, target: Target) -> int | None:
        """The requests the worker itself reports running or waiting; None when it cannot say.
        Raises `WorkerUnreachable` when the connector knows the worker is gone."""
        ...

    def ready(self, targets: Sequence[Target]) -> bool:
        """Whether these healthy workers can take requests now (for `/readiness`)."""
        ...

    def handle(self, call: Call, pool: Sequence[Target], attempts: Attempts) -> AsyncGenerator[Event, None]:
        """Serve one request. `pool` is every worker of the pool that serves the model."""
        ...
