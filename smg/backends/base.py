"""The one small interface every backend adapter implements.

A backend receives a `Call` (the validated request plus what it needs of the client's
headers) and yields journal events: `routed`, then `upstream` parts (relay backends) or
`rendered`/`tokens`/`block` events (engine backends). It raises `ApiError` for a failure
before its first response byte; after that, it yields an `Error` event and stops.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from journal.events import Event
from smg.routing.workers import Worker

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


@dataclass
class ModelCard:
    id: str
    owned_by: str
    context_window: int | None = None


def model_cards(workers: Iterable[Worker]) -> list[ModelCard]:
    """One card per served model; a model's context window is the smallest its workers advertise."""
    cards: dict[str, ModelCard] = {}
    for worker in workers:
        for model in worker.models:
            window = worker.context_windows.get(model)
            card = cards.setdefault(model, ModelCard(id=model, owned_by="smg", context_window=window))
            if window and (card.context_window is None or window < card.context_window):
                card.context_window = window
    return sorted(cards.values(), key=lambda c: c.id)


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def models(self) -> list[ModelCard]: ...

    def ready(self) -> bool:
        """Whether the backend can take a request now (for `/readiness`)."""
        ...

    def handle(self, call: Call) -> AsyncGenerator[Event, None]: ...
