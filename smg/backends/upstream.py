"""What the relay backends share: turning an upstream HTTP response into `upstream` events.

A streamed body is cut into pieces at UTF-8 character boundaries and yielded as it arrives;
a stream the upstream breaks ends with an `error` event (the client then gets an SSE `error`
frame). A buffered body is read up to a limit.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

import httpx

from journal.events import Error, Event, Upstream
from journal.pieces import TextPieces
from smg.protocol.errors import describe_upstream_failure


class BodyTooLarge(ValueError):
    """The upstream body is larger than the gateway accepts."""


class Body(Protocol):
    """An upstream answer's body as it arrives: an `httpx.Response` or the relay's direct one."""

    def aiter_bytes(self) -> AsyncIterator[bytes]: ...


async def stream_parts(response: Body) -> AsyncGenerator[Event, None]:
    """The body as `upstream` chunks, as it arrives; an interrupted stream ends with `error`."""
    pieces = TextPieces()
    try:
        async for chunk in response.aiter_bytes():
            piece = pieces.feed(chunk)
            if piece:
                yield Upstream(part="chunk", data=piece[0], encoding=piece[1])
    except httpx.HTTPError as exc:
        yield Error(
            stage="upstream",
            status=502,
            error_type="api_error",
            message=f"Upstream stream ended unexpectedly: {describe_upstream_failure(exc)}",
            code="upstream_stream_interrupted",
        )
        return
    tail = pieces.flush()
    if tail:
        yield Upstream(part="chunk", data=tail[0], encoding=tail[1])


async def read_capped(response: Body, limit: int) -> bytes:
    """The whole body. Raises `BodyTooLarge` past `limit` bytes; transport errors propagate."""
    parts: list[bytes] = []
    size = 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"upstream body larger than {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)
