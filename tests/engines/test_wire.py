"""`smg.backends.grpc.wire` against a real gRPC server (grpcio's, over loopback): the HTTP/2
and gRPC behaviour the Generate stream relies on, at the edges the scripted engine never
reaches — flow control both ways, messages split and joined across frames, compression,
stream limits, statuses in trailers and trailers-only, cancellation, a server going away."""

from __future__ import annotations

import asyncio
import gc
import json
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
import hpack
import pytest

from smg.backends.grpc import wire
from smg.backends.grpc.types import EngineError

PATH = "/test.Stream/Run"

Handler = Callable[[bytes, grpc.aio.ServicerContext], AsyncIterator[bytes]]


class Server:
    """A grpcio server whose one server-streaming method runs `handler` on the raw request."""

    def __init__(self, handler: Handler, options: list[tuple[str, Any]] | None = None, **kwargs: Any) -> None:
        self.handler = handler
        self.cancelled: list[bytes] = []
        self.metadata: list[dict[str, str]] = []
        self.server = grpc.aio.server(options=options or [], **kwargs)

        async def run(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
            self.metadata.append({k: str(v) for k, v in context.invocation_metadata() or ()})
            try:
                async for message in self.handler(request, context):
                    yield message
            except asyncio.CancelledError:
                self.cancelled.append(request)
                raise

        method = grpc.unary_stream_rpc_method_handler(run)  # no (de)serializers: bytes both ways
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler("test.Stream", {"Run": method}),))
        self.port = self.server.add_insecure_port("127.0.0.1:0")

    async def __aenter__(self) -> Server:
        await self.server.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.server.stop(None)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"


async def collect(channel: wire.Channel, request: bytes, metadata: tuple[tuple[str, str], ...] = ()) -> list[bytes]:
    stream = await channel.stream(PATH, request, metadata)
    out = []
    while (message := await stream.read()) is not None:
        out.append(message)
    return out


def spec_of(request: bytes) -> dict[str, Any]:
    return dict(json.loads(request[: request.index(b"\n")] if b"\n" in request else request))


async def echo_sizes(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
    """Answers one message per size the request's JSON head asks for, each filled with its index."""
    spec = spec_of(request)
    yield str(len(request)).encode()
    for i, size in enumerate(spec.get("sizes", [])):
        yield bytes([i % 251]) * size
        if spec.get("pause"):
            await asyncio.sleep(spec["pause"])


async def test_small_and_large_messages_in_both_directions() -> None:
    # A request past the peer's 64 KiB default windows must wait for its WINDOW_UPDATEs; answers
    # past a frame (16 KiB), past this side's stream window (4 MiB) and tiny ones in between
    # must come out whole and in order.
    sizes = [0, 1, 5, 16_384, 70_000, 1, 5 * 1024 * 1024, 3]
    head = json.dumps({"sizes": sizes}).encode() + b"\n"
    request = head + b"x" * (3 * 1024 * 1024)
    async with Server(echo_sizes, options=[("grpc.max_receive_message_length", 64 << 20)]) as server:
        channel = wire.Channel(server.target)
        try:
            answers = await collect(channel, request)
        finally:
            channel.close()
    assert answers[0] == str(len(request)).encode()
    assert [len(a) for a in answers[1:]] == sizes
    assert all(a == bytes([i % 251]) * len(a) for i, a in enumerate(answers[1:]))


async def test_many_streams_at_once_over_one_connection_beyond_the_servers_stream_limit() -> None:
    async with Server(echo_sizes, options=[("grpc.max_concurrent_streams", 2)]) as server:
        channel = wire.Channel(server.target)
        try:
            results = await asyncio.gather(
                *(collect(channel, json.dumps({"sizes": [n] * 20, "pause": 0.001}).encode()) for n in range(12))
            )
            connection = await channel.connection()
        finally:
            channel.close()
    assert [[len(m) for m in r[1:]] for r in results] == [[n] * 20 for n in range(12)]
    assert connection.peer_max_streams == 2


async def test_compressed_answers_are_decompressed() -> None:
    async with Server(echo_sizes, compression=grpc.Compression.Gzip) as server:
        channel = wire.Channel(server.target)
        try:
            answers = await collect(channel, json.dumps({"sizes": [10, 100_000]}).encode())
        finally:
            channel.close()
    assert [len(a) for a in answers[1:]] == [10, 100_000]


async def test_a_status_in_the_trailers_and_a_trailers_only_refusal() -> None:
    async def fail_after_two(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if request == b"refuse":
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "prompt too long: 5 > 4 ✗ 100%")
        if request == b"fine":
            yield b"fine"
            return
        yield b"one"
        yield b"two"
        await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "out of KV cache")

    async with Server(fail_after_two) as server:
        channel = wire.Channel(server.target)
        try:
            stream = await channel.stream(PATH, b"go")
            assert await stream.read() == b"one"
            assert await stream.read() == b"two"
            with pytest.raises(EngineError) as failed:
                await stream.read()
            assert (failed.value.code, failed.value.message) == ("RESOURCE_EXHAUSTED", "out of KV cache")
            with pytest.raises(EngineError) as refused:
                await collect(channel, b"refuse")
            assert refused.value.code == "INVALID_ARGUMENT"
            assert refused.value.message == "prompt too long: 5 > 4 ✗ 100%"
            assert await collect(channel, b"fine") == [b"fine"]  # the connection still serves
        finally:
            channel.close()


async def test_metadata_reaches_the_server() -> None:
    async with Server(echo_sizes) as server:
        channel = wire.Channel(server.target)
        try:
            trace = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            await collect(channel, b"{}", (("traceparent", trace),))
        finally:
            channel.close()
    assert server.metadata[-1]["traceparent"] == trace


async def _until(condition: Callable[[], bool]) -> None:
    for _ in range(500):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached")


async def test_a_reader_that_leaves_cancels_the_call_on_the_server() -> None:
    async def forever(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        while True:
            yield b"tick"
            await asyncio.sleep(0.005)

    async with Server(forever) as server:
        channel = wire.Channel(server.target)
        try:
            stream = await channel.stream(PATH, b"leave early")
            assert await stream.read() == b"tick"
            stream.cancel()
            await _until(lambda: server.cancelled == [b"leave early"])
            assert not (await channel.connection()).streams
            with pytest.raises(EngineError) as read_after:
                await stream.read()
            assert read_after.value.code == "CANCELLED"
        finally:
            channel.close()


async def test_a_stalled_reader_stalls_the_server_instead_of_buffering_without_bound() -> None:
    sent = 0

    async def flood(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        nonlocal sent
        for _ in range(4000):
            yield b"y" * 16_384
            sent += 1

    async with Server(flood) as server:
        channel = wire.Channel(server.target)
        try:
            stream = await channel.stream(PATH, b"")
            assert await stream.read() is not None
            await asyncio.sleep(0.5)  # the reader stops; 4000 × 16 KiB is 64 MiB
            held = sent
            assert held * 16_384 < 3 * wire.STREAM_WINDOW, held
            count = 1
            while await stream.read() is not None:  # and once it reads again, all of it arrives
                count += 1
            assert count == 4000
        finally:
            channel.close()


async def test_the_server_going_away_fails_streams_in_flight_and_nothing_listening_is_unavailable() -> None:
    async def slow(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for _ in range(1000):
            yield b"z"
            await asyncio.sleep(0.01)

    server = Server(slow)
    await server.server.start()
    channel = wire.Channel(server.target)
    try:
        stream = await channel.stream(PATH, b"")
        assert await stream.read() == b"z"
        await server.server.stop(None)  # no grace: in-flight calls are cut
        with pytest.raises(EngineError) as cut:
            while await stream.read() is not None:
                pass
        assert cut.value.code in ("UNAVAILABLE", "CANCELLED"), cut.value
        with pytest.raises(EngineError) as gone:
            await collect(channel, b"")
        assert gone.value.code == "UNAVAILABLE"
    finally:
        channel.close()


async def test_a_graceful_stop_lets_the_stream_in_flight_finish() -> None:
    async def short(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        for i in range(20):
            yield str(i).encode()
            await asyncio.sleep(0.01)

    server = Server(short)
    await server.server.start()
    channel = wire.Channel(server.target)
    try:
        stream = await channel.stream(PATH, b"")
        assert await stream.read() == b"0"
        stopping: Awaitable[None] = server.server.stop(5.0)  # GOAWAY, then a grace period
        rest = []
        while (message := await stream.read()) is not None:
            rest.append(message)
        assert rest == [str(i).encode() for i in range(1, 20)]
        await stopping
    finally:
        channel.close()


def test_status_names() -> None:
    assert [wire.status_name(v) for v in ("0", "3", "14", "16", "17", "x", None)] == [
        "OK",
        "INVALID_ARGUMENT",
        "UNAVAILABLE",
        "UNAUTHENTICATED",
        "UNKNOWN",
        "UNKNOWN",
        "UNKNOWN",
    ]


# -- a hand-written HTTP/2 server, for what grpcio will not do on cue --------------------------

FRAME = struct.Struct(">HBBBL")
GRPC_OK = [(":status", "200"), ("content-type", "application/grpc")]


class Peer:
    """One accepted HTTP/2 connection, read and written a frame at a time by the test."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.encoder = hpack.Encoder()
        self.decoder = hpack.Decoder()
        self.seen: list[tuple[int, int, int, bytes]] = []  # every frame the client sent

    def send(self, kind: int, flags: int, stream_id: int, payload: bytes = b"") -> None:
        n = len(payload)
        self.writer.write(FRAME.pack(n >> 8, n & 0xFF, kind, flags, stream_id) + payload)

    def settings(self, *pairs: tuple[int, int]) -> None:
        self.send(wire.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in pairs))

    def headers(self, stream_id: int, fields: list[tuple[str, str]], *, end_stream: bool = False) -> None:
        flags = wire.END_HEADERS | (wire.END_STREAM if end_stream else 0)
        self.send(wire.HEADERS, flags, stream_id, self.encoder.encode(fields))

    def message(self, stream_id: int, message: bytes) -> None:
        self.send(wire.DATA, 0, stream_id, b"\x00" + len(message).to_bytes(4, "big") + message)

    async def frame(self) -> tuple[int, int, int, bytes]:
        """The client's next frame (a header block's fields decoded, to keep HPACK in step)."""
        hi, lo, kind, flags, stream_id = FRAME.unpack(await self.reader.readexactly(9))
        payload = await self.reader.readexactly((hi << 8) | lo)
        if kind == wire.HEADERS:
            self.decoder.decode(payload)
        frame = (kind, flags, stream_id, payload)
        self.seen.append(frame)
        return frame

    async def until(self, kind: int, stream_id: int | None = None) -> tuple[int, int, int, bytes]:
        while True:
            frame = await self.frame()
            if frame[0] == kind and stream_id in (None, frame[2]):
                return frame

    def kinds(self, stream_id: int) -> list[int]:
        return [kind for kind, _, sid, _ in self.seen if sid == stream_id]

    async def closed(self) -> bool:
        """Whether the client closes the connection (reading on until it does)."""
        try:
            while True:
                await self.frame()
        except asyncio.IncompleteReadError:
            return True


class RawServer:
    """Accepts HTTP/2 connections on loopback and hands each to the test as a `Peer`; the
    client's preface is read, nothing is sent until the test says so."""

    def __init__(self) -> None:
        self.peers: asyncio.Queue[Peer] = asyncio.Queue()
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> RawServer:
        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.readexactly(24)
            await self.peers.put(Peer(reader, writer))

        self.server = await asyncio.start_server(accept, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()
        while not self.peers.empty():
            self.peers.get_nowait().writer.close()

    @property
    def target(self) -> str:
        assert self.server is not None
        return f"127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def peer(self, *settings: tuple[int, int]) -> Peer:
        """The next connection, its SETTINGS exchanged (`settings` are the server's)."""
        peer = await self.peers.get()
        peer.settings(*settings)
        await peer.until(wire.SETTINGS)
        return peer


async def settled(channel: wire.Channel, server: RawServer, *settings: tuple[int, int]) -> Peer:
    """Connect `channel` to `server`; the server's side of it."""
    connecting = asyncio.ensure_future(channel.connection())
    peer = await server.peer(*settings)
    await connecting
    return peer


def hang_guard(awaitable: Awaitable[Any]) -> Awaitable[Any]:
    """`awaitable`, failing the test instead of hanging it when the client never finishes."""
    return asyncio.wait_for(awaitable, 10)


def grpc_status(code: int, message: str = "") -> list[tuple[str, str]]:
    return [("grpc-status", str(code))] + ([("grpc-message", message)] if message else [])


async def test_an_answer_that_ends_while_the_request_waits_for_window_ends_the_call() -> None:
    # The engine answers (trailers-only, then RST_STREAM NO_ERROR as grpc-core does) before it
    # has read the whole request, which waits for stream window that will never come.
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server, (wire.SETTINGS_INITIAL_WINDOW_SIZE, 1000))
            opening = asyncio.ensure_future(channel.stream(PATH, b"r" * 5000))
            await peer.until(wire.DATA, 1)
            peer.headers(1, GRPC_OK + grpc_status(8, "request too large"), end_stream=True)
            peer.send(wire.RST_STREAM, 0, 1, struct.pack(">L", wire.NO_ERROR))
            with pytest.raises(EngineError) as failed:  # from the start of the call or its first read
                call = await hang_guard(opening)
                await call.read()
            assert (failed.value.code, failed.value.message) == ("RESOURCE_EXHAUSTED", "request too large")
        finally:
            channel.close()


async def test_a_reset_while_the_request_waits_for_connection_window_fails_the_call() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server, (wire.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20))
            opening = asyncio.ensure_future(channel.stream(PATH, b"r" * 100_000))
            received = 0
            while received < 65_535:  # the connection's default window, never given back
                received += len((await peer.until(wire.DATA, 1))[3])
            peer.send(wire.RST_STREAM, 0, 1, struct.pack(">L", 0x2))  # INTERNAL_ERROR
            with pytest.raises(EngineError) as failed:
                await hang_guard(opening)
            assert failed.value.code == "INTERNAL"
        finally:
            channel.close()


async def test_a_reset_from_the_engine_is_not_answered_with_a_reset() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server)
            call = await channel.stream(PATH, b"go")
            peer.headers(1, GRPC_OK)
            peer.message(1, b"one")
            peer.send(wire.RST_STREAM, 0, 1, struct.pack(">L", wire.CANCEL))
            peer.send(wire.PING, 0, 0, b"12345678")
            await peer.until(wire.PING)  # the client has handled the reset by its answer to this
            assert await call.read() == b"one"
            with pytest.raises(EngineError) as failed:
                await call.read()
            assert failed.value.code == "CANCELLED"
            assert wire.RST_STREAM not in peer.kinds(1)
        finally:
            channel.close()


@pytest.mark.parametrize(
    "frames, code",
    [
        pytest.param(
            [(wire.WINDOW_UPDATE, 0, struct.pack(">L", (1 << 31) - 1))], wire.FLOW_CONTROL_ERROR, id="overflow"
        ),
        pytest.param([(wire.WINDOW_UPDATE, 0, struct.pack(">L", 0))], wire.PROTOCOL_ERROR, id="zero increment"),
        pytest.param(
            [
                # the stream's window (65,535 less the 7 bytes of the request) at the top
                (wire.WINDOW_UPDATE, 1, struct.pack(">L", (1 << 31) - 1 - (65_535 - 7))),
                (wire.SETTINGS, 0, struct.pack(">HL", wire.SETTINGS_INITIAL_WINDOW_SIZE, 65_536)),  # and one past
            ],
            wire.FLOW_CONTROL_ERROR,
            id="initial window change past the top",
        ),
        pytest.param([(wire.PING, 0, b"short")], 0x6, id="ping of the wrong size"),
    ],
)
async def test_a_connection_flow_control_or_frame_error_from_the_engine_ends_the_connection(
    frames: list[tuple[int, int, bytes]], code: int
) -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server)
            call = await channel.stream(PATH, b"go")
            peer.headers(1, GRPC_OK)
            for kind, stream_id, payload in frames:
                peer.send(kind, 0, stream_id, payload)
            goaway = await hang_guard(peer.until(wire.GOAWAY, 0))
            assert struct.unpack(">L", goaway[3][4:8])[0] == code
            with pytest.raises(EngineError) as failed:
                await call.read()
            assert failed.value.code == "UNAVAILABLE"
        finally:
            channel.close()


@pytest.mark.parametrize(
    "frames, code, status",
    [
        pytest.param([(wire.WINDOW_UPDATE, struct.pack(">L", (1 << 31) - 1))], 0x3, "INTERNAL", id="overflow"),
        pytest.param([(wire.WINDOW_UPDATE, struct.pack(">L", 0))], 0x1, "INTERNAL", id="zero increment"),
        pytest.param(
            # unread messages, well past what the window and the credit given back allow
            [(wire.DATA, b"\x00" + (16_379).to_bytes(4, "big") + bytes(16_379))] * (2 * wire.STREAM_WINDOW // 16_384),
            0x3,
            "INTERNAL",
            id="data past window",
        ),
    ],
)
async def test_a_stream_flow_control_error_from_the_engine_resets_only_that_stream(
    frames: list[tuple[int, bytes]], code: int, status: str
) -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server)
            peer.send(wire.SETTINGS, wire.ACK, 0)  # the client's 4 MiB stream window is in force
            call = await channel.stream(PATH, b"go")
            peer.headers(1, GRPC_OK)
            for kind, payload in frames:
                peer.send(kind, 0, 1, payload)
            reset = await hang_guard(peer.until(wire.RST_STREAM, 1))
            assert struct.unpack(">L", reset[3])[0] == code
            with pytest.raises(EngineError) as failed:
                while await call.read() is not None:
                    pass
            assert failed.value.code == status
            peer.send(wire.PING, 0, 0, b"still up")
            assert (await peer.until(wire.PING))[3] == b"still up"
        finally:
            channel.close()


@pytest.mark.parametrize(
    "setting, code",
    [
        pytest.param((wire.SETTINGS_MAX_FRAME_SIZE, 16_383), wire.PROTOCOL_ERROR, id="frame size too small"),
        pytest.param((wire.SETTINGS_MAX_FRAME_SIZE, 1 << 24), wire.PROTOCOL_ERROR, id="frame size too large"),
        pytest.param((wire.SETTINGS_ENABLE_PUSH, 1), wire.PROTOCOL_ERROR, id="push from a server"),
        pytest.param((wire.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 31), wire.FLOW_CONTROL_ERROR, id="window too large"),
    ],
)
async def test_settings_out_of_range_are_a_connection_error(setting: tuple[int, int], code: int) -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            connecting = asyncio.ensure_future(channel.stream(PATH, b"go"))
            peer = await server.peer(setting)
            goaway = await hang_guard(peer.until(wire.GOAWAY, 0))
            assert struct.unpack(">L", goaway[3][4:8])[0] == code
            with pytest.raises(EngineError) as failed:
                await connecting
            assert failed.value.code == "UNAVAILABLE"
        finally:
            channel.close()


async def test_a_frame_larger_than_this_side_allows_is_a_connection_error_not_buffered() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server)
            call = await channel.stream(PATH, b"go")
            peer.headers(1, GRPC_OK)
            length = (1 << 20) + 1  # past the 1 MiB SETTINGS_MAX_FRAME_SIZE the client announced
            peer.writer.write(FRAME.pack(length >> 8, length & 0xFF, wire.DATA, 0, 1) + bytes(100))
            goaway = await hang_guard(peer.until(wire.GOAWAY, 0))
            assert struct.unpack(">L", goaway[3][4:8])[0] == 0x6  # FRAME_SIZE_ERROR
            with pytest.raises(EngineError) as failed:
                await call.read()
            assert failed.value.code == "UNAVAILABLE"
        finally:
            channel.close()


async def test_trailers_past_the_header_list_limit_fail_only_their_stream() -> None:
    async def long_error(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        if request == b"long":
            await context.abort(grpc.StatusCode.INTERNAL, "e" * 100_000)
        yield b"fine"

    async with Server(long_error) as server:
        channel = wire.Channel(server.target)
        try:
            other = await channel.stream(PATH, b"other")
            with pytest.raises(EngineError) as failed:
                await collect(channel, b"long")
            assert failed.value.code == "RESOURCE_EXHAUSTED"
            assert await other.read() == b"fine"  # the connection, its HPACK state in step, serves on
            assert await other.read() is None
            assert await collect(channel, b"again") == [b"fine"]
        finally:
            channel.close()


async def test_a_caller_cancelled_while_its_request_waits_for_window_resets_the_stream() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server, (wire.SETTINGS_INITIAL_WINDOW_SIZE, 1000))
            opening = asyncio.ensure_future(channel.stream(PATH, b"r" * 5000))
            await peer.until(wire.DATA, 1)
            opening.cancel()
            reset = await hang_guard(peer.until(wire.RST_STREAM, 1))
            assert struct.unpack(">L", reset[3])[0] == wire.CANCEL
            assert opening.cancelled()
            assert not (await channel.connection()).streams
        finally:
            channel.close()


async def test_a_caller_cancelled_as_it_is_given_a_stream_slot_passes_the_slot_on() -> None:
    async def forever(request: bytes, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        while True:
            yield request
            await asyncio.sleep(0.01)

    async with Server(forever, options=[("grpc.max_concurrent_streams", 1)]) as server:
        channel = wire.Channel(server.target)
        try:
            first = await channel.stream(PATH, b"first")
            assert await first.read() == b"first"
            connection = await channel.connection()
            second = asyncio.ensure_future(channel.stream(PATH, b"second"))
            third = asyncio.ensure_future(channel.stream(PATH, b"third"))
            await _until(lambda: len(connection.slot_waiters) == 2)
            first.cancel()  # frees the slot for `second`, which is cancelled before it can take it
            second.cancel()
            call = await hang_guard(third)
            assert await call.read() == b"third"
            call.cancel()
        finally:
            channel.close()


async def test_a_connection_out_of_stream_ids_sends_the_next_call_on_a_new_one() -> None:
    async with Server(echo_sizes) as server:
        channel = wire.Channel(server.target)
        try:
            old = await channel.connection()
            old.next_id = (1 << 31) - 1  # the last stream id a client may use
            assert (await collect(channel, b"{}"))[0] == b"2"
            assert (await collect(channel, b"{}"))[0] == b"2"
            assert await channel.connection() is not old
        finally:
            channel.close()


async def test_a_goaway_on_an_idle_connection_closes_it() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server)
            peer.send(wire.GOAWAY, 0, 0, struct.pack(">LL", 0, wire.NO_ERROR))
            assert await hang_guard(peer.closed())
        finally:
            channel.close()


async def test_a_caller_cancelled_while_connecting_leaves_no_unretrieved_failure() -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    try:
        async with RawServer() as server:  # accepts, and never sends SETTINGS
            channel = wire.Channel(server.target, connect_timeout=0.2)
            caller = asyncio.ensure_future(channel.connection())
            peer = await server.peers.get()
            caller.cancel()
            assert await hang_guard(peer.closed())  # the connect gave up on its own
            for _ in range(5):
                await asyncio.sleep(0)
            del caller
            gc.collect()
            with pytest.raises(EngineError) as failed:  # and the next caller connects afresh
                await channel.connection()
            assert "no HTTP/2 SETTINGS" in failed.value.message
            assert await hang_guard(server.peers.get())
    finally:
        loop.set_exception_handler(None)
    assert reported == []


async def test_a_channel_closed_while_connecting_keeps_no_connection_open() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        caller = asyncio.ensure_future(channel.stream(PATH, b"go"))
        peer = await server.peers.get()
        channel.close()
        peer.settings()
        with pytest.raises(EngineError) as failed:
            await hang_guard(caller)
        assert failed.value.code == "UNAVAILABLE"
        assert await hang_guard(peer.closed())
