"""`smg.backends.grpc.http2`, the sans-IO HTTP/2 client under `wire.py`, driven with no socket: an
engine's frames are fed in as bytes, and the frames this side answers and the events it reports
are read back. Every protocol rule is tested here; `test_wire.py` proves the transport over
loopback against grpcio and the scripted engine."""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Iterable

import hpack
import pytest

from smg.backends.grpc import http2
from smg.backends.grpc.http2 import (
    ACK,
    CANCEL,
    CONTINUATION,
    DATA,
    END_HEADERS,
    END_STREAM,
    FLOW_CONTROL_ERROR,
    FRAME_SIZE_ERROR,
    GOAWAY,
    HEADERS,
    NO_ERROR,
    PADDED,
    PING,
    PRIORITY_FLAG,
    PROTOCOL_ERROR,
    PUSH_PROMISE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    SETTINGS_ENABLE_PUSH,
    SETTINGS_INITIAL_WINDOW_SIZE,
    SETTINGS_MAX_CONCURRENT_STREAMS,
    SETTINGS_MAX_FRAME_SIZE,
    STREAM_WINDOW,
    WINDOW_UPDATE,
    ClientConnection,
    Closed,
    GoingAway,
    NotStarted,
    Readable,
    Refused,
    Settled,
    StreamState,
    Writable,
    frame,
)
from smg.backends.grpc.types import EngineError

Frame = tuple[int, int, int, bytes]  # kind, flags, stream id, payload
GRPC_OK = [(":status", "200"), ("content-type", "application/grpc")]
PATH = "/test.Stream/Run"


def grpc_status(code: int, message: str = "") -> list[tuple[str, str]]:
    return [("grpc-status", str(code))] + ([("grpc-message", message)] if message else [])


def message(payload: bytes, compressed: bool = False) -> bytes:
    return bytes([compressed]) + len(payload).to_bytes(4, "big") + payload


def u32(value: int) -> bytes:
    return struct.pack(">L", value)


def settings(*pairs: tuple[int, int]) -> bytes:
    return b"".join(struct.pack(">HL", k, v) for k, v in pairs)


class Engine:
    """The server's side of one connection, in the test's hands: it encodes what the engine
    sends and decodes what the client wrote."""

    def __init__(self, *server_settings: tuple[int, int], settle: bool = True) -> None:
        self.client = ClientConnection("engine:50051")
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.requests: list[list[tuple[str, str]]] = []
        out = self.client.data_to_send()
        assert out.startswith(http2.PREFACE)
        self.opening = self.parse(out[len(http2.PREFACE) :])
        if settle:
            assert self.feed(frame(SETTINGS, 0, 0, settings(*server_settings))) == [Settled()]
            assert self.written() == [(SETTINGS, ACK, 0, b"")]

    def parse(self, data: bytes) -> list[Frame]:
        frames: list[Frame] = []
        pos = 0
        while pos < len(data):
            hi, lo, kind, flags, stream_id = http2.FRAME_HEAD.unpack_from(data, pos)
            length = (hi << 8) | lo
            payload = data[pos + 9 : pos + 9 + length]
            if kind == HEADERS and flags & END_HEADERS:
                self.requests.append([(str(k), str(v)) for k, v in self.decoder.decode(payload)])
            frames.append((kind, flags, stream_id, payload))
            pos += 9 + length
        return frames

    def written(self) -> list[Frame]:
        """The frames the client wrote since last asked."""
        return self.parse(self.client.data_to_send())

    def feed(self, *frames: bytes) -> list[http2.Event]:
        return self.client.receive(b"".join(frames))

    def headers(
        self, stream_id: int, fields: Iterable[tuple[str, str]], *, end_stream: bool = False, huffman: bool = True
    ) -> bytes:
        flags = END_HEADERS | (END_STREAM if end_stream else 0)
        return frame(HEADERS, flags, stream_id, self.encoder.encode(list(fields), huffman=huffman))

    def data(self, stream_id: int, payload: bytes, *, end_stream: bool = False) -> bytes:
        return frame(DATA, END_STREAM if end_stream else 0, stream_id, payload)

    def call(self, request: bytes = b"go") -> StreamState:
        """A call started, its request sent whole."""
        stream = self.client.start(PATH, ())
        body = self.client.message(request)
        assert self.client.send(stream, body) == len(body)
        self.written()
        return stream


def read_all(client: ClientConnection, stream: StreamState) -> list[bytes]:
    out = []
    while (m := client.take(stream)) is not None:
        out.append(m)
    return out


def goaway_code(frames: list[Frame]) -> int:
    (goaway,) = [f for f in frames if f[0] == GOAWAY]
    assert goaway[2] == 0
    return int(struct.unpack(">L", goaway[3][4:8])[0])


# -- the connection's start --------------------------------------------------------------------


def test_the_preface_announces_this_sides_limits_and_the_first_settings_settle_it() -> None:
    engine = Engine(settle=False)
    client = engine.client
    assert not client.settled
    assert engine.opening == [
        (
            SETTINGS,
            0,
            0,
            settings(
                (SETTINGS_ENABLE_PUSH, 0),
                (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (SETTINGS_MAX_FRAME_SIZE, 1 << 20),
            ),
        ),
        (WINDOW_UPDATE, 0, 0, u32(http2.CONNECTION_WINDOW - 65535)),
    ]
    assert client.receive(frame(SETTINGS, 0, 0, settings((SETTINGS_MAX_CONCURRENT_STREAMS, 7)))) == [Settled()]
    assert client.settled and client.peer_max_streams == 7
    assert client.receive(frame(SETTINGS, 0, 0)) == []  # settled once
    assert client.receive(frame(SETTINGS, ACK, 0)) == []  # an ack is not answered


def test_a_ping_is_answered_and_a_ping_ack_is_not() -> None:
    engine = Engine()
    assert engine.feed(frame(PING, 0, 0, b"12345678"), frame(PING, ACK, 0, b"abcdefgh")) == []
    assert engine.written() == [(PING, ACK, 0, b"12345678")]


# -- the request ---------------------------------------------------------------------------------


def test_the_request_headers_carry_the_grpc_fields_and_the_callers_metadata() -> None:
    engine = Engine()
    stream = engine.client.start(PATH, [("traceparent", "00-abc-01")])
    engine.client.send(stream, engine.client.message(b"x"))
    frames = engine.written()
    assert [(k, f, s) for k, f, s, _ in frames] == [(HEADERS, END_HEADERS, 1), (DATA, END_STREAM, 1)]
    assert frames[1][3] == b"\x00\x00\x00\x00\x01x"
    assert engine.requests == [
        [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", PATH),
            (":authority", "engine:50051"),
            ("te", "trailers"),
            ("content-type", "application/grpc"),
            ("user-agent", "smg"),
            ("grpc-accept-encoding", "identity,deflate,gzip"),
            ("traceparent", "00-abc-01"),
        ]
    ]
    assert engine.client.start(PATH, ()).id == 3  # client streams are odd, in order


def test_calls_without_metadata_send_one_header_block_that_leaves_the_dynamic_table_alone() -> None:
    # Built once per path: the same bytes on every call, whatever the table holds meanwhile.
    engine = Engine()
    blocks = []
    for metadata in [(), (), [("traceparent", "00-abc-01")], ()]:
        engine.client.start(PATH, metadata)
        ((kind, flags, _, block),) = engine.written()
        assert (kind, flags) == (HEADERS, END_HEADERS)
        blocks.append(block)
    assert blocks[0] == blocks[1] == blocks[3]
    expected = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", PATH),
        (":authority", "engine:50051"),
        ("te", "trailers"),
        ("content-type", "application/grpc"),
        ("user-agent", "smg"),
        ("grpc-accept-encoding", "identity,deflate,gzip"),
    ]
    assert engine.requests == [expected, expected, [*expected, ("traceparent", "00-abc-01")], expected]


def test_after_the_peer_resizes_the_header_table_the_next_block_opens_with_the_size_update() -> None:
    engine = Engine()
    engine.client.start(PATH, ())
    engine.written()
    engine.feed(frame(SETTINGS, 0, 0, settings((http2.SETTINGS_HEADER_TABLE_SIZE, 256))))
    engine.client.start(PATH, ())
    headers = [f for f in engine.written() if f[0] == HEADERS]
    assert headers[0][3][0] & 0xE0 == 0x20  # a dynamic table size update (RFC 7541 6.3)
    assert engine.requests[-1] == engine.requests[0]
    engine.client.start(PATH, ())
    engine.written()
    assert engine.requests[-1] == engine.requests[0]


def test_a_header_block_past_the_peers_frame_size_goes_on_in_continuation_frames() -> None:
    engine = Engine()
    engine.client.start(PATH, [("x-big", "v" * 40_000)])
    frames = engine.written()
    assert [(k, f) for k, f, _, _ in frames] == [(HEADERS, 0), (CONTINUATION, 0), (CONTINUATION, END_HEADERS)]
    assert all(len(p) <= 16_384 for *_, p in frames)
    fields = dict(engine.decoder.decode(b"".join(p for *_, p in frames)))
    assert fields["x-big"] == "v" * 40_000


def test_the_request_is_sent_within_both_windows_and_the_peers_frame_size() -> None:
    # The engine grants 20,000 bytes a stream; the connection has its default 65,535.
    engine = Engine((SETTINGS_INITIAL_WINDOW_SIZE, 20_000))
    client = engine.client
    stream = client.start(PATH, ())
    body = client.message(b"r" * 100_000)
    sent = client.send(stream, body)
    frames = engine.written()
    assert sent == 20_000
    assert [(k, f, len(p)) for k, f, _, p in frames if k == DATA] == [(DATA, 0, 16_384), (DATA, 0, 3_616)]
    assert client.send(stream, body, sent) == sent  # no window: nothing more
    assert engine.written() == []
    assert engine.feed(frame(WINDOW_UPDATE, 0, 1, u32(100_000))) == [Writable(1)]
    sent = client.send(stream, body, sent)
    assert sent == 65_535  # now the connection's window holds it back
    engine.written()
    assert engine.feed(frame(WINDOW_UPDATE, 0, 0, u32(100_000))) == [Writable(0)]
    assert client.send(stream, body, sent) == len(body)
    frames = engine.written()
    assert frames[-1][:2] == (DATA, END_STREAM) and sum(len(p) for *_, p in frames) == len(body) - 65_535


def test_an_initial_window_change_applies_to_open_streams() -> None:
    engine = Engine((SETTINGS_INITIAL_WINDOW_SIZE, 10))
    stream = engine.client.start(PATH, ())
    body = engine.client.message(b"r" * 100)
    assert engine.client.send(stream, body) == 10
    assert engine.feed(frame(SETTINGS, 0, 0, settings((SETTINGS_INITIAL_WINDOW_SIZE, 60)))) == [Writable(1)]
    assert stream.send_window == 50
    assert engine.client.send(stream, body, 10) == 60


# -- the response --------------------------------------------------------------------------------


def test_messages_split_and_joined_across_frames_come_out_whole_at_every_split_point() -> None:
    wanted = [b"", b"a", b"bc" * 3000, b"d"]
    wire = b"".join(message(m) for m in wanted)
    for cut in range(0, len(wire) + 1, 97):
        engine = Engine()
        stream = engine.call()
        events = engine.feed(engine.headers(1, GRPC_OK), engine.data(1, wire[:cut]))
        events += engine.feed(engine.data(1, wire[cut:]), engine.headers(1, grpc_status(0), end_stream=True))
        assert read_all(engine.client, stream) == wanted, cut
        assert stream.ended and stream.error is None
        assert Readable(1) in events


def test_bytes_arriving_one_at_a_time_make_the_same_answer() -> None:
    engine = Engine()
    stream = engine.call()
    wire = engine.headers(1, GRPC_OK) + engine.data(1, message(b"one") + message(b"two"))
    wire += engine.headers(1, grpc_status(0), end_stream=True)
    events = [e for i in range(len(wire)) for e in engine.client.receive(wire[i : i + 1])]
    assert read_all(engine.client, stream) == [b"one", b"two"]
    assert events == [Readable(1), Readable(1)]  # the DATA frame once whole, then the end
    assert stream.ended and stream.error is None


def test_one_read_with_many_frames_reports_each_stream_once() -> None:
    engine = Engine()
    one, two = engine.call(), engine.call()
    events = engine.feed(
        engine.headers(1, GRPC_OK),
        engine.headers(3, GRPC_OK),
        *(engine.data(sid, message(b"m")) for _ in range(5) for sid in (1, 3)),
    )
    assert events == [Readable(1), Readable(3)]
    assert len(one.messages) == len(two.messages) == 5


@pytest.mark.parametrize(
    "headers, trailers, body, outcome",
    [
        pytest.param(GRPC_OK, grpc_status(0), message(b"x"), None, id="ok"),
        pytest.param(
            GRPC_OK,
            grpc_status(8, "out of KV cache"),
            b"",
            ("RESOURCE_EXHAUSTED", "out of KV cache"),
            id="status in the trailers",
        ),
        pytest.param(
            GRPC_OK + grpc_status(3, "prompt too long: 5 > 4 %E2%9C%97 100%25"),
            None,
            b"",
            ("INVALID_ARGUMENT", "prompt too long: 5 > 4 ✗ 100%"),
            id="trailers-only, percent-encoded",
        ),
        pytest.param(GRPC_OK, grpc_status(99), b"", ("UNKNOWN", ""), id="unknown code"),
        pytest.param([(":status", "404")], None, b"", ("UNIMPLEMENTED", "the engine answered HTTP 404"), id="http 404"),
        pytest.param([(":status", "503")], None, b"", ("UNAVAILABLE", "the engine answered HTTP 503"), id="http 503"),
        pytest.param([(":status", "418")], None, b"", ("UNKNOWN", "the engine answered HTTP 418"), id="http other"),
        pytest.param(
            GRPC_OK,
            [("x-other", "1")],
            b"",
            ("INTERNAL", "the engine ended the stream without a gRPC status"),
            id="no status",
        ),
        pytest.param(
            GRPC_OK,
            grpc_status(0),
            message(b"whole")[:-2],
            ("INTERNAL", "the engine ended the stream inside a message"),
            id="cut inside a message",
        ),
    ],
)
def test_how_a_stream_ends(
    headers: list[tuple[str, str]], trailers: list[tuple[str, str]] | None, body: bytes, outcome: tuple[str, str] | None
) -> None:
    engine = Engine()
    stream = engine.call()
    frames = [engine.headers(1, headers, end_stream=trailers is None)]
    if trailers is not None:
        frames += [engine.data(1, body), engine.headers(1, trailers, end_stream=True)]
    assert engine.feed(*frames) == [Readable(1)]
    assert stream.ended and 1 not in engine.client.streams
    error = stream.error
    assert (None if error is None else (error.code, error.message)) == outcome
    assert engine.written() == []  # an ended stream is not reset


def test_data_that_ends_the_stream_ends_it_without_trailers_as_internal() -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK), engine.data(1, message(b"x"), end_stream=True))
    assert read_all(engine.client, stream) == [b"x"]
    assert stream.error is not None and stream.error.code == "INTERNAL"


@pytest.mark.parametrize(
    "encoding, pack",
    [("gzip", gzip.compress), ("deflate", zlib.compress)],
)
def test_compressed_messages_are_decompressed(encoding: str, pack: object) -> None:
    engine = Engine()
    stream = engine.call()
    assert callable(pack)
    engine.feed(
        engine.headers(1, GRPC_OK + [("grpc-encoding", encoding)]),
        engine.data(1, message(pack(b"z" * 1000), compressed=True) + message(b"plain")),
    )
    assert read_all(engine.client, stream) == [b"z" * 1000, b"plain"]


@pytest.mark.parametrize(
    "encoding, payload",
    [pytest.param("gzip", b"not gzip", id="corrupt"), pytest.param("snappy", b"x", id="not offered")],
)
def test_a_message_that_does_not_decompress_fails_its_stream(encoding: str, payload: bytes) -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK + [("grpc-encoding", encoding)]), engine.data(1, message(payload, True)))
    assert stream.error is not None and stream.error.code == "INTERNAL"
    assert "cannot decompress" in stream.error.message
    assert engine.written() == [(RST_STREAM, 0, 1, u32(CANCEL))]


def test_a_message_past_the_limit_fails_its_stream_before_it_arrives() -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK), engine.data(1, b"\x00" + (http2.MAX_MESSAGE + 1).to_bytes(4, "big")))
    assert stream.error is not None and stream.error.code == "RESOURCE_EXHAUSTED"
    assert engine.written() == [(RST_STREAM, 0, 1, u32(CANCEL))]


def test_padding_is_taken_off_data_and_headers() -> None:
    engine = Engine()
    stream = engine.call()
    block = engine.encoder.encode(GRPC_OK)
    padded_headers = frame(HEADERS, END_HEADERS | PADDED | PRIORITY_FLAG, 1, b"\x03" + bytes(5) + block + bytes(3))
    body = message(b"padded")
    engine.feed(padded_headers, frame(DATA, PADDED, 1, b"\x04" + body + bytes(4)))
    assert stream.headers == dict(GRPC_OK)
    assert read_all(engine.client, stream) == [b"padded"]


def test_trailers_past_the_header_list_limit_fail_only_their_stream() -> None:
    engine = Engine()
    long, other = engine.call(), engine.call()
    events = engine.feed(
        engine.headers(1, GRPC_OK),
        engine.headers(3, GRPC_OK),
        engine.headers(1, grpc_status(13, "e" * 100_000), end_stream=True, huffman=False),
        engine.data(3, message(b"fine")),
        engine.headers(3, grpc_status(0), end_stream=True),  # HPACK still in step
    )
    assert events == [Readable(1), Readable(3)]
    assert long.error is not None and long.error.code == "RESOURCE_EXHAUSTED"
    assert read_all(engine.client, other) == [b"fine"] and other.error is None
    assert engine.written() == []  # the long stream ended itself: no reset


# -- flow control of what arrives ----------------------------------------------------------------


def test_a_streams_window_is_given_back_a_quarter_at_a_time_while_the_reader_keeps_up() -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK))
    chunk = message(b"q" * 16_000)
    updates = []
    for _ in range(200):  # 3.2 MB, read as it comes
        engine.feed(engine.data(1, chunk))
        read_all(engine.client, stream)
        updates += [f for f in engine.written() if f[0] == WINDOW_UPDATE]
    assert [f[2] for f in updates] == [1, 1, 1]
    assert all(struct.unpack(">L", f[3])[0] >= STREAM_WINDOW // 4 for f in updates)


def test_a_reader_that_stops_reading_stops_getting_window_and_gets_it_when_it_reads_again() -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK))
    chunk = message(b"q" * 16_000)
    for _ in range(140):  # 2.2 MB unread: past half the stream's window
        engine.feed(engine.data(1, chunk))
    given = [f for f in engine.written() if f[0] == WINDOW_UPDATE and f[2] == 1]
    assert len(given) == 1  # the first quarter, before half a window waited unread
    read_all(engine.client, stream)
    assert [f[0] for f in engine.written() if f[2] == 1] == [WINDOW_UPDATE]


def test_the_connections_window_is_given_back_at_half_of_it_whatever_the_readers_do() -> None:
    engine = Engine()
    streams = [engine.call() for _ in range(10)]
    for sid in range(1, 21, 2):
        engine.feed(engine.headers(sid, GRPC_OK))
    chunk = message(b"c" * 1_000_000)
    for i in range(34):  # 34 MB over ten streams, none of it read
        sid = streams[i % 10].id
        engine.feed(engine.data(sid, chunk[:500_000]), engine.data(sid, chunk[500_000:]))
        engine.client.take(streams[i % 10])
    connection = [f for f in engine.written() if f[0] == WINDOW_UPDATE and f[2] == 0]
    assert len(connection) == 1 and struct.unpack(">L", connection[0][3])[0] >= http2.CONNECTION_WINDOW // 2


# -- the peer held to the protocol ---------------------------------------------------------------


@pytest.mark.parametrize(
    "frames, code",
    [
        pytest.param([frame(WINDOW_UPDATE, 0, 0, u32((1 << 31) - 1))], FLOW_CONTROL_ERROR, id="window overflow"),
        pytest.param([frame(WINDOW_UPDATE, 0, 0, u32(0))], PROTOCOL_ERROR, id="zero increment"),
        pytest.param([frame(WINDOW_UPDATE, 0, 0, b"\x00")], PROTOCOL_ERROR, id="window update of the wrong size"),
        pytest.param(
            [
                # the stream's window (65,535 less the 7 bytes of the request) at the top
                frame(WINDOW_UPDATE, 0, 1, u32((1 << 31) - 1 - (65_535 - 7))),
                frame(SETTINGS, 0, 0, settings((SETTINGS_INITIAL_WINDOW_SIZE, 65_536))),  # and one past
            ],
            FLOW_CONTROL_ERROR,
            id="initial window change past the top",
        ),
        pytest.param([frame(PING, 0, 0, b"short")], FRAME_SIZE_ERROR, id="ping of the wrong size"),
        pytest.param([frame(SETTINGS, 0, 0, b"12345")], PROTOCOL_ERROR, id="settings of the wrong size"),
        pytest.param([frame(PUSH_PROMISE, END_HEADERS, 1, u32(2))], PROTOCOL_ERROR, id="push promise"),
        pytest.param([frame(CONTINUATION, END_HEADERS, 1, b"")], PROTOCOL_ERROR, id="continuation outside a block"),
        pytest.param(
            [frame(HEADERS, 0, 1, b""), frame(PING, 0, 0, bytes(8))], PROTOCOL_ERROR, id="frame inside a header block"
        ),
        pytest.param([frame(DATA, PADDED, 1, b"\x09abc")], PROTOCOL_ERROR, id="padding past the frame"),
        pytest.param([frame(HEADERS, END_HEADERS, 1, b"\xff\xff\xff\xff")], PROTOCOL_ERROR, id="bad hpack"),
        pytest.param(
            [http2.FRAME_HEAD.pack(0x1000, 1, DATA, 0, 1) + bytes(100)],
            FRAME_SIZE_ERROR,
            id="frame past the size announced",
        ),
    ],
)
def test_a_connection_error_from_the_engine_ends_the_connection_with_goaway(frames: list[bytes], code: int) -> None:
    engine = Engine()
    stream = engine.call()
    events = engine.feed(*frames)
    assert goaway_code(engine.written()) == code
    assert events[0] == Readable(1) and type(events[-1]) is Closed
    assert stream.error is not None and stream.error.code == "UNAVAILABLE"
    assert engine.client.finished
    with pytest.raises(NotStarted):
        engine.client.start(PATH, ())


@pytest.mark.parametrize(
    "setting, code",
    [
        pytest.param((SETTINGS_MAX_FRAME_SIZE, 16_383), PROTOCOL_ERROR, id="frame size too small"),
        pytest.param((SETTINGS_MAX_FRAME_SIZE, 1 << 24), PROTOCOL_ERROR, id="frame size too large"),
        pytest.param((SETTINGS_ENABLE_PUSH, 1), PROTOCOL_ERROR, id="push from a server"),
        pytest.param((SETTINGS_INITIAL_WINDOW_SIZE, 1 << 31), FLOW_CONTROL_ERROR, id="window too large"),
    ],
)
def test_settings_out_of_range_are_a_connection_error(setting: tuple[int, int], code: int) -> None:
    engine = Engine(settle=False)
    events = engine.feed(frame(SETTINGS, 0, 0, settings(setting)))
    assert [type(e) for e in events] == [Closed] and not engine.client.settled
    assert goaway_code(engine.written()) == code


@pytest.mark.parametrize(
    "frames, code, message_",
    [
        pytest.param(
            [frame(WINDOW_UPDATE, 0, 1, u32((1 << 31) - 1))], FLOW_CONTROL_ERROR, "past 2^31-1", id="overflow"
        ),
        pytest.param([frame(WINDOW_UPDATE, 0, 1, u32(0))], PROTOCOL_ERROR, "WINDOW_UPDATE of 0", id="zero increment"),
        pytest.param(
            # unread messages, well past what the window and the credit given back allow
            [frame(DATA, 0, 1, message(bytes(16_379)))] * (2 * STREAM_WINDOW // 16_384),
            FLOW_CONTROL_ERROR,
            "flow-control window",
            id="data past the window",
        ),
    ],
)
def test_a_stream_error_from_the_engine_resets_only_that_stream(frames: list[bytes], code: int, message_: str) -> None:
    engine = Engine()
    stream, other = engine.call(), engine.call()
    engine.feed(engine.headers(1, GRPC_OK), engine.headers(3, GRPC_OK))
    engine.feed(*frames)
    assert [f for f in engine.written() if f[0] == RST_STREAM] == [(RST_STREAM, 0, 1, u32(code))]
    assert stream.error is not None and stream.error.code == "INTERNAL" and message_ in stream.error.message
    assert not other.ended and engine.client.closed is None
    engine.feed(engine.data(1, message(b"late")))  # a reset stream's data is dropped
    assert engine.feed(engine.data(3, message(b"on"))) == [Readable(3)]


@pytest.mark.parametrize(
    "code, headers_first, status, refused",
    [
        pytest.param(REFUSED_STREAM, False, "UNAVAILABLE", True, id="refused before headers"),
        pytest.param(REFUSED_STREAM, True, "UNAVAILABLE", False, id="refused after headers"),
        pytest.param(CANCEL, True, "CANCELLED", False, id="cancel"),
        pytest.param(NO_ERROR, False, "INTERNAL", False, id="no error"),
        pytest.param(0x2, False, "INTERNAL", False, id="internal error"),
        pytest.param(0xB, False, "RESOURCE_EXHAUSTED", False, id="enhance your calm"),
        pytest.param(0xC, False, "PERMISSION_DENIED", False, id="inadequate security"),
    ],
)
def test_a_reset_from_the_engine_maps_to_a_grpc_status_and_is_not_answered(
    code: int, headers_first: bool, status: str, refused: bool
) -> None:
    engine = Engine()
    stream = engine.call()
    if headers_first:
        engine.feed(engine.headers(1, GRPC_OK), engine.data(1, message(b"one")))
    assert engine.feed(frame(RST_STREAM, 0, 1, u32(code))) == [Readable(1)]
    assert read_all(engine.client, stream) == ([b"one"] if headers_first else [])
    assert stream.error is not None and stream.error.code == status
    assert isinstance(stream.error, Refused) is refused
    assert engine.written() == []  # never a reset for a reset


def test_goaway_refuses_the_streams_past_its_last_id_and_lets_the_others_finish() -> None:
    engine = Engine()
    first, second = engine.call(), engine.call()
    events = engine.feed(engine.headers(1, GRPC_OK), frame(GOAWAY, 0, 0, u32(1) + u32(NO_ERROR) + b"draining"))
    assert events[0] == Readable(3) and type(events[1]) is GoingAway
    assert isinstance(second.error, Refused) and "draining" in second.error.message
    assert not first.ended and not engine.client.finished
    with pytest.raises(NotStarted):
        engine.client.start(PATH, ())
    engine.feed(engine.headers(1, grpc_status(0), end_stream=True))
    assert first.ended and first.error is None
    assert engine.client.finished  # the socket may go now


def test_a_goaway_on_an_idle_connection_finishes_it() -> None:
    engine = Engine()
    [event] = engine.feed(frame(GOAWAY, 0, 0, u32(0) + u32(NO_ERROR)))
    assert isinstance(event, GoingAway) and event.error.code == "UNAVAILABLE"
    assert engine.client.finished


# -- this side's ending of things ----------------------------------------------------------------


def test_a_reader_that_leaves_resets_its_stream_and_its_late_data_is_dropped() -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK), engine.data(1, message(b"a") + message(b"b")))
    assert engine.client.reset(stream) == [Readable(1)]
    assert engine.written() == [(RST_STREAM, 0, 1, u32(CANCEL))]
    assert stream.error is not None and stream.error.code == "CANCELLED"
    assert engine.client.take(stream) is None and not engine.client.streams
    assert engine.feed(engine.data(1, message(b"late")), engine.headers(1, grpc_status(0), end_stream=True)) == []
    assert engine.client.reset(stream) == [Readable(1)] and engine.written() == []  # once only


def test_a_stream_that_ended_is_not_reset_by_a_reader_leaving() -> None:
    engine = Engine()
    stream = engine.call()
    engine.feed(engine.headers(1, GRPC_OK + grpc_status(0), end_stream=True))
    engine.client.reset(stream)
    assert engine.written() == [] and stream.error is None


def test_a_request_still_being_sent_stops_when_its_stream_ends() -> None:
    engine = Engine((SETTINGS_INITIAL_WINDOW_SIZE, 1000))
    stream = engine.client.start(PATH, ())
    body = engine.client.message(b"r" * 5000)
    assert engine.client.send(stream, body) == 1000
    engine.written()
    engine.feed(engine.headers(1, GRPC_OK + grpc_status(8, "request too large"), end_stream=True))
    engine.feed(frame(RST_STREAM, 0, 1, u32(NO_ERROR)), frame(WINDOW_UPDATE, 0, 1, u32(10_000)))
    assert engine.client.send(stream, body, 1000) == 1000
    assert engine.written() == []
    assert stream.error is not None and (stream.error.code, stream.error.message) == (
        "RESOURCE_EXHAUSTED",
        "request too large",
    )


def test_a_connection_out_of_stream_ids_starts_nothing_more() -> None:
    engine = Engine()
    engine.client.next_id = (1 << 31) - 1  # the last stream id a client may use
    last = engine.call()
    assert last.id == (1 << 31) - 1
    with pytest.raises(NotStarted) as refused:
        engine.client.start(PATH, ())
    assert refused.value.code == "UNAVAILABLE" and not engine.client.finished
    engine.feed(engine.headers(last.id, GRPC_OK + grpc_status(0), end_stream=True))
    assert engine.client.finished


def test_closing_fails_every_stream_on_the_connection() -> None:
    engine = Engine()
    one, two = engine.call(), engine.call()
    error = EngineError("UNAVAILABLE", "connection lost")
    assert engine.client.close(error) == [Readable(1), Readable(3), Closed(error)]
    assert one.error is error and two.error is error and engine.client.finished
    assert engine.written() == []


def test_status_names() -> None:
    assert [http2.status_name(v) for v in ("0", "3", "14", "16", "17", "x", None)] == [
        "OK",
        "INVALID_ARGUMENT",
        "UNAVAILABLE",
        "UNAUTHENTICATED",
        "UNKNOWN",
        "UNKNOWN",
        "UNKNOWN",
    ]
