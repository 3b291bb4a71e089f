"""The HTTP connection protocol: Sanic's, with a total deadline on reading a request and a cap
on open connections.

Sanic's own request timeout restarts on every byte, so a client that trickles a header (or a
body) a byte at a time holds its connection, and its file descriptor, for ever. Here a request
must be read whole, head and body, within `header_read_timeout` seconds, however the bytes are
spaced; past it the client gets Sanic's 408 and the connection closes. The first request's
deadline starts at accept: a connection that sends nothing is closed at the deadline, not held
for Sanic's keep-alive timeout (a socket that never speaks would otherwise keep a slot of the
cap for 75 s). A kept-alive connection waits for its next request no longer than the deadline
either (the app's keep-alive timeout), and that request's deadline starts at its first byte.
At `max_connections` open connections, a new one takes the place of the oldest connection that
has not sent a byte yet (closed, nothing written: it has no request to answer), so sockets
that never speak cannot keep real clients out, however fast they reconnect; when every open
connection has spoken, the new one is answered 503 and closed at once, before any request is
read. One log line says when the cap is first hit and one when connections are accepted again.
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
    """The shared state of the cap: whether it has been hit, the connections refused and closed
    since, and the open connections that have not sent a byte, oldest first."""

    def __init__(self) -> None:
        self.refusing = False
        self.refused = 0
        self.evicted = 0
        self.silent: dict[Any, None] = {}  # an insertion-ordered set


def guarded_protocol(header_read_timeout: float, max_connections: int) -> type[HttpProtocol]:
    """Sanic's HTTP protocol with the two limits (a class per app: Sanic takes a class)."""
    cap = _Cap()

    class GuardedHttpProtocol(LingeringHttpProtocol):
        __slots__ = ("_reading_since", "_refused", "_expired", "_spoke")

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._reading_since: float | None = None
            self._refused = False
            self._expired = False  # past its deadline: whatever else the client sends is dropped
            self._spoke = False  # has sent a byte

        def connection_made(self, transport: Any) -> None:
            if len(self.connections) >= max_connections:
                if not cap.refusing:
                    cap.refusing = True
                    log.warning(
                        "connection cap reached (%d open): closing connections that sent nothing, refusing new "
                        "connections when every open one has spoken",
                        max_connections,
                    )
                if cap.silent:
                    next(iter(cap.silent))._evict()
                    cap.evicted += 1
                else:
                    self._refused = True
                    cap.refused += 1
                    transport.write(_FULL)
                    transport.close()
                    return
            elif cap.refusing:
                cap.refusing = False
                log.warning(
                    "accepting connections again (%d refused, %d silent ones closed while at the cap)",
                    cap.refused,
                    cap.evicted,
                )
                cap.refused = cap.evicted = 0
            super().connection_made(transport)  # type: ignore[no-untyped-call]
            self._reading_since = monotonic()  # the first request's deadline runs from accept
            cap.silent[self] = None

        def _evict(self) -> None:
            """Close a connection that has sent nothing, to make room at the cap."""
            cap.silent.pop(self, None)
            self._expired = True
            if self._task:
                self._task.cancel()
            elif self.transport is not None:
                self.transport.close()

        def connection_lost(self, exc: BaseException | None) -> None:
            cap.silent.pop(self, None)
            if not self._refused:
                super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._spoke:
                self._spoke = True
                cap.silent.pop(self, None)
            if self._refused or self._expired:
                return
            if self._reading_since is None or (self._served() and not self._reading()):
                self._reading_since = monotonic()  # the first bytes of a kept-alive connection's next request
            super().data_received(data)

        def _reading(self) -> bool:
            http = self._http
            if http is None:
                return False
            stage = http.stage.name
            return stage == "REQUEST" or (stage == "HANDLER" and bool(http.request_body))

        def _served(self) -> bool:
            """Whether a request has been read on this connection (its head at least)."""
            return bool(self.state and self.state.get("requests_count"))

        def check_timeouts(self) -> None:
            since = self._reading_since
            if (
                self._task
                and since is not None
                and not self._served()
                and self._http is not None
                and self._http.stage.name == "IDLE"
                and monotonic() - since > header_read_timeout
            ):
                # Not one byte since accept: nothing to answer, the connection is just closed.
                log.debug("no request within %.0f s of accept: connection closed", header_read_timeout)
                self._expired = True
                if sys.version_info < (3, 14):
                    self._task.cancel("request read deadline")
                else:
                    self._task.cancel()
                return
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
