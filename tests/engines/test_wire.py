"""`smg.backends.grpc.wire` against a real gRPC server (grpcio's, over loopback): the HTTP/2
and gRPC behaviour the Generate stream relies on, at the edges the scripted engine never
reaches — flow control both ways, messages split and joined across frames, compression,
stream limits, statuses in trailers and trailers-only, cancellation, a server going away."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
import grpc.aio
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
