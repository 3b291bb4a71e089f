"""The engine protocol clients: one `EngineClient` per gRPC engine runtime, chosen by name.

`connect(runtime, target)` gives the client for a worker; nothing is dialled until its first
call. Each module owns one protocol's request mapping and response reading; `base` owns what
they share.
"""

from __future__ import annotations

from smg.backends.grpc.engines.base import GrpcEngineClient, strip_scheme
from smg.backends.grpc.engines.mlx import MlxClient
from smg.backends.grpc.engines.sglang import SglangClient
from smg.backends.grpc.engines.tokenspeed import TokenSpeedClient
from smg.backends.grpc.engines.trtllm import TrtllmClient
from smg.backends.grpc.engines.vllm import VllmClient
from smg.backends.grpc.types import EngineClient

CLIENTS: dict[str, type[GrpcEngineClient]] = {
    "sglang": SglangClient,
    "vllm": VllmClient,
    "trtllm": TrtllmClient,
    "tokenspeed": TokenSpeedClient,
    "mlx": MlxClient,
}
RUNTIMES: tuple[str, ...] = tuple(CLIENTS)


def connect(runtime: str, target: str, *, merge_waiting: bool = True) -> EngineClient:
    """The client for the `runtime` engine at `target` (`host:port` or `grpc://host:port`).
    `merge_waiting`: Generate chunks already received when the reader gets to them are handed
    on as one (see `GrpcEngineClient.generate`); off, every engine message is a chunk of its own."""
    try:
        client_class = CLIENTS[runtime]
    except KeyError:
        raise ValueError(f"unknown gRPC engine runtime {runtime!r} (known: {', '.join(RUNTIMES)})") from None
    return client_class(strip_scheme(target), merge_waiting=merge_waiting)


__all__ = [
    "CLIENTS",
    "RUNTIMES",
    "GrpcEngineClient",
    "MlxClient",
    "SglangClient",
    "TokenSpeedClient",
    "TrtllmClient",
    "VllmClient",
    "connect",
]
