"""A gRPC client for one shape of call, server streaming, spoken straight over HTTP/2 on asyncio.

`Generate` streams one message per token, and `grpc.aio` costs about 27 µs of CPU to hand each
one to the event loop (its completion-queue poller thread, the wake-up through the loop and
its Cython call objects; `tools/bench/grpc_read.py`), more than all the rest the gateway does
per token. This client reads the same wire with none of that: an `asyncio.Protocol` parses
the frames a read brings, splits their DATA into gRPC messages and queues them on their
streams, and a reader waiting on a stream is woken once for whatever arrived in that read.
Everything else (unary calls, the tokenizer bundle, runtime detection) stays on `grpc.aio`.

What it implements, of HTTP/2 (RFC 9113) and gRPC over it (the gRPC "PROTOCOL-HTTP2" spec):

* cleartext HTTP/2 with prior knowledge (as `grpc.aio.insecure_channel` speaks it), one TCP
  connection per engine carrying any number of streams, up to the peer's
  `SETTINGS_MAX_CONCURRENT_STREAMS` (further calls wait for a stream to end);
* request: HEADERS (`:method POST`, `:path /package.Service/Method`, `te: trailers`,
  `content-type: application/grpc`, the caller's metadata), then the length-prefixed message in
  DATA frames within the peer's flow-control windows and frame size;
* response: headers, length-prefixed messages (split or joined across DATA frames in any way;
  `gzip`/`deflate` ones decompressed), then trailers with `grpc-status`/`grpc-message`, or a
  trailers-only answer; a non-200 `:status` without a gRPC status maps as gRPC says;
* flow control both ways: what the reader has taken is given back with WINDOW_UPDATE (so a
  reader that stops reading stops the engine), and sending waits for the peer's windows;
* SETTINGS (acknowledged, initial window changes applied to open streams), PING answered,
  GOAWAY (streams past its last id fail as UNAVAILABLE, nothing new starts on that
  connection), RST_STREAM both ways (a reader that leaves early cancels its stream), and the
  connection's loss failing every stream on it as UNAVAILABLE. Header blocks are HPACK
  (`hpack`), CONTINUATION included, decoded on every block, a reset stream's too;
* the peer held to the protocol: a window taken past 2^31-1, a WINDOW_UPDATE of 0, DATA past
  the window granted, a frame past the size announced or a SETTINGS value out of range is
  answered with RST_STREAM or GOAWAY of the error code RFC 9113 names (never a RST_STREAM
  for a RST_STREAM); a header list past `MAX_HEADER_LIST` fails only its stream.

Failures are `EngineError`s named by gRPC status codes, as `grpc.aio`'s are once converted, so
the connector's retry and health rules see the same thing whichever client ran the call.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import zlib
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, cast
from urllib.parse import unquote

import hpack

from smg.backends.grpc.types import EngineError

_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_HEAD = struct.Struct(">HBBBL")  # a frame header: length (24 bits, split 16 + 8), type, flags, stream id
_WINDOW = struct.Struct(">L")

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x0, 0x1, 0x3, 0x6, 0x7, 0x8
_MAX_WINDOW = (1 << 31) - 1
_MAX_FRAME = 1 << 20  # the SETTINGS_MAX_FRAME_SIZE this side announces

# What this side grants: a stream may run 4 MiB ahead of its reader, the connection 64 MiB.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 64 * 1024 * 1024
_CREDIT_AT = STREAM_WINDOW // 4  # a stream's window is given back a quarter at a time
_WITHHOLD_AT = STREAM_WINDOW // 2  # unread bytes past which it is not
MAX_MESSAGE = 256 * 1024 * 1024  # as CHANNEL_OPTIONS' grpc.max_receive_message_length
# A header list past this fails its stream (RESOURCE_EXHAUSTED), as grpc-core's 16 KiB hard
# limit does, only more leniently; past the second, HPACK decoding stops and so must the
# connection (its dynamic table can no longer be kept in step).
MAX_HEADER_LIST = 64 * 1024
_MAX_HEADER_BLOCK = 16 * 1024 * 1024

_STATUS_NAMES = (
    "OK CANCELLED UNKNOWN INVALID_ARGUMENT DEADLINE_EXCEEDED NOT_FOUND ALREADY_EXISTS PERMISSION_DENIED"
    " RESOURCE_EXHAUSTED FAILED_PRECONDITION ABORTED OUT_OF_RANGE UNIMPLEMENTED INTERNAL UNAVAILABLE DATA_LOSS"
    " UNAUTHENTICATED"
).split()
# gRPC's mapping of an HTTP status that came without a gRPC one.
_HTTP_STATUS = {400: "INTERNAL", 401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED", 404: "UNIMPLEMENTED"}
_HTTP_STATUS |= {429: "UNAVAILABLE", 502: "UNAVAILABLE", 503: "UNAVAILABLE", 504: "UNAVAILABLE"}
# An RST_STREAM's error code as a gRPC status (the gRPC HTTP/2 spec's table).
_RST_STATUS = {
    0x0: "INTERNAL",
    0x7: "UNAVAILABLE",
    0x8: "CANCELLED",
    0xB: "RESOURCE_EXHAUSTED",
    0xC: "PERMISSION_DENIED",
}


def _frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    n = len(payload)
    return _HEAD.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


def status_name(value: str | None) -> str:
    """A `grpc-status` trailer's value by its code name (`UNKNOWN` for what is not one)."""
    try:
        code = int(value or "")
    except ValueError:
        return "UNKNOWN"
    return _STATUS_NAMES[code] if 0 <= code < len(_STATUS_NAMES) else "UNKNOWN"


class Stream:
    """One call's response side: its messages as they arrive, then how it ended."""

    __slots__ = (
        "connection",
        "id",
        "messages",
        "partial",
        "headers",
        "error",
        "ended",
        "waiter",
        "send_window",
        "window_waiter",
        "credit",
        "buffered",
        "encoding",
    )

    def __init__(self, connection: Connection, stream_id: int, send_window: int) -> None:
        self.connection = connection
        self.id = stream_id
        self.messages: deque[bytes] = deque()
        self.partial = bytearray()  # the start of a message the next DATA frame continues
        self.headers: dict[str, str] | None = None
        self.error: EngineError | None = None  # how it failed, once it has
        self.ended = False  # the peer ended it (END_STREAM or RST_STREAM), or the connection went
        self.waiter: asyncio.Future[None] | None = None
        self.send_window = send_window
        self.window_waiter: asyncio.Future[None] | None = None
        # Flow control: bytes received that no WINDOW_UPDATE has given back yet, and the bytes
        # of whole messages waiting for the reader. Credit is given back while the reader keeps
        # up and withheld while half a window waits unread, so a stalled reader stalls the
        # engine; the bytes of a message still arriving are always given back (one message may
        # be larger than the window).
        self.credit = 0
        self.buffered = 0
        self.encoding = "identity"

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

    def fail(self, error: EngineError) -> None:
        if not self.ended:
            self.error = error
            self.ended = True
        self.wake()
        self.wake_sender()

    async def read(self) -> bytes | None:
        """The next message, None once the stream ended well; raises `EngineError` when it did not."""
        while True:
            messages = self.messages
            if messages:
                message = messages.popleft()
                self.buffered -= len(message) + 5
                if self.credit >= _CREDIT_AT and self.buffered < _WITHHOLD_AT:
                    self.connection.give_back(self)
                return message
            if self.ended:
                if self.error is not None:
                    raise self.error
                return None
            self.waiter = self.connection.loop.create_future()
            await self.waiter

    def read_nowait(self) -> bytes | None:
        """The next message if one is already here, else None (whether or not more will come)."""
        messages = self.messages
        if not messages:
            return None
        message = messages.popleft()
        self.buffered -= len(message) + 5
        if self.credit >= _CREDIT_AT and self.buffered < _WITHHOLD_AT:
            self.connection.give_back(self)
        return message

    def cancel(self) -> None:
        """The reader is gone: tell the engine (RST_STREAM CANCEL) and forget the stream."""
        self.connection.reset(self)


class Connection(asyncio.Protocol):
    """One HTTP/2 connection to an engine and the streams on it."""

    def __init__(self, loop: asyncio.AbstractEventLoop, authority: str) -> None:
        self.loop = loop
        self.authority = authority
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.next_id = 1
        self.buffer = bytearray()
        self.awaited = 0  # the size of the frame `buffer` holds the start of
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 64 * 1024
        self.decoder.max_header_list_size = _MAX_HEADER_BLOCK
        self.peer_max_frame = 16384
        self.peer_initial_window = 65535
        self.peer_max_streams = _MAX_WINDOW
        self.send_window = 65535  # the connection's, as the peer grants it
        self.window_waiters: list[asyncio.Future[None]] = []
        self.slot_waiters: deque[asyncio.Future[None]] = deque()
        self.unacked = 0  # connection-level bytes consumed and not yet given back
        self.closed: EngineError | None = None  # set once no new stream may start here
        self.last_stream = _MAX_WINDOW  # a GOAWAY's last stream id
        self._block: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        # The peer's first SETTINGS: no stream starts before its limits are known.
        self.settled: asyncio.Future[None] = loop.create_future()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport subclasses
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        settings = b"".join(
            struct.pack(">HL", key, value)
            for key, value in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, _MAX_FRAME),
            )
        )
        self.transport.write(
            _PREFACE
            + _frame(SETTINGS, 0, 0, settings)
            + _frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(CONNECTION_WINDOW - 65535))
        )

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"connection to {self.authority} lost" + (f": {exc}" if exc else "")
        self._close(EngineError("UNAVAILABLE", reason))

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        if buffer:
            buffer += data
            if len(buffer) < self.awaited:
                return  # a large frame arriving in many reads is joined once, when whole
            data = bytes(buffer)
            buffer.clear()
        view = memoryview(data)
        size = len(data)
        pos = 0
        unpack = _HEAD.unpack_from
        woken: set[Stream] = set()
        try:
            while size - pos >= 9:
                hi, lo, kind, flags, stream_id = unpack(data, pos)
                length = (hi << 8) | lo
                end = pos + 9 + length
                if end > size:
                    if length > _MAX_FRAME:
                        raise _ProtocolError(f"a frame of {length} bytes", FRAME_SIZE_ERROR)
                    self.awaited = end - pos
                    break
                if kind == DATA:
                    self._data(view[pos + 9 : end], flags, stream_id & _MAX_WINDOW, length, woken)
                else:
                    self._control(kind, flags, stream_id & _MAX_WINDOW, data[pos + 9 : end], woken)
                pos = end
        except _ProtocolError as exc:
            self._abandon(str(exc), exc.code)
            return
        if pos < size:
            buffer += view[pos:]
            if size - pos < 9:
                self.awaited = 9  # a frame header's worth, then its length is known
        for stream in woken:
            stream.wake()
        if self.unacked >= CONNECTION_WINDOW // 2:
            self._write(_frame(WINDOW_UPDATE, 0, 0, _WINDOW.pack(self.unacked)))
            self.unacked = 0

    # -- frames in ---------------------------------------------------------------------------

    def _data(self, payload: memoryview, flags: int, stream_id: int, length: int, woken: set[Stream]) -> None:
        if flags & PADDED:
            if not payload:
                raise _ProtocolError("DATA frame padded past its length")
            pad = payload[0]
            if pad >= len(payload):
                raise _ProtocolError("DATA frame padded past its length")
            payload = payload[1 : len(payload) - pad]
        # The connection's window is given back as frames arrive (a stream's own window is
        # what holds an engine back from a slow reader, see `give_back`).
        self.unacked += length
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return  # a stream this side reset
        partial = stream.partial
        if partial:
            partial += payload
            data: memoryview | bytes = bytes(partial)
            partial.clear()
        else:
            data = payload
        stream.credit += length
        if stream.credit > STREAM_WINDOW:
            error = EngineError("INTERNAL", "the engine sent past the stream's flow-control window")
            self._fail_stream(stream, error, woken, FLOW_CONTROL_ERROR)
            return
        pos, size = 0, len(data)
        messages = stream.messages
        while size - pos >= 5:
            compressed = data[pos]
            mlen = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if mlen > MAX_MESSAGE:
                self._fail_stream(stream, EngineError("RESOURCE_EXHAUSTED", f"message of {mlen} bytes"), woken)
                return
            if size - pos - 5 < mlen:
                break
            message = bytes(data[pos + 5 : pos + 5 + mlen])
            if compressed:
                try:
                    message = _decompress(stream.encoding, message)
                except (zlib.error, ValueError) as exc:
                    self._fail_stream(stream, EngineError("INTERNAL", f"cannot decompress a message: {exc}"), woken)
                    return
            messages.append(message)
            stream.buffered += 5 + mlen
            pos += 5 + mlen
        if pos < size:
            partial += data[pos:]
        if messages:
            woken.add(stream)
        if stream.credit >= _CREDIT_AT and stream.buffered < _WITHHOLD_AT:
            self.give_back(stream)
        if flags & END_STREAM:
            self._ended(stream, None, woken)

    def _control(self, kind: int, flags: int, stream_id: int, payload: bytes, woken: set[Stream]) -> None:
        if kind == HEADERS:
            if self._block is not None:
                raise _ProtocolError("HEADERS inside another header block")
            pos, end = 0, len(payload)
            if flags & PADDED:
                if not payload:
                    raise _ProtocolError("HEADERS frame padded past its length")
                end -= payload[0]
                pos = 1
            if flags & PRIORITY_FLAG:
                pos += 5
            if pos > end:
                raise _ProtocolError("HEADERS frame padded past its length")
            block = bytearray(payload[pos:end])
            if flags & END_HEADERS:
                self._headers(stream_id, flags, bytes(block), woken)
            else:
                self._block = (stream_id, flags, block)
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != stream_id:
                raise _ProtocolError("CONTINUATION outside a header block")
            self._block[2].extend(payload)
            if len(self._block[2]) > _MAX_HEADER_BLOCK:
                raise _ProtocolError("a header block past 16 MiB")
            if flags & END_HEADERS:
                sid, first_flags, block = self._block
                self._block = None
                self._headers(sid, first_flags, bytes(block), woken)
        elif self._block is not None:
            raise _ProtocolError("a frame inside a header block")
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == WINDOW_UPDATE:
            if len(payload) != 4:
                raise _ProtocolError("WINDOW_UPDATE of the wrong size")
            increment = _WINDOW.unpack(payload)[0] & _MAX_WINDOW
            if stream_id == 0:
                if increment == 0:
                    raise _ProtocolError("a WINDOW_UPDATE of 0 for the connection")
                self.send_window += increment
                if self.send_window > _MAX_WINDOW:
                    raise _ProtocolError("the connection's window past 2^31-1", FLOW_CONTROL_ERROR)
                waiters, self.window_waiters = self.window_waiters, []
                for waiter in waiters:
                    if not waiter.done():
                        waiter.set_result(None)
            elif (stream := self.streams.get(stream_id)) is not None:
                stream.send_window += increment
                if increment == 0:
                    error = EngineError("INTERNAL", "the engine sent a WINDOW_UPDATE of 0")
                    self._fail_stream(stream, error, woken, PROTOCOL_ERROR)
                elif stream.send_window > _MAX_WINDOW:
                    error = EngineError("INTERNAL", "the engine took the stream's window past 2^31-1")
                    self._fail_stream(stream, error, woken, FLOW_CONTROL_ERROR)
                else:
                    stream.wake_sender()
        elif kind == PING:
            if len(payload) != 8:
                raise _ProtocolError("a PING of the wrong size", FRAME_SIZE_ERROR)
            if not flags & ACK:
                self._write(_frame(PING, ACK, 0, payload))
        elif kind == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                code = _WINDOW.unpack(payload[:4])[0] if len(payload) >= 4 else PROTOCOL_ERROR
                status = _RST_STATUS.get(code, "INTERNAL")
                said = f"the engine reset the stream (HTTP/2 error {code})"
                refused = code == REFUSED_STREAM and stream.headers is None
                error = Refused(status, said) if refused else EngineError(status, said)
                self._fail_stream(stream, error, woken, None)  # never a reset for a reset
        elif kind == GOAWAY:
            last = (_WINDOW.unpack(payload[:4])[0] & _MAX_WINDOW) if len(payload) >= 8 else 0
            code = _WINDOW.unpack(payload[4:8])[0] if len(payload) >= 8 else PROTOCOL_ERROR
            detail = payload[8:].decode("utf-8", "replace")
            self.last_stream = min(self.last_stream, last)
            said = f"HTTP/2 GOAWAY {code}" + (f": {detail}" if detail else "")
            error = EngineError("UNAVAILABLE", f"the engine is going away ({said})")
            if self.closed is None:
                self.closed = error
            for stream in [s for s in self.streams.values() if s.id > last]:
                self._fail_stream(stream, Refused(error.code, error.message), woken, None)  # never begun
            self._release_slots()
            if not self.streams and self.transport is not None:
                self.transport.close()
        elif kind == PUSH_PROMISE:
            raise _ProtocolError("PUSH_PROMISE after push was disabled")
        # PRIORITY and unknown frame types are ignored, as HTTP/2 says.

    def _headers(self, stream_id: int, flags: int, block: bytes, woken: set[Stream]) -> None:
        try:
            decoded = self.decoder.decode(block, raw=False)  # the dynamic table moves with every block
        except hpack.HPACKError as exc:
            raise _ProtocolError(f"bad header block: {exc}") from exc
        stream = self.streams.get(stream_id)
        if stream is None or stream.ended:
            return
        size = sum(32 + len(k) + len(v) for k, v in decoded)
        if size > MAX_HEADER_LIST:
            error = EngineError("RESOURCE_EXHAUSTED", f"the engine sent a header list of {size} bytes")
            self._fail_stream(stream, error, woken, None if flags & END_STREAM else CANCEL)
            return
        fields = {str(k): str(v) for k, v in decoded}
        if stream.headers is None:
            stream.headers = fields
            stream.encoding = fields.get("grpc-encoding", "identity")
            if not flags & END_STREAM:
                return
            trailers = fields  # trailers-only
        else:
            trailers = fields
        self._ended(stream, trailers, woken)

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ProtocolError("SETTINGS of the wrong size")
        for pos in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, pos)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > _MAX_WINDOW:
                    raise _ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1", FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > _MAX_WINDOW:
                        raise _ProtocolError("a stream's window past 2^31-1", FLOW_CONTROL_ERROR)
                    stream.wake_sender()
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value < 1 << 24:
                    raise _ProtocolError(f"SETTINGS_MAX_FRAME_SIZE of {value}")
                self.peer_max_frame = value
            elif key == SETTINGS_ENABLE_PUSH:
                if value != 0:
                    raise _ProtocolError("SETTINGS_ENABLE_PUSH from a server")
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
                self._release_slots()
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                self.encoder.header_table_size = value
        self._write(_frame(SETTINGS, ACK, 0))
        if not self.settled.done():
            self.settled.set_result(None)

    def _ended(self, stream: Stream, trailers: dict[str, str] | None, woken: set[Stream]) -> None:
        """The peer ended `stream`: done, or failed by its status."""
        headers = stream.headers or {}
        if trailers is not None and "grpc-status" in trailers:
            status = status_name(trailers["grpc-status"])
            error = None if status == "OK" else EngineError(status, unquote(trailers.get("grpc-message", "")))
        elif headers.get(":status", "200") != "200":
            http = int(headers.get(":status", "0") or 0)
            error = EngineError(_HTTP_STATUS.get(http, "UNKNOWN"), f"the engine answered HTTP {http}")
        else:
            error = EngineError("INTERNAL", "the engine ended the stream without a gRPC status")
        if error is None and stream.partial:
            error = EngineError("INTERNAL", "the engine ended the stream inside a message")
        stream.error = error
        stream.ended = True
        stream.wake_sender()  # a request still waiting for window is not sent on
        self._forget(stream)
        woken.add(stream)

    def _fail_stream(self, stream: Stream, error: EngineError, woken: set[Stream], code: int | None = CANCEL) -> None:
        """`stream` fails with `error`; the engine is told by RST_STREAM `code` (None: not told)."""
        if not stream.ended and code is not None:
            self._write(_frame(RST_STREAM, 0, stream.id, _WINDOW.pack(code)))
        stream.fail(error)
        self._forget(stream)
        woken.add(stream)

    # -- frames out --------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing():
            transport.write(data)

    def give_back(self, stream: Stream) -> None:
        """Window for the bytes `stream` has received (see `Stream.credit`)."""
        if not stream.ended:
            self._write(_frame(WINDOW_UPDATE, 0, stream.id, _WINDOW.pack(stream.credit)))
        stream.credit = 0

    def reset(self, stream: Stream) -> None:
        if not stream.ended:
            self._write(_frame(RST_STREAM, 0, stream.id, _WINDOW.pack(CANCEL)))
            stream.fail(EngineError("CANCELLED", "cancelled by the gateway"))
        stream.messages.clear()
        self._forget(stream)

    async def open(self, path: str, message: bytes, metadata: Iterable[tuple[str, str]]) -> Stream:
        """Start a call: its headers and its one request message, within the peer's windows."""
        while self.closed is None and len(self.streams) >= self.peer_max_streams:
            slot = self.loop.create_future()
            self.slot_waiters.append(slot)
            try:
                await slot
            except asyncio.CancelledError:
                self._release_slots()  # a slot handed to this caller goes to the next
                raise
        if self.closed is not None:
            raise NotStarted(self.closed.code, self.closed.message)
        stream_id = self.next_id
        if stream_id > _MAX_WINDOW:
            self.closed = EngineError("UNAVAILABLE", "the connection ran out of stream ids")
            if not self.streams and self.transport is not None:
                self.transport.close()
            raise NotStarted(self.closed.code, self.closed.message)
        self.next_id += 2
        stream = Stream(self, stream_id, self.peer_initial_window)
        self.streams[stream_id] = stream
        headers = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", path),
            (":authority", self.authority),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("user-agent", "smg"),
            ("grpc-accept-encoding", "identity,deflate,gzip"),
            *metadata,
        ]
        block = self.encoder.encode(headers)
        limit = self.peer_max_frame
        out = bytearray(_frame(HEADERS, END_HEADERS if len(block) <= limit else 0, stream_id, block[:limit]))
        for pos in range(limit, len(block), limit):
            last = pos + limit >= len(block)
            out += _frame(CONTINUATION, END_HEADERS if last else 0, stream_id, block[pos : pos + limit])
        body = memoryview(b"\x00" + len(message).to_bytes(4, "big") + message)
        sent = 0
        while True:
            room = min(self.send_window, stream.send_window, self.peer_max_frame, len(body) - sent)
            if room > 0 or sent == len(body) == 0:
                last = sent + room == len(body)
                out += _frame(DATA, END_STREAM if last else 0, stream_id, bytes(body[sent : sent + room]))
                self.send_window -= room
                stream.send_window -= room
                sent += room
                if last:
                    break
                continue
            self._write(bytes(out))
            out.clear()
            if stream.ended:
                if stream.error is not None:
                    raise stream.error
                break
            if self.closed is not None and stream_id > self.last_stream:
                raise self.closed
            # One future for either window, so the stream's end wakes it too.
            window = self.loop.create_future()
            stream.window_waiter = window
            if self.send_window <= 0:
                self.window_waiters.append(window)
            try:
                await window
            except asyncio.CancelledError:
                self.reset(stream)  # the engine must not wait for the rest of the request
                raise
        if out:
            self._write(bytes(out))
        return stream

    # -- lifetime ----------------------------------------------------------------------------

    def _forget(self, stream: Stream) -> None:
        if self.streams.pop(stream.id, None) is not None:
            self._release_slots()
            if self.closed is not None and not self.streams and self.transport is not None:
                self.transport.close()

    def _release_slots(self) -> None:
        while self.slot_waiters and (self.closed is not None or len(self.streams) < self.peer_max_streams):
            slot = self.slot_waiters.popleft()
            if not slot.done():
                slot.set_result(None)

    def _abandon(self, reason: str, code: int) -> None:
        self._write(_frame(GOAWAY, 0, 0, _WINDOW.pack(0) + _WINDOW.pack(code) + reason.encode()[:256]))
        self._close(EngineError("UNAVAILABLE", f"HTTP/2 protocol error from {self.authority}: {reason}"))

    def _close(self, error: EngineError) -> None:
        if self.closed is None:
            self.closed = error
        if not self.settled.done():
            self.settled.set_exception(error)
            self.settled.exception()  # retrieved: a connection nobody waited on logs nothing
        for stream in list(self.streams.values()):
            stream.fail(error)
        self.streams.clear()
        for waiter in self.window_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self.window_waiters = []
        self._release_slots()
        if self.transport is not None:
            self.transport.close()

    def close(self) -> None:
        self._close(EngineError("UNAVAILABLE", "the channel was closed"))


class NotStarted(EngineError):
    """The connection closed (GOAWAY, lost) before the call began: it may go on a new one."""


class Refused(EngineError):
    """The engine refused the stream before processing it (REFUSED_STREAM, or past a GOAWAY's
    last stream): sending it again is safe."""


class _ProtocolError(Exception):
    """The peer broke HTTP/2: the connection is given up, with GOAWAY `code`."""

    def __init__(self, reason: str, code: int = PROTOCOL_ERROR) -> None:
        super().__init__(reason)
        self.code = code


def _decompress(encoding: str, message: bytes) -> bytes:
    if encoding == "gzip":
        return zlib.decompress(message, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompress(message)
    raise ValueError(f"compressed with {encoding!r}, which was not offered")


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
