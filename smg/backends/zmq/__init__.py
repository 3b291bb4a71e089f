"""ZMQ workers (`ipc://PATH`): vLLM's EngineCore (or TokenSpeed) over its own ZMQ wire, no servicer between.

`addresses` derives where the sockets are, `wire` owns vLLM's msgpack messages and the handshake,
`tokenspeed` TokenSpeed's, `transport` the
sockets, the handshake and engine deaths, `client` presents it all as an `EngineClient`, so the
engine connector (`smg.backends.grpc.backend`) serves these workers with the same pipeline.
The client is imported on first use: checking a worker URL (`addresses`) needs neither ZMQ nor
the engine pipeline, and a gateway without ZMQ workers never loads them.
"""

from typing import Any

__all__ = ["ZMQ_RUNTIMES", "ZmqEngineClient"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from smg.backends.zmq import client

        return getattr(client, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
