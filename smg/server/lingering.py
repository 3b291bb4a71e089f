"""Lingering close: a request refused before its body was read (413) has the rest of its body
read and thrown away before the connection closes, up to a bound.

A socket closed with unread bytes in its receive buffer is reset (RST), and a reset can destroy
the refusal in flight or unread on the client's side: a client still uploading (the Anthropic
SDK's httpx transport) then sees `ReadError` instead of the 413 envelope, and retries the upload.
So the refusal is written, then what the client still sends is counted and discarded (never
kept) until the declared body has arrived, the client closes, or the bound or the deadline is
reached; only then does the gateway close. A body declared larger than the bound is cut off at
once, as before: reading gigabytes to say "too large" would cost more than the answer is worth.
"""

from __future__ import annotations

import asyncio
from typing import Any

from sanic.server.protocols.http_protocol import HttpProtocol

# However small the limit, a refused body this large is still read to its end.
_MIN_DISCARD_BYTES = 64 << 20


def discard_bound(max_payload_size: int) -> int:
    """The most bytes of a refused body read and thrown away before the connection closes."""
    return max(_MIN_DISCARD_BYTES, 2 * max_payload_size)


class LingeringHttpProtocol(HttpProtocol):
    """Sanic's HTTP protocol, able to read and discard the rest of a refused body at close."""

    __slots__ = ("_discard_left", "_discard_deadline", "_discarding", "_discard_timer")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._discard_left: int | None = None  # bytes still to throw away, once asked to
        self._discard_deadline = 0.0
        self._discarding = False
        self._discard_timer: asyncio.TimerHandle | None = None

    def discard_rest(self, left: int, deadline: float) -> None:
        """At close, read and throw away up to `left` more bytes, for at most `deadline` seconds."""
        self._discard_left = left
        self._discard_deadline = deadline

    def close(self, timeout: float | None = None) -> None:
        if self._discard_left is None or self._discarding or self.transport is None or self.transport.is_closing():
            super().close(timeout)
            return
        self._discarding = True
        self._discard_left -= len(self.recv_buffer)
        self.recv_buffer.clear()
        if self._discard_left <= 0:
            super().close(timeout)
            return
        self._discard_timer = self.loop.call_later(self._discard_deadline, self._stop_discarding)
        self.transport.resume_reading()  # Sanic pauses reading while its buffer is full

    def data_received(self, data: bytes) -> None:
        if not self._discarding:
            super().data_received(data)
            return
        assert self._discard_left is not None
        self._discard_left -= len(data)
        if not data or self._discard_left <= 0:
            self._stop_discarding()

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._discard_timer is not None:
            self._discard_timer.cancel()
        super().connection_lost(exc)  # type: ignore[no-untyped-call]

    def _stop_discarding(self) -> None:
        self._discard_left = 0
        super().close()


def discard_refused_body(request: Any, bound: int, deadline: float) -> None:
    """Have the rest of `request`'s body, refused as too large, read and discarded before its
    connection closes, when it is declared (or, chunked, turns out) no larger than `bound`."""
    http = request.stream
    protocol = getattr(http, "protocol", None)
    if not isinstance(protocol, LingeringHttpProtocol):
        return
    declared = http.request_bytes_left if http.request_body is True else None
    if declared is not None and declared > bound:
        return  # cut off now: the client gets the refusal only if it reads before it finishes sending
    protocol.discard_rest(declared if declared is not None else bound, deadline)
