"""The HTTP/2 client side of gRPC server-streaming calls, sans I/O: bytes in, events and bytes out.

`ClientConnection` holds one connection's protocol state and does no I/O and no waiting (the
shape of h2's `receive_data` / `data_to_send`). `receive(data)` takes what the socket read and
returns what changed for the waiting side (`Readable`, `Writable`, `Settled`, `GoingAway`,
`Closed`); whatever must go back to the peer (SETTINGS acks, PING answers, WINDOW_UPDATE,
RST_STREAM, GOAWAY) collects in `data_to_send()`. `wire.py` moves the bytes and wakes the
waiters; the tests drive this class with frames and read its frames and events, no socket.

Why not `h2` itself: `tools/bench/grpc_read.py` reads the same stream through an `h2` state
machine at about twice this one's CPU per message (it builds an event and a frame object per
frame and walks a stream state machine per event); one message per token makes that the cost
that matters.

Of HTTP/2 (RFC 9113) and gRPC over it (the gRPC "PROTOCOL-HTTP2" spec):

* cleartext HTTP/2 with prior knowledge, any number of streams up to the peer's
  `SETTINGS_MAX_CONCURRENT_STREAMS` (the transport makes further calls wait);
* request: HEADERS (`:method POST`, `:path`, `te: trailers`, `content-type: application/grpc`,
  the caller's metadata; CONTINUATION past the peer's frame size), then the length-prefixed
  message in DATA frames within the peer's flow-control windows and frame size (`send`);
* response: headers, length-prefixed messages (split or joined across DATA frames in any way;
  `gzip`/`deflate` ones decompressed), then trailers with `grpc-status`/`grpc-message`, or a
  trailers-only answer; a non-200 `:status` without a gRPC status maps as gRPC says;
* flow control both ways: what the reader has taken is given back with WINDOW_UPDATE (so a
  reader that stops reading stops the engine), and `send` stays within the peer's windows;
* SETTINGS (acknowledged, initial window changes applied to open streams), PING answered,
  GOAWAY (streams past its last id fail as `Refused`, nothing new starts), RST_STREAM both ways
  (never a RST_STREAM for a RST_STREAM). Header blocks are HPACK (`hpack`), CONTINUATION
  included, decoded on every block, a reset stream's too, so the dynamic table stays in step;
* the peer held to the protocol: a window taken past 2^31-1, a WINDOW_UPDATE of 0, DATA past
  the window granted, a frame past the size announced or a SETTINGS value out of range is
  answered with RST_STREAM or GOAWAY of the error code RFC 9113 names; a header list past
  `MAX_HEADER_LIST` fails only its stream.

Failures are `EngineError`s named by gRPC status codes, as `grpc.aio`'s are once converted, so
the connector's retry and health rules see the same thing whichever client ran the call.
"""

from __future__ import annotations

import struct
import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import unquote

import hpack

from smg.backends.grpc.types import EngineError

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
FRAME_HEAD = struct.Struct(">HBBBL")  # length (24 bits, split 16 + 8), type, flags, stream id
_U32 = struct.Struct(">L")

DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
SETTINGS_HEADER_TABLE_SIZE, SETTINGS_ENABLE_PUSH, SETTINGS_MAX_CONCURRENT_STREAMS = 0x1, 0x2, 0x3
SETTINGS_INITIAL_WINDOW_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x4, 0x5
NO_ERROR, PROTOCOL_ERROR, INTERNAL_ERROR, FLOW_CONTROL_ERROR = 0x0, 0x1, 0x2, 0x3
FRAME_SIZE_ERROR, REFUSED_STREAM, CANCEL = 0x6, 0x7, 0x8
MAX_WINDOW = (1 << 31) - 1
MAX_FRAME = 1 << 20  # the SETTINGS_MAX_FRAME_SIZE this side announces
DEFAULT_WINDOW = 65535

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
MAX_HEADER_BLOCK = 16 * 1024 * 1024

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


def frame(kind: int, flags: int, stream_id: int, payload: bytes = b"") -> bytes:
    """One HTTP/2 frame, header and payload."""
    n = len(payload)
    return FRAME_HEAD.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload


# The request fields after the pseudo-headers, every call's.
_FIXED_FIELDS = (
    ("te", "trailers"),
    ("content-type", "application/grpc"),
    ("user-agent", "smg"),
    ("grpc-accept-encoding", "identity,deflate,gzip"),
)
# HPACK static table indices (RFC 7541 Appendix A).
_STATIC_NAMES = {":authority": 1, ":path": 4, "content-type": 31, "user-agent": 58}
_METHOD_POST, _SCHEME_HTTP = 3, 6


def _hpack_int(value: int, prefix_bits: int, first: int) -> bytes:
    limit = (1 << prefix_bits) - 1
    if value < limit:
        return bytes([first | value])
    out = bytearray([first | limit])
    value -= limit
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _hpack_literal(name: str, value: str) -> bytes:
    """One field as a literal without indexing (its name from the static table when it is there)."""
    raw = value.encode()
    index = _STATIC_NAMES.get(name)
    head = _hpack_int(index, 4, 0) if index else b"\x00" + _hpack_int(len(name), 7, 0) + name.encode()
    return head + _hpack_int(len(raw), 7, 0) + raw


def _fixed_block(path: str, authority: str) -> bytes:
    """The request header block of a call without metadata: static-table entries and literals
    without indexing only, so the same bytes are right whatever the dynamic table holds."""
    fields = ((":path", path), (":authority", authority), *_FIXED_FIELDS)
    return bytes([0x80 | _METHOD_POST, 0x80 | _SCHEME_HTTP]) + b"".join(_hpack_literal(k, v) for k, v in fields)


def status_name(value: str | None) -> str:
    """A `grpc-status` trailer's value by its code name (`UNKNOWN` for what is not one)."""
    try:
        code = int(value or "")
    except ValueError:
        return "UNKNOWN"
    return _STATUS_NAMES[code] if 0 <= code < len(_STATUS_NAMES) else "UNKNOWN"


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


# -- events: what changed, for the side that waits -----------------------------------------------


@dataclass(slots=True)
class Readable:
    """Messages arrived on the stream, or it ended (`StreamState.ended`): its reader wakes, and
    once it has ended its sender too."""

    stream_id: int


@dataclass(slots=True)
class Writable:
    """The stream's send window grew (0: the connection's): a sender waiting for it wakes."""

    stream_id: int


@dataclass(slots=True)
class Settled:
    """The peer's first SETTINGS: its limits are known and calls may start."""


@dataclass(slots=True)
class GoingAway:
    """The peer sent GOAWAY: no new stream starts here (`ClientConnection.closed`)."""

    error: EngineError


@dataclass(slots=True)
class Closed:
    """The connection is over (a protocol error, its loss, or closed by this side): every stream
    on it has failed."""

    error: EngineError


Event = Readable | Writable | Settled | GoingAway | Closed


class StreamState:
    """One call's protocol state: its messages as they arrive, then how it ended."""

    __slots__ = (
        "id",
        "readable",
        "messages",
        "partial",
        "headers",
        "error",
        "ended",
        "send_window",
        "credit",
        "buffered",
        "encoding",
    )

    def __init__(self, stream_id: int, send_window: int) -> None:
        self.id = stream_id
        self.readable = Readable(stream_id)  # made once: it is reported on every read that brings messages
        self.messages: deque[bytes] = deque()
        self.partial = bytearray()  # the start of a message the next DATA frame continues
        self.headers: dict[str, str] | None = None
        self.error: EngineError | None = None  # how it failed, once it has
        self.ended = False  # the peer ended it (END_STREAM or RST_STREAM), or the connection went
        self.send_window = send_window
        # Flow control: bytes received that no WINDOW_UPDATE has given back yet, and the bytes
        # of whole messages waiting for the reader. Credit is given back while the reader keeps
        # up and withheld while half a window waits unread, so a stalled reader stalls the
        # engine; the bytes of a message still arriving are always given back (one message may
        # be larger than the window).
        self.credit = 0
        self.buffered = 0
        self.encoding = "identity"


class ClientConnection:
    """One HTTP/2 client connection's state and the streams on it. The preface and this side's
    SETTINGS are the first bytes `data_to_send` returns."""

    def __init__(self, authority: str) -> None:
        self.authority = authority
        self.streams: dict[int, StreamState] = {}
        self.next_id = 1
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.decoder.max_allowed_table_size = 64 * 1024
        self.decoder.max_header_list_size = MAX_HEADER_BLOCK
        self.peer_max_frame = 16384
        self.peer_initial_window = DEFAULT_WINDOW
        self.peer_max_streams = MAX_WINDOW
        self.send_window = DEFAULT_WINDOW  # the connection's, as the peer grants it
        self.unacked = 0  # connection-level bytes consumed and not yet given back
        self.closed: EngineError | None = None  # set once no new stream may start here
        self.last_stream = MAX_WINDOW  # a GOAWAY's last stream id
        self.settled = False  # the peer's first SETTINGS arrived
        self._buffer = bytearray()
        self._awaited = 0  # the size of the frame `_buffer` holds the start of
        self._block: tuple[int, int, bytearray] | None = None  # a header block awaiting CONTINUATION
        self._readable: dict[int, Readable] = {}  # by stream id, in order, once each
        self._events: list[Event] = []
        self._blocks: dict[str, bytes] = {}  # the request header block of a call without metadata, by path
        self._table_resized = False  # the peer changed the dynamic table's size: the encoder says so next
        settings = b"".join(
            struct.pack(">HL", key, value)
            for key, value in (
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, MAX_FRAME),
            )
        )
        self.outbound = bytearray(
            PREFACE
            + frame(SETTINGS, 0, 0, settings)
            + frame(WINDOW_UPDATE, 0, 0, _U32.pack(CONNECTION_WINDOW - DEFAULT_WINDOW))
        )

    @property
    def finished(self) -> bool:
        """Closed to new streams with none left: the socket may go."""
        return self.closed is not None and not self.streams

    def data_to_send(self) -> bytes:
        """The bytes for the peer since the last call."""
        out = bytes(self.outbound)
        self.outbound.clear()
        return out

    def _drain(self) -> list[Event]:
        events: list[Event] = list(self._readable.values())
        self._readable.clear()
        if self._events:
            events += self._events
            self._events = []
        return events

    # -- bytes in ----------------------------------------------------------------------------

    def receive(self, data: bytes) -> list[Event]:
        """Take what the socket read; what changed, each stream once."""
        buffer = self._buffer
        if buffer:
            buffer += data
            if len(buffer) < self._awaited:
                return []  # a large frame arriving in many reads is joined once, when whole
            data = bytes(buffer)
            buffer.clear()
        view = memoryview(data)
        size = len(data)
        pos = 0
        unpack = FRAME_HEAD.unpack_from
        try:
            while size - pos >= 9:
                hi, lo, kind, flags, stream_id = unpack(data, pos)
                length = (hi << 8) | lo
                end = pos + 9 + length
                if end > size:
                    if length > MAX_FRAME:
                        raise _ProtocolError(f"a frame of {length} bytes", FRAME_SIZE_ERROR)
                    self._awaited = end - pos
                    break
                if kind == DATA:
                    self._data(view[pos + 9 : end], flags, stream_id & MAX_WINDOW, length)
                else:
                    self._control(kind, flags, stream_id & MAX_WINDOW, data[pos + 9 : end])
                pos = end
        except _ProtocolError as exc:
            self._abandon(str(exc), exc.code)
            return self._drain()
        if pos < size:
            buffer += view[pos:]
            if size - pos < 9:
                self._awaited = 9  # a frame header's worth, then its length is known
        if self.unacked >= CONNECTION_WINDOW // 2:
            self.outbound += frame(WINDOW_UPDATE, 0, 0, _U32.pack(self.unacked))
            self.unacked = 0
        readable = self._readable
        if not self._events:  # what most reads bring: messages, and nothing else (`_drain`, inline)
            events: list[Event] = list(readable.values())
            readable.clear()
            return events
        return self._drain()

    def _data(self, payload: memoryview, flags: int, stream_id: int, length: int) -> None:
        if flags & PADDED:
            if not payload:
                raise _ProtocolError("DATA frame padded past its length")
            pad = payload[0]
            if pad >= len(payload):
                raise _ProtocolError("DATA frame padded past its length")
            payload = payload[1 : len(payload) - pad]
        # The connection's window is given back as frames arrive (a stream's own window is
        # what holds an engine back from a slow reader, see `take`).
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
            self._fail_stream(stream, error, FLOW_CONTROL_ERROR)
            return
        pos, size = 0, len(data)
        messages = stream.messages
        arrived = len(messages)
        while size - pos >= 5:
            compressed = data[pos]
            mlen = int.from_bytes(data[pos + 1 : pos + 5], "big")
            if mlen > MAX_MESSAGE:
                self._fail_stream(stream, EngineError("RESOURCE_EXHAUSTED", f"message of {mlen} bytes"))
                return
            if size - pos - 5 < mlen:
                break
            message = bytes(data[pos + 5 : pos + 5 + mlen])
            if compressed:
                try:
                    message = _decompress(stream.encoding, message)
                except (zlib.error, ValueError) as exc:
                    self._fail_stream(stream, EngineError("INTERNAL", f"cannot decompress a message: {exc}"))
                    return
            messages.append(message)
            stream.buffered += 5 + mlen
            pos += 5 + mlen
        if pos < size:
            partial += data[pos:]
        if len(messages) > arrived:
            self._readable[stream.id] = stream.readable
        if stream.credit >= _CREDIT_AT and stream.buffered < _WITHHOLD_AT:
            self._give_back(stream)
        if flags & END_STREAM:
            self._ended(stream, None)

    def _control(self, kind: int, flags: int, stream_id: int, payload: bytes) -> None:
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
                self._headers(stream_id, flags, bytes(block))
            else:
                self._block = (stream_id, flags, block)
        elif kind == CONTINUATION:
            if self._block is None or self._block[0] != stream_id:
                raise _ProtocolError("CONTINUATION outside a header block")
            self._block[2].extend(payload)
            if len(self._block[2]) > MAX_HEADER_BLOCK:
                raise _ProtocolError("a header block past 16 MiB")
            if flags & END_HEADERS:
                sid, first_flags, block = self._block
                self._block = None
                self._headers(sid, first_flags, bytes(block))
        elif self._block is not None:
            raise _ProtocolError("a frame inside a header block")
        elif kind == SETTINGS:
            if not flags & ACK:
                self._settings(payload)
        elif kind == WINDOW_UPDATE:
            self._window_update(stream_id, payload)
        elif kind == PING:
            if len(payload) != 8:
                raise _ProtocolError("a PING of the wrong size", FRAME_SIZE_ERROR)
            if not flags & ACK:
                self.outbound += frame(PING, ACK, 0, payload)
        elif kind == RST_STREAM:
            stream = self.streams.get(stream_id)
            if stream is not None:
                code = _U32.unpack(payload[:4])[0] if len(payload) >= 4 else PROTOCOL_ERROR
                status = _RST_STATUS.get(code, "INTERNAL")
                said = f"the engine reset the stream (HTTP/2 error {code})"
                refused = code == REFUSED_STREAM and stream.headers is None
                error = Refused(status, said) if refused else EngineError(status, said)
                self._fail_stream(stream, error, None)  # never a reset for a reset
        elif kind == GOAWAY:
            self._goaway(payload)
        elif kind == PUSH_PROMISE:
            raise _ProtocolError("PUSH_PROMISE after push was disabled")
        # PRIORITY and unknown frame types are ignored, as HTTP/2 says.

    def _window_update(self, stream_id: int, payload: bytes) -> None:
        if len(payload) != 4:
            raise _ProtocolError("WINDOW_UPDATE of the wrong size")
        increment = _U32.unpack(payload)[0] & MAX_WINDOW
        if stream_id == 0:
            if increment == 0:
                raise _ProtocolError("a WINDOW_UPDATE of 0 for the connection")
            self.send_window += increment
            if self.send_window > MAX_WINDOW:
                raise _ProtocolError("the connection's window past 2^31-1", FLOW_CONTROL_ERROR)
            self._events.append(Writable(0))
        elif (stream := self.streams.get(stream_id)) is not None:
            stream.send_window += increment
            if increment == 0:
                error = EngineError("INTERNAL", "the engine sent a WINDOW_UPDATE of 0")
                self._fail_stream(stream, error, PROTOCOL_ERROR)
            elif stream.send_window > MAX_WINDOW:
                error = EngineError("INTERNAL", "the engine took the stream's window past 2^31-1")
                self._fail_stream(stream, error, FLOW_CONTROL_ERROR)
            else:
                self._events.append(Writable(stream_id))

    def _goaway(self, payload: bytes) -> None:
        last = (_U32.unpack(payload[:4])[0] & MAX_WINDOW) if len(payload) >= 8 else 0
        code = _U32.unpack(payload[4:8])[0] if len(payload) >= 8 else PROTOCOL_ERROR
        detail = payload[8:].decode("utf-8", "replace")
        self.last_stream = min(self.last_stream, last)
        said = f"HTTP/2 GOAWAY {code}" + (f": {detail}" if detail else "")
        error = EngineError("UNAVAILABLE", f"the engine is going away ({said})")
        if self.closed is None:
            self.closed = error
        for stream in [s for s in self.streams.values() if s.id > last]:
            self._fail_stream(stream, Refused(error.code, error.message), None)  # never begun
        self._events.append(GoingAway(error))

    def _headers(self, stream_id: int, flags: int, block: bytes) -> None:
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
            self._fail_stream(stream, error, None if flags & END_STREAM else CANCEL)
            return
        fields = {str(k): str(v) for k, v in decoded}
        if stream.headers is None:
            stream.headers = fields
            stream.encoding = fields.get("grpc-encoding", "identity")
            if not flags & END_STREAM:
                return
        self._ended(stream, fields)  # trailers, or a trailers-only answer

    def _settings(self, payload: bytes) -> None:
        if len(payload) % 6:
            raise _ProtocolError("SETTINGS of the wrong size")
        for pos in range(0, len(payload), 6):
            key, value = struct.unpack_from(">HL", payload, pos)
            if key == SETTINGS_INITIAL_WINDOW_SIZE:
                if value > MAX_WINDOW:
                    raise _ProtocolError("SETTINGS_INITIAL_WINDOW_SIZE past 2^31-1", FLOW_CONTROL_ERROR)
                delta = value - self.peer_initial_window
                self.peer_initial_window = value
                for stream in self.streams.values():
                    stream.send_window += delta
                    if stream.send_window > MAX_WINDOW:
                        raise _ProtocolError("a stream's window past 2^31-1", FLOW_CONTROL_ERROR)
                    self._events.append(Writable(stream.id))
            elif key == SETTINGS_MAX_FRAME_SIZE:
                if not 16384 <= value < 1 << 24:
                    raise _ProtocolError(f"SETTINGS_MAX_FRAME_SIZE of {value}")
                self.peer_max_frame = value
            elif key == SETTINGS_ENABLE_PUSH:
                if value != 0:
                    raise _ProtocolError("SETTINGS_ENABLE_PUSH from a server")
            elif key == SETTINGS_MAX_CONCURRENT_STREAMS:
                self.peer_max_streams = value
            elif key == SETTINGS_HEADER_TABLE_SIZE:
                if value != self.encoder.header_table_size:
                    self._table_resized = True
                self.encoder.header_table_size = value
        self.outbound += frame(SETTINGS, ACK, 0)
        if not self.settled:
            self.settled = True
            self._events.append(Settled())

    def _ended(self, stream: StreamState, trailers: dict[str, str] | None) -> None:
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
        self._forget(stream)

    def _fail_stream(self, stream: StreamState, error: EngineError, code: int | None = CANCEL) -> None:
        """`stream` fails with `error`; the engine is told by RST_STREAM `code` (None: not told)."""
        if not stream.ended and code is not None:
            self.outbound += frame(RST_STREAM, 0, stream.id, _U32.pack(code))
        self._fail(stream, error)
        self._forget(stream)

    def _fail(self, stream: StreamState, error: EngineError) -> None:
        if not stream.ended:
            stream.error = error
            stream.ended = True
        self._readable[stream.id] = stream.readable

    def _forget(self, stream: StreamState) -> None:
        self.streams.pop(stream.id, None)
        self._readable[stream.id] = stream.readable

    def _abandon(self, reason: str, code: int) -> None:
        self.outbound += frame(GOAWAY, 0, 0, _U32.pack(0) + _U32.pack(code) + reason.encode()[:256])
        self._close(EngineError("UNAVAILABLE", f"HTTP/2 protocol error from {self.authority}: {reason}"))

    def _close(self, error: EngineError) -> None:
        if self.closed is None:
            self.closed = error
        for stream in self.streams.values():
            self._fail(stream, error)
        self.streams.clear()
        self._events.append(Closed(error))

    # -- the calls' side ---------------------------------------------------------------------

    def start(self, path: str, metadata: Iterable[tuple[str, str]]) -> StreamState:
        """A new stream and its request headers; raises `NotStarted` when none may start here.
        The stream limit is the caller's to wait for (`peer_max_streams`)."""
        if self.closed is not None:
            raise NotStarted(self.closed.code, self.closed.message)
        stream_id = self.next_id
        if stream_id > MAX_WINDOW:
            self.closed = EngineError("UNAVAILABLE", "the connection ran out of stream ids")
            raise NotStarted(self.closed.code, self.closed.message)
        self.next_id += 2
        stream = self.streams[stream_id] = StreamState(stream_id, self.peer_initial_window)
        extra = tuple(metadata)
        block = None if extra or self._table_resized else self._blocks.get(path)
        if block is None:
            block = self._header_block(path, extra)
        limit = self.peer_max_frame
        out = self.outbound
        out += frame(HEADERS, END_HEADERS if len(block) <= limit else 0, stream_id, block[:limit])
        for pos in range(limit, len(block), limit):
            last = pos + limit >= len(block)
            out += frame(CONTINUATION, END_HEADERS if last else 0, stream_id, block[pos : pos + limit])
        return stream

    def _header_block(self, path: str, metadata: tuple[tuple[str, str], ...]) -> bytes:
        """The request headers of a call on `path`. Without metadata the block is built once per
        path with no reference to the dynamic table (`_fixed_block`); with metadata, or after
        the peer resized the table (the size update opens the next block), the encoder does it."""
        if metadata or self._table_resized:
            self._table_resized = False
            headers = [
                (":method", "POST"),
                (":scheme", "http"),
                (":path", path),
                (":authority", self.authority),
                *_FIXED_FIELDS,
                *metadata,
            ]
            return bytes(self.encoder.encode(headers))
        block = self._blocks[path] = _fixed_block(path, self.authority)
        return block

    def send(self, stream: StreamState, body: bytes | memoryview, sent: int = 0) -> int:
        """DATA for `body` from offset `sent`, as far as both windows and the peer's frame size
        allow, the last frame ending the stream; the new offset (`len(body)` once all is sent)."""
        if stream.ended:
            return sent
        out = self.outbound
        total = len(body)
        while True:
            room = min(self.send_window, stream.send_window, self.peer_max_frame, total - sent)
            if room <= 0 and not sent == total == 0:
                return sent
            last = sent + room == total
            out += frame(DATA, END_STREAM if last else 0, stream.id, bytes(body[sent : sent + room]))
            self.send_window -= room
            stream.send_window -= room
            sent += room
            if last:
                return sent

    @staticmethod
    def message(payload: bytes) -> bytes:
        """`payload` as one length-prefixed, uncompressed gRPC message."""
        return b"\x00" + len(payload).to_bytes(4, "big") + payload

    def take(self, stream: StreamState) -> bytes | None:
        """The reader takes `stream`'s next message (None when none is here); window for what it
        has taken goes back to the peer while the reader keeps up."""
        messages = stream.messages
        if not messages:
            return None
        message = messages.popleft()
        stream.buffered -= len(message) + 5
        if stream.credit >= _CREDIT_AT and stream.buffered < _WITHHOLD_AT:
            self._give_back(stream)
        return message

    def _give_back(self, stream: StreamState) -> None:
        if not stream.ended:
            self.outbound += frame(WINDOW_UPDATE, 0, stream.id, _U32.pack(stream.credit))
        stream.credit = 0

    def reset(self, stream: StreamState) -> list[Event]:
        """The caller is gone: the engine is told (RST_STREAM CANCEL) and the stream forgotten."""
        if not stream.ended:
            self.outbound += frame(RST_STREAM, 0, stream.id, _U32.pack(CANCEL))
            self._fail(stream, EngineError("CANCELLED", "cancelled by the gateway"))
        stream.messages.clear()
        self._forget(stream)
        return self._drain()

    def close(self, error: EngineError) -> list[Event]:
        """The connection is over (lost, or closed by this side): every stream fails with `error`."""
        self._close(error)
        return self._drain()


def _decompress(encoding: str, message: bytes) -> bytes:
    if encoding == "gzip":
        return zlib.decompress(message, 16 + zlib.MAX_WBITS)
    if encoding == "deflate":
        return zlib.decompress(message)
    raise ValueError(f"compressed with {encoding!r}, which was not offered")
