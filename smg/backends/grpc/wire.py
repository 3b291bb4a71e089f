"""A gRPC client for one shape of call, server streaming, spoken straight over HTTP/2 on asyncio.

`Generate` streams one message per token, and `grpc.aio` costs about 27 µs of CPU to hand each
one to the event loop (its completion-queue poller thread, the wake-up through the loop and
its Cython call objects; `tools/bench/grpc_read.py`), more than all the rest the gateway does
per token. This client reads the same wire with none of that. The protocol is
`smg.backends.grpc.http2`'s, sans I/O; this module is its transport: an `asyncio.Protocol`
hands each read to the protocol state, writes what it answers, and wakes the reader waiting on
a stream once for whatever arrived in that read. It also keeps the waits the protocol leaves
to its caller: for the peer's first SETTINGS, a stream slot under the peer's limit, send window.
Everything else (unary calls, the tokenizer bundle, runtime detection) stays on `grpc.aio`.

One TCP connection per engine carries any number of streams; a connection lost, or one the
engine sent GOAWAY on, is replaced on the next call. A call the engine refused before
processing it is sent again (`Call`).
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast

from smg.backends.grpc.http2 import (
    STREAM_WINDOW,
    ClientConnection,
    Closed,
    Event,
    NotStarted,
    Readable,
    Refused,
    Settled,
    StreamState,
    Writable,
    status_name,
)
from smg.backends.grpc.types import EngineError

# The names the engine clients, tests and benches import from here, the protocol's among them.
__all__ = [
    "STREAM_WINDOW",
    "Call",
    "Channel",
    "Connection",
    "NotStarted",
    "Refused",
    "Stream",
    "method_path",
    "status_name",
]


class Stream:
    """One call's response side, read by one reader."""

    __slots__ = ("connection", "state", "waiter", "window_waiter")

    def __init__(self, connection: Connection, state: StreamState) -> None:
        self.connection = connection
        self.state = state
        self.waiter: asyncio.Future[None] | None = None
        self.window_waiter: asyncio.Future[None] | None = None

    @property
    def ended(self) -> bool:
        return self.state.ended

    def wake(self) -> None:
        waiter = self.waiter
        if waiter is not None:
            self.waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def wake_sender(self) -> None:
        waiter = self.window_waiter
        if waiter is not None:
            self.window_waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def read(self) -> bytes | None:
        """The next message, None once the stream ended well; raises `EngineError` when it did not."""
        state = self.state
        connection = self.connection
        protocol = connection.protocol
        while True:
            if state.messages:
                message = protocol.take(state)
                if protocol.outbound:
                    connection.flush()
                return message
            if state.ended:
                if state.error is not None:
                    raise state.error
                return None
            self.waiter = connection.loop.create_future()
            await self.waiter

    def read_nowait(self) -> bytes | None:
        """The next message if one is already here, else None (whether or not more will come)."""
        protocol = self.connection.protocol
        message = protocol.take(self.state)
        if protocol.outbound:
            self.connection.flush()
        return message

    def cancel(self) -> None:
        """The reader is gone: tell the engine (RST_STREAM CANCEL) and forget the stream."""
        self.connection.reset(self)


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to an engine: moves its bytes, and wakes whoever waits on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str) -> None:
        self.loop = loop
        self.authority = authority
        self.protocol = ClientConnection(authority)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}  # the ones a reader or sender may wait on
        self.window_waiters: list[asyncio.Future[None]] = []
        self.slot_waiters: deque[asyncio.Future[None]] = deque()
        # The peer's first SETTINGS: no stream starts before its limits are known.
        self.settled: asyncio.Future[None] = loop.create_future()

    @property
    def closed(self) -> EngineError | None:
        """Why no new stream may start here, once none may."""
        return self.protocol.closed

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.flush()

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to {self.authority} lost" + (f": {exc}" if exc else "")
        self._dispatch(self.protocol.close(EngineError("UNAVAILABLE", reason)))

    def data_received(self, data: bytes) -> None:
        protocol = self.protocol
        events = protocol.receive(data)
        if protocol.outbound or protocol.closed is not None:
            self.flush()
        if events:
            self._dispatch(events)

    # -- the protocol's answers --------------------------------------------------------------

    def flush(self) -> None:
        """Writes what the protocol has for the peer; closes the socket once it is done with."""
        protocol = self.protocol
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if protocol.outbound:
            transport.write(protocol.data_to_send())
        if protocol.finished:
            transport.close()

    def _dispatch(self, events: list[Event]) -> None:
        streams = self.streams
        for event in events:
            if type(event) is Readable:
                stream = streams.get(event.stream_id)
                if stream is not None:
                    stream.wake()
                    if stream.state.ended:
                        stream.wake_sender()  # a request still waiting for window is not sent on
                        del streams[event.stream_id]
            elif isinstance(event, Writable):
                if event.stream_id == 0:
                    self._wake_windows()
                elif (stream := streams.get(event.stream_id)) is not None:
                    stream.wake_sender()
            elif isinstance(event, Settled):
                if not self.settled.done():
                    self.settled.set_result(None)
            elif isinstance(event, Closed):
                if not self.settled.done():
                    self.settled.set_exception(event.error)
                    self.settled.exception()  # retrieved: a connection nobody waited on logs nothing
                self._wake_windows()
                for stream in list(streams.values()):
                    stream.wake()
                    stream.wake_sender()
                streams.clear()
                if self.transport is not None:
                    self.transport.close()
            # GoingAway: the calls waiting for a slot learn it below, and start elsewhere.
        if self.slot_waiters:
            self._release_slots()

    def _wake_windows(self) -> None:
        waiters, self.window_waiters = self.window_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _release_slots(self) -> None:
        protocol = self.protocol
        while self.slot_waiters and (protocol.closed is not None or len(protocol.streams) < protocol.peer_max_streams):
            slot = self.slot_waiters.popleft()
            if not slot.done():
                slot.set_result(None)

    # -- the calls' side ---------------------------------------------------------------------

    def reset(self, stream: Stream) -> None:
        events = self.protocol.reset(stream.state)
        self.flush()
        self._dispatch(events)

    async def open(self, path: str, message: bytes, metadata: Iterable[tuple[str, str]]) -> Stream:
        """Start a call: its headers and its one request message, within the peer's windows."""
        protocol = self.protocol
        while protocol.closed is None and len(protocol.streams) >= protocol.peer_max_streams:
            slot = self.loop.create_future()
            self.slot_waiters.append(slot)
            try:
                await slot
            except asyncio.CancelledError:
                self._release_slots()  # a slot handed to this caller goes to the next
                raise
        try:
            state = protocol.start(path, metadata)
        except NotStarted:
            self.flush()  # out of stream ids: an idle connection goes now
            raise
        stream = self.streams[state.id] = Stream(self, state)
        body = memoryview(protocol.message(message))
        sent = 0
        while True:
            sent = protocol.send(state, body, sent)
            self.flush()
            if sent == len(body):
                break
            if state.ended:
                if state.error is not None:
                    raise state.error
                break
            if protocol.closed is not None and state.id > protocol.last_stream:
                raise protocol.closed
            # One future for either window, so the stream's end wakes it too.
            window = self.loop.create_future()
            stream.window_waiter = window
            if protocol.send_window <= 0:
                self.window_waiters.append(window)
            try:
                await window
            except asyncio.CancelledError:
                self.reset(stream)  # the engine must not wait for the rest of the request
                raise
        return stream

    def close(self) -> None:
        self._dispatch(self.protocol.close(EngineError("UNAVAILABLE", "the channel was closed")))


class Channel:
    """Server-streaming calls to one engine (`host:port`), over one connection opened on first
    use and opened again after it is lost or the engine sent GOAWAY."""

    def __init__(self, target: str, *, connect_timeout: float = 10.0) -> None:
        host, _, port = target.rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"not host:port: {target!r}")
        self.target = target
        self.host = host.strip("[]")
        self.port = int(port)
        self.connect_timeout = connect_timeout
        self._connection: Connection | None = None
        self._connecting: asyncio.Task[Connection] | None = None
        self._closed = False

    async def _connect(self) -> Connection:
        loop = asyncio.get_running_loop()
        protocol: Connection | None = None
        try:
            async with asyncio.timeout(self.connect_timeout):
                _, protocol = await loop.create_connection(lambda: Connection(loop, self.target), self.host, self.port)
                await protocol.settled
        except (OSError, TimeoutError) as exc:
            if protocol is not None:
                protocol.close()
            reason = "no HTTP/2 SETTINGS from it" if protocol is not None else str(exc) or type(exc).__name__
            raise EngineError("UNAVAILABLE", f"cannot connect to {self.target}: {reason}") from None
        return protocol

    async def connection(self) -> Connection:
        connection = self._connection
        if connection is not None and connection.closed is None:
            return connection
        if self._closed:
            raise EngineError("UNAVAILABLE", "the channel was closed")
        connecting = self._connecting
        if connecting is None:
            # Shared by every caller, and finished even when they are all cancelled: its
            # outcome is taken by `_connected`, not by whichever caller is still waiting.
            connecting = self._connecting = asyncio.ensure_future(self._connect())
            connecting.add_done_callback(self._connected)
        connection = await asyncio.shield(connecting)
        if self._closed:
            raise EngineError("UNAVAILABLE", "the channel was closed")
        return connection

    def _connected(self, connecting: asyncio.Task[Connection]) -> None:
        if self._connecting is connecting:
            self._connecting = None
        if connecting.cancelled() or connecting.exception() is not None:
            return
        connection = connecting.result()
        if self._closed:
            connection.close()
        else:
            self._connection = connection

    async def stream(self, path: str, request: bytes, metadata: Iterable[tuple[str, str]] = ()) -> Call:
        """Start the call `path` with `request` (a serialized message); read its answers from
        the returned call."""
        call = Call(self, path, request, tuple(metadata))
        call.stream = await call.open()
        return call

    def close(self) -> None:
        """Closes its connection, and one still being opened once it is; no call starts after."""
        self._closed = True
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class Call:
    """One call's answers. A stream the engine refused before processing it (`Refused`) or a
    connection that closed before it began (`NotStarted`) is sent again, a few times at most,
    so the reader sees only answers or a real failure."""

    RETRIES = 3

    def __init__(self, channel: Channel, path: str, request: bytes, metadata: tuple[tuple[str, str], ...]) -> None:
        self.channel = channel
        self.path = path
        self.request = request
        self.metadata = metadata
        self.stream: Stream | None = None
        self.retries = 0

    async def open(self) -> Stream:
        while True:
            try:
                return await (await self.channel.connection()).open(self.path, self.request, self.metadata)
            except (NotStarted, Refused):
                self.retries += 1
                if self.retries > self.RETRIES:
                    raise

    @property
    def ended(self) -> bool:
        return self.stream is None or self.stream.ended

    async def read(self) -> bytes | None:
        """The next answer, None once the call ended well; raises `EngineError` when it did not."""
        assert self.stream is not None
        while True:
            try:
                return await self.stream.read()
            except Refused:
                self.retries += 1
                if self.retries > self.RETRIES:
                    raise
                self.stream = await self.open()

    def read_nowait(self) -> bytes | None:
        """The next answer if one is already here, else None."""
        return None if self.stream is None else self.stream.read_nowait()

    def cancel(self) -> None:
        """The reader is gone: the engine is told (RST_STREAM CANCEL)."""
        if self.stream is not None:
            self.stream.cancel()


def method_path(pb: Any, method: str) -> tuple[str, Callable[[bytes], Any]]:
    """`/package.Service/method` of the one service in the generated module `pb` that has
    `method`, and its response message's parser."""
    for service in pb.DESCRIPTOR.services_by_name.values():
        found = service.methods_by_name.get(method)
        if found is not None:
            response = getattr(pb, found.output_type.name)
            return f"/{service.full_name}/{method}", response.FromString
    raise LookupError(f"no service in {pb.__name__} has {method}")
