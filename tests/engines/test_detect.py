"""Runtime detection over loopback: the scripted engine in each of the five protocols, nothing
listening, a gRPC server that speaks none of them, and servers built here to show the probe
order and what an answer other than `UNIMPLEMENTED` means."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import grpc.aio
import pytest
from smg_grpc_proto.generated import (
    mlx_engine_pb2,
    mlx_engine_pb2_grpc,
    sglang_scheduler_pb2_grpc,
    tokenspeed_scheduler_pb2_grpc,
    vllm_engine_pb2,
    vllm_engine_pb2_grpc,
)

from smg.backends.grpc.engines import RUNTIMES
from smg.backends.grpc.engines.detect import PROBE_ORDER, detect_runtime
from smg.backends.grpc.types import EngineError
from tests.engines.conftest import EngineUnderTest
from tools.spawn import free_port

SERVICES = (
    "sglang.grpc.scheduler.SglangScheduler",
    "vllm.grpc.engine.VllmEngine",
    "trtllm.TrtllmService",
    "tokenspeed.grpc.scheduler.TokenSpeedScheduler",
    "mlx.grpc.engine.MlxEngine",
)


async def test_each_runtime_is_detected(engine: EngineUnderTest) -> None:
    assert await detect_runtime(engine.url) == engine.runtime


async def test_a_bare_host_and_port_will_do(engine: EngineUnderTest) -> None:
    assert await detect_runtime(engine.url.removeprefix("grpc://")) == engine.runtime


def test_every_runtime_is_probed_in_the_reference_order() -> None:
    assert PROBE_ORDER == ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")
    assert set(PROBE_ORDER) == set(RUNTIMES)


async def test_nothing_listening_fails_at_once() -> None:
    # A deadline far longer than any test: the error must come from the refused connection.
    with pytest.raises(EngineError) as caught:
        await detect_runtime(f"grpc://127.0.0.1:{free_port()}", timeout=600.0)
    assert caught.value.code == "UNAVAILABLE" and caught.value.unavailable
    assert "nothing answers gRPC at 127.0.0.1:" in caught.value.message


@pytest.fixture
async def serve() -> AsyncIterator[Callable[..., Any]]:
    """Start an in-test gRPC server on loopback with the given services; stopped afterwards."""
    servers: list[grpc.aio.Server] = []

    async def start(*services: tuple[Callable[[Any, grpc.aio.Server], None], Any]) -> str:
        server = grpc.aio.server()
        for add, servicer in services:
            add(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return f"grpc://127.0.0.1:{port}"

    yield start
    for server in servers:
        await server.stop(grace=None)


async def test_a_server_without_engine_services_is_named_plainly(serve: Callable[..., Any]) -> None:
    url = await serve()
    with pytest.raises(EngineError) as caught:
        await detect_runtime(url, timeout=600.0)
    assert caught.value.code == "UNIMPLEMENTED" and not caught.value.unavailable
    assert "serves none of the engine protocols" in caught.value.message
    assert all(service in caught.value.message for service in SERVICES)


class _HealthyVllm(vllm_engine_pb2_grpc.VllmEngineServicer):
    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return vllm_engine_pb2.HealthCheckResponse(healthy=True, message="Health")


class _HealthyMlx(mlx_engine_pb2_grpc.MlxEngineServicer):
    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        return mlx_engine_pb2.HealthCheckResponse(healthy=True, message="OK")


class _FailingTokenSpeed(tokenspeed_scheduler_pb2_grpc.TokenSpeedSchedulerServicer):
    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await context.abort(grpc.StatusCode.INTERNAL, "scheduler not ready")


class _SilentSglang(sglang_scheduler_pb2_grpc.SglangSchedulerServicer):
    async def HealthCheck(self, request: Any, context: grpc.aio.ServicerContext) -> Any:  # noqa: N802
        await asyncio.Event().wait()


async def test_the_first_service_in_probe_order_wins(serve: Callable[..., Any]) -> None:
    url = await serve(
        (mlx_engine_pb2_grpc.add_MlxEngineServicer_to_server, _HealthyMlx()),
        (vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server, _HealthyVllm()),
    )
    assert await detect_runtime(url) == "vllm"


async def test_a_service_whose_health_check_fails_is_still_that_service(serve: Callable[..., Any]) -> None:
    # The method's own handler answered: the service is there, unwell; health checks say so later.
    url = await serve(
        (tokenspeed_scheduler_pb2_grpc.add_TokenSpeedSchedulerServicer_to_server, _FailingTokenSpeed()),
        (mlx_engine_pb2_grpc.add_MlxEngineServicer_to_server, _HealthyMlx()),
    )
    assert await detect_runtime(url) == "tokenspeed"


async def test_a_server_that_never_answers_runs_out_of_time(serve: Callable[..., Any]) -> None:
    url = await serve((sglang_scheduler_pb2_grpc.add_SglangSchedulerServicer_to_server, _SilentSglang()))
    with pytest.raises(EngineError) as caught:
        await detect_runtime(url, timeout=0.5)
    assert caught.value.code == "DEADLINE_EXCEEDED"
    assert "did not answer sglang's HealthCheck within 0.5s" in caught.value.message
