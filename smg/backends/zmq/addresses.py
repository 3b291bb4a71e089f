"""Where a ZMQ worker's sockets are, derived from its `ipc://PATH` URL, and the directory they live in.

The gateway binds every socket and the engine dials in: the data plane at `ipc://PATH-in.sock`
(requests, a ROUTER) and `ipc://PATH-out.sock` (outputs, a PULL), the handshake at
`tcp://127.0.0.1:PORT`, where PORT is `20000 + FNV-1a-64(PATH) % 10000`, as the reference
gateway derives it, so `vllm serve --headless --data-parallel-rpc-port PORT` pairs with it
without a side channel. The sockets carry no authentication, so their directory must be the
gateway user's own: created 0700 when missing, refused when another user owns it.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_LOOPBACK = "127.0.0.1"


def handshake_port(path: str) -> int:
    """The handshake port for a socket path (FNV-1a 64 of its bytes, into 20000..29999)."""
    value = _FNV_OFFSET
    for byte in path.encode():
        value ^= byte
        value = (value * _FNV_PRIME) & 0xFFFFFFFFFFFFFFFF
    return 20000 + value % 10000


@dataclass(frozen=True)
class ZmqAddresses:
    path: str
    handshake: str  # tcp://127.0.0.1:PORT
    inputs: str  # ipc://PATH-in.sock
    outputs: str  # ipc://PATH-out.sock


def zmq_addresses(url: str, handshake_override: str | None = None) -> ZmqAddresses:
    """The three addresses of the worker at `url` (`ipc://PATH`). Raises ValueError."""
    if not url.startswith("ipc://") or len(url) == len("ipc://"):
        raise ValueError(f"a ZMQ worker URL is ipc://PATH, got {url!r}")
    path = url[len("ipc://") :]
    if handshake_override is not None and not handshake_override.startswith("tcp://"):
        raise ValueError(f"the ZMQ handshake address must be tcp://HOST:PORT, got {handshake_override!r}")
    handshake = handshake_override or f"tcp://{_LOOPBACK}:{handshake_port(path)}"
    return ZmqAddresses(path=path, handshake=handshake, inputs=f"ipc://{path}-in.sock", outputs=f"ipc://{path}-out.sock")


def prepare_socket_dir(addresses: ZmqAddresses) -> None:
    """Create the sockets' directory (0700) or check it is the gateway user's; remove sockets a
    previous gateway left (ZMQ cannot bind over them). Raises ValueError."""
    parent = Path(addresses.path).parent
    try:
        info = os.lstat(parent)
    except FileNotFoundError:
        parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(parent)
    if not stat.S_ISDIR(info.st_mode):
        raise ValueError(f"the ipc socket directory {parent} is not a directory")
    if info.st_uid != os.geteuid():
        raise ValueError(
            f"the ipc socket directory {parent} belongs to uid {info.st_uid}, not this user ({os.geteuid()}): "
            "refusing to bind unauthenticated sockets there"
        )
    for address in (addresses.inputs, addresses.outputs):
        socket_path = Path(address[len("ipc://") :])
        try:
            mode = os.lstat(socket_path).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISSOCK(mode):
            raise ValueError(f"{socket_path} exists and is not a socket; refusing to remove it")
        socket_path.unlink()
