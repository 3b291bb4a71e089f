"""The one small interface every backend adapter implements.

A backend receives a `Call` (the validated request plus what it needs of the client's
headers) and yields journal events: `routed`, then `upstream` parts (relay backends) or
`rendered`/`tokens`/`block` events (engine backends). It raises `ApiError` for a failure
before its first response byte; after that, it yields an `Error` event and stops.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from journal.events import Event

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


class Backend(Protocol):
    name: str

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def models(self) -> list[ModelCard]: ...

    def ready(self) -> bool:
        """Whether the backend can take a request now (for `/readiness`)."""
        ...

    def handle(self, call: Call) -> AsyncGenerator[Event, None]: ...
