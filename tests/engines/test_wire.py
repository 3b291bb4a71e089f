"""`smg.backends.grpc.wire`, the asyncio transport over `http2`'s sans-IO protocol, over loopback:
against a real grpcio server (flow control both ways with a real peer, large messages,
compression, stream limits, statuses, cancellation, a server going away or cut), against the
scripted engine (many Generate streams at once, a cancel the engine sees), and against a
hand-framed HTTP/2 peer for the waits only the transport has (send window, connecting, a
socket closed once the protocol is done with it). The protocol's rules themselves are tested
without sockets in `test_http2.py`."""

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

from smg.backends.grpc import http2, wire
from smg.backends.grpc.engines import connect
from smg.backends.grpc.types import EngineError, GenerateCall
from tests.engines.conftest import EngineUnderTest

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
    assert connection.protocol.peer_max_streams == 2


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
            assert not (await channel.connection()).protocol.streams
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
            assert held * 16_384 < 3 * http2.STREAM_WINDOW, held
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


# -- the scripted engine ------------------------------------------------------------------------


def _generate(client: Any, rid: str, tokens: int) -> bytes:
    call = GenerateCall(request_id=rid, input_ids=[1, 2, 3], max_tokens=tokens)
    return bytes(client.generate_request(call).SerializeToString())


async def test_many_generate_streams_at_once_from_the_scripted_engine(sglang: EngineUnderTest) -> None:
    sglang.control.script(default={"token_ids": list(range(100, 140)), "eos": False, "chunk_size": 1})
    client: Any = connect("sglang", sglang.url)
    path, parse = wire.method_path(client.pb, "Generate")
    channel = wire.Channel(client.target)

    async def one(i: int) -> list[Any]:
        stream = await channel.stream(path, _generate(client, f"r{i}", 40))
        return [parse(m) async for m in _messages(stream)]

    try:
        answers = await asyncio.gather(*(one(i) for i in range(24)))
    finally:
        channel.close()
        await client.close()
    for i, answer in enumerate(answers):
        assert [m.WhichOneof("response") for m in answer] == ["chunk"] * 40 + ["complete"], i
        assert [t for m in answer[:-1] for t in m.chunk.token_ids] == list(range(100, 140))
        assert {m.request_id for m in answer} == {f"r{i}"}


async def test_a_generate_stream_left_early_is_cancelled_on_the_scripted_engine(sglang: EngineUnderTest) -> None:
    sglang.control.script(default={"token_ids": list(range(100, 140)), "eos": False, "chunk_size": 1, "hold_after": 3})
    client: Any = connect("sglang", sglang.url)
    path, parse = wire.method_path(client.pb, "Generate")
    channel = wire.Channel(client.target)
    try:
        stream = await channel.stream(path, _generate(client, "leaves", 40))
        for _ in range(3):
            message = await stream.read()
            assert message is not None and parse(message).WhichOneof("response") == "chunk"
        stream.cancel()
        await _until(lambda: sglang.control.cancelled() == ["leaves"])
        again = await channel.stream(path, _generate(client, "after", 2))  # the connection serves on
        sglang.control.release()
        assert len([m async for m in _messages(again)]) >= 2
    finally:
        channel.close()
        await client.close()


async def _messages(stream: wire.Call) -> AsyncIterator[bytes]:
    while (message := await stream.read()) is not None:
        yield message


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
        self.send(http2.SETTINGS, 0, 0, b"".join(struct.pack(">HL", k, v) for k, v in pairs))

    def headers(self, stream_id: int, fields: list[tuple[str, str]], *, end_stream: bool = False) -> None:
        flags = http2.END_HEADERS | (http2.END_STREAM if end_stream else 0)
        self.send(http2.HEADERS, flags, stream_id, self.encoder.encode(fields))

    def message(self, stream_id: int, message: bytes) -> None:
        self.send(http2.DATA, 0, stream_id, b"\x00" + len(message).to_bytes(4, "big") + message)

    async def frame(self) -> tuple[int, int, int, bytes]:
        """The client's next frame (a header block's fields decoded, to keep HPACK in step)."""
        hi, lo, kind, flags, stream_id = FRAME.unpack(await self.reader.readexactly(9))
        payload = await self.reader.readexactly((hi << 8) | lo)
        if kind == http2.HEADERS:
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
        await peer.until(http2.SETTINGS)
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
            peer = await settled(channel, server, (http2.SETTINGS_INITIAL_WINDOW_SIZE, 1000))
            opening = asyncio.ensure_future(channel.stream(PATH, b"r" * 5000))
            await peer.until(http2.DATA, 1)
            peer.headers(1, GRPC_OK + grpc_status(8, "request too large"), end_stream=True)
            peer.send(http2.RST_STREAM, 0, 1, struct.pack(">L", http2.NO_ERROR))
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
            peer = await settled(channel, server, (http2.SETTINGS_INITIAL_WINDOW_SIZE, 1 << 20))
            opening = asyncio.ensure_future(channel.stream(PATH, b"r" * 100_000))
            received = 0
            while received < 65_535:  # the connection's default window, never given back
                received += len((await peer.until(http2.DATA, 1))[3])
            peer.send(http2.RST_STREAM, 0, 1, struct.pack(">L", 0x2))  # INTERNAL_ERROR
            with pytest.raises(EngineError) as failed:
                await hang_guard(opening)
            assert failed.value.code == "INTERNAL"
        finally:
            channel.close()


async def test_a_protocol_error_from_the_engine_sends_goaway_closes_the_socket_and_fails_the_call() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server)
            call = await channel.stream(PATH, b"go")
            peer.headers(1, GRPC_OK)
            peer.send(http2.PING, 0, 0, b"short")
            goaway = await hang_guard(peer.until(http2.GOAWAY, 0))
            assert struct.unpack(">L", goaway[3][4:8])[0] == http2.FRAME_SIZE_ERROR
            assert await hang_guard(peer.closed())
            with pytest.raises(EngineError) as failed:
                await call.read()
            assert failed.value.code == "UNAVAILABLE"
        finally:
            channel.close()


async def test_a_caller_cancelled_while_its_request_waits_for_window_resets_the_stream() -> None:
    async with RawServer() as server:
        channel = wire.Channel(server.target)
        try:
            peer = await settled(channel, server, (http2.SETTINGS_INITIAL_WINDOW_SIZE, 1000))
            opening = asyncio.ensure_future(channel.stream(PATH, b"r" * 5000))
            await peer.until(http2.DATA, 1)
            opening.cancel()
            reset = await hang_guard(peer.until(http2.RST_STREAM, 1))
            assert struct.unpack(">L", reset[3])[0] == http2.CANCEL
            assert opening.cancelled()
            assert not (await channel.connection()).protocol.streams
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
            old.protocol.next_id = (1 << 31) - 1  # the last stream id a client may use
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
            peer.send(http2.GOAWAY, 0, 0, struct.pack(">LL", 0, http2.NO_ERROR))
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
