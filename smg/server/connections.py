"""The HTTP connection protocol: Sanic's, with a total deadline on reading a request and a cap
on open connections.

Sanic's own request timeout restarts on every byte, so a client that trickles a header (or a
body) a byte at a time holds its connection, and its file descriptor, for ever. Here a request
must be read whole, head and body, within `header_read_timeout` seconds of its first byte,
however the bytes are spaced; past it the client gets Sanic's 408 and the connection closes.
Connections beyond `max_connections` are answered 503 and closed at once, before any request
is read; one log line says when the cap is first hit and one when connections are accepted again.
"""

from __future__ import annotations

import logging
import resource
import sys
from time import monotonic
from typing import Any

from sanic.exceptions import RequestTimeout
from sanic.server.protocols.http_protocol import HttpProtocol

from smg.server.lingering import LingeringHttpProtocol

log = logging.getLogger("smg.server")

_FULL = b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nconnection: close\r\nretry-after: 1\r\n\r\n"
# Descriptors kept free for what the gateway opens itself: upstream sockets, the journal, logs.
_RESERVED_FDS = 128


def default_max_connections() -> int:
    """What the process's descriptor limit allows, less what the gateway needs for itself."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 10_000
    return max(16, min(10_000, soft // 2 if soft < 2 * _RESERVED_FDS else soft - _RESERVED_FDS))


class _Cap:
    """The shared state of the cap: whether connections are being refused, and how many."""

    def __init__(self) -> None:
        self.refusing = False
        self.refused = 0


def guarded_protocol(header_read_timeout: float, max_connections: int) -> type[HttpProtocol]:
    """Sanic's HTTP protocol with the two limits (a class per app: Sanic takes a class)."""
    cap = _Cap()

    class GuardedHttpProtocol(LingeringHttpProtocol):
        __slots__ = ("_reading_since", "_refused", "_expired")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._reading_since: float | None = None
            self._refused = False
            self._expired = False  # past its deadline: whatever else the client sends is dropped

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= max_connections:
                self._refused = True
                cap.refused += 1
                if not cap.refusing:
                    cap.refusing = True
                    log.warning("connection cap reached (%d open): refusing new connections", max_connections)
                transport.write(_FULL)
                transport.close()
                return
            if cap.refusing:
                cap.refusing = False
                log.warning("accepting connections again (%d refused while at the cap)", cap.refused)
                cap.refused = 0
            super().connection_made(transport)  # type: ignore[no-untyped-call]

        def connection_lost(self, exc: BaseException | None) -> None:
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if self._refused or self._expired:
                return
            if self._reading_since is None or not self._reading():
                self._reading_since = monotonic()  # the first bytes of a request
            super().data_received(data)

        def _reading(self) -> bool:
            http = self._http
            if http is None:
                return False
            stage = http.stage.name
            return stage == "REQUEST" or (stage == "HANDLER" and bool(http.request_body))

        def check_timeouts(self) -> None:
            since = self._reading_since
            if (
                self._task
                and since is not None
                and self._reading()
                and monotonic() - since > header_read_timeout
            ):
                log.info("request not read whole within %.0f s: connection closed", header_read_timeout)
                self._http.exception = RequestTimeout("Request Timeout: the request was not sent in time")
                self._expired = True
                # Sanic writes the 408, then waits to drain the rest of the body: give it a moment
                # to write, then close whatever is left.
                self.loop.call_later(1.0, self._close_expired)
                if sys.version_info < (3, 14):
                    self._task.cancel("request read deadline")
                else:
                    self._task.cancel()
                return
            super().check_timeouts()  # type: ignore[no-untyped-call]

        def _close_expired(self) -> None:
            if self.transport is not None and not self.transport.is_closing():
                self.transport.close()

    return GuardedHttpProtocol
