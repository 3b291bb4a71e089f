"""Which engine protocol a gRPC worker speaks, found by asking it.

As the reference gateway does (its `detect_backend` step), each protocol's own `HealthCheck` is
called in turn: SGLang, vLLM, TensorRT-LLM, TokenSpeed, MLX. Every engine registers its service
under its own name, so a server answers `UNIMPLEMENTED` for the services it does not have and
the first that answers otherwise names the runtime. Server reflection is not used: the engines'
servers may run without it.

The probes share one channel to the target, closed whatever happens, and one deadline.
`UNAVAILABLE` (nothing listens, or not gRPC) ends the detection at once: the caller retries on
its own schedule rather than this waiting for an engine to come up.
"""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio

from smg.backends.grpc.engines import CLIENTS
from smg.backends.grpc.engines.base import CHANNEL_OPTIONS, engine_error, strip_scheme
from smg.backends.grpc.types import EngineError

# The reference gateway's order: the most common engines first.
PROBE_ORDER: tuple[str, ...] = ("sglang", "vllm", "trtllm", "tokenspeed", "mlx")


def service_name(runtime: str) -> str:
    """The full gRPC service name of `runtime`'s engine protocol."""
    services = CLIENTS[runtime].pb.DESCRIPTOR.services_by_name
    return ", ".join(service.full_name for service in services.values())


async def detect_runtime(target: str, *, timeout: float = 5.0) -> str:
    """The runtime (one of `engines.RUNTIMES`) whose engine service answers at `target`
    (`host:port` or `grpc://host:port`), within `timeout` seconds in all.

    Raises `EngineError`: `UNAVAILABLE` when nothing (or no gRPC server) listens,
    `DEADLINE_EXCEEDED` when the server does not answer in time, `UNIMPLEMENTED` when it
    serves none of the engine protocols.
    """
    address = strip_scheme(target)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    try:
        for runtime in PROBE_ORDER:
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise EngineError("DEADLINE_EXCEEDED", f"{address} did not answer within {timeout:g}s")
            try:
                await CLIENTS[runtime](address).health_call(channel, remaining)
            except grpc.aio.AioRpcError as exc:
                error = engine_error(exc)
                if error.code == "UNIMPLEMENTED":
                    continue
                if error.code in ("UNAVAILABLE", "CANCELLED"):
                    raise EngineError(error.code, f"nothing answers gRPC at {address}: {error.message}") from None
                if error.code == "DEADLINE_EXCEEDED":
                    raise EngineError(
                        error.code, f"{address} did not answer {runtime}'s HealthCheck within {timeout:g}s"
                    ) from None
                # Any other status comes from the method's own handler: the service is there,
                # unwell perhaps, which the health checks that follow detection will tell.
            return runtime
    finally:
        await channel.close()
    tried = "; ".join(f"{runtime} ({service_name(runtime)})" for runtime in PROBE_ORDER)
    raise EngineError(
        "UNIMPLEMENTED",
        f"the gRPC server at {address} serves none of the engine protocols (tried {tried})",
    )
