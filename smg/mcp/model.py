"""What the MCP tool loop needs of the model it calls, and nothing more.

The Anthropic backend implements `ModelClient` over HTTP; the loop never sees a socket.
Send failures are raised as `smg.protocol.errors.ApiError` (with the backend's machine code);
a stream that breaks after its head raises `ModelStreamError`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol


class ModelStreamError(Exception):
    """A streamed answer broke off or could not be decoded (message says how)."""


@dataclass
class ModelReply:
    """A non-streaming answer: status, headers and the body as received."""

    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


class ModelStream(Protocol):
    """A streaming answer whose head has arrived."""

    status: int
    headers: dict[str, str]

    def events(self) -> AsyncIterator[dict[str, Any]]:
        """The decoded SSE event payloads, as they arrive."""
        ...

    async def read(self) -> bytes:
        """The whole body (for an error answer, which is not a stream)."""
        ...

    def received(self) -> bytes:
        """Every byte received so far, for the journal."""
        ...


class ModelClient(Protocol):
    async def create(self, body: dict[str, Any]) -> ModelReply: ...

    def stream(self, body: dict[str, Any]) -> AbstractAsyncContextManager[ModelStream]: ...
