"""ZMQ workers (`ipc://PATH`): vLLM's EngineCore (or TokenSpeed) over its own ZMQ wire, no servicer between.

`addresses` derives where the sockets are, `wire` owns vLLM's msgpack messages and the handshake,
`tokenspeed` TokenSpeed's, `transport` the
sockets, the handshake and engine deaths, `client` presents it all as an `EngineClient`, so the
engine connector (`smg.backends.grpc.backend`) serves these workers with the same pipeline.
"""

from smg.backends.zmq.client import ZMQ_RUNTIMES, ZmqEngineClient

__all__ = ["ZMQ_RUNTIMES", "ZmqEngineClient"]
