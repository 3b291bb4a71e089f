"""The Generate stream read over the `h2` library's state machine, for `tools.bench.grpc_read` to
set beside `smg.backends.grpc.wire`: the same work per read (frames parsed, HPACK, gRPC messages
split out of DATA, flow control given back, a reader woken once per read), with `h2` doing the
HTTP/2 part. Only the happy path a bench drives: small requests, no compression, no refusals.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque
from collections.abc import Iterable
from typing import Any, cast

import h2.config
import h2.connection
import h2.events
import h2.settings

STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024


class Stream:
    __slots__ = ("connection", "id", "messages", "partial", "ended", "error", "waiter")

    def __init__(self, connection: Connection, stream_id: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.messages: deque[bytes] = deque()
        self.partial = bytearray()
        self.ended = False
        self.error: str | None = None
        self.waiter: asyncio.Future[None] | None = None

    def wake(self) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def read(self) -> bytes | None:
        while True:
            if self.messages:
                return self.messages.popleft()
            if self.ended:
                if self.error is not None:
                    raise RuntimeError(self.error)
                return None
            self.waiter = self.connection.loop.create_future()
            await self.waiter


class Connection(asyncio.Protocol):
    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str) -> None:
        self.loop = loop
        self.authority = authority
        self.h2 = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding="utf-8"))
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.settled: asyncio.Future[None] = loop.create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = self.h2
        conn.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                h2.settings.SettingCodes.MAX_FRAME_SIZE: 1 << 20,
            },
        )
        conn.initiate_connection()
        conn.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self.transport.write(conn.data_to_send())

    def connection_lost(self, exc: Exception | None) -> None:
        for stream in self.streams.values():
            stream.ended, stream.error = True, "connection lost"
            stream.wake()

    def data_received(self, data: bytes) -> None:
        conn = self.h2
        woken: set[Stream] = set()
        for event in conn.receive_data(data):
            kind = type(event)
            if kind is h2.events.DataReceived:
                event = cast(h2.events.DataReceived, event)
                stream = self.streams.get(event.stream_id)  # type: ignore[arg-type]
                if stream is not None:
                    self._messages(stream, event.data)  # type: ignore[arg-type]
                    woken.add(stream)
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)  # type: ignore[arg-type]
            elif kind is h2.events.StreamEnded or kind is h2.events.StreamReset:
                stream = self.streams.pop(cast(Any, event).stream_id, None)
                if stream is not None:
                    stream.ended = True
                    if kind is h2.events.StreamReset:
                        stream.error = "reset"
                    woken.add(stream)
            elif kind is h2.events.TrailersReceived:
                status = dict(cast(Any, event).headers).get("grpc-status")
                stream = self.streams.get(cast(Any, event).stream_id)
                if stream is not None and status != "0":
                    stream.error = f"grpc-status {status}"
            elif kind is h2.events.RemoteSettingsChanged and not self.settled.done():
                self.settled.set_result(None)
        out = conn.data_to_send()
        if out and self.transport is not None:
            self.transport.write(out)
        for stream in woken:
            stream.wake()

    @staticmethod
    def _messages(stream: Stream, payload: bytes) -> None:
        partial = stream.partial
        if partial:
            partial += payload
            data: bytes | memoryview = bytes(partial)
            partial.clear()
        else:
            data = payload
        pos, size = 0, len(data)
        while size - pos >= 5:
            mlen = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if size - pos - 5 < mlen:
                break
            stream.messages.append(bytes(data[pos + 5 : pos + 5 + mlen]))
            pos += 5 + mlen
        if pos < size:
            partial += data[pos:]

    def open(self, path: str, message: bytes, metadata: Iterable[tuple[str, str]]) -> Stream:
        conn = self.h2
        stream_id = conn.get_next_available_stream_id()
        stream = self.streams[stream_id] = Stream(self, stream_id)
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("user-agent", "smg"),
            *metadata,
        ]
        conn.send_headers(stream_id, headers)
        conn.send_data(stream_id, b"\x00" + len(message).to_bytes(4, "big") + message, end_stream=True)
        assert self.transport is not None
        self.transport.write(conn.data_to_send())
        return stream


class Channel:
    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target, self.host, self.port = target, host.strip("[]"), int(port)
        self._connection: Connection | None = None

    async def stream(self, path: str, request: bytes, metadata: Iterable[tuple[str, str]] = ()) -> Stream:
        if self._connection is None:
            loop = asyncio.get_running_loop()
            _, connection = await loop.create_connection(lambda: Connection(loop, self.target), self.host, self.port)
            await connection.settled
            self._connection = connection
        return self._connection.open(path, request, metadata)

    def close(self) -> None:
        if self._connection is not None and self._connection.transport is not None:
            self._connection.transport.close()
        self._connection = None
