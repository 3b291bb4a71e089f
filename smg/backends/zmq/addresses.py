"""Where a ZMQ worker's sockets are, derived from its `ipc://PATH` URL, and the directory they live in.

The gateway binds every socket and the engine dials in: the data plane at `ipc://PATH-in.sock`
(requests, a ROUTER) and `ipc://PATH-out.sock` (outputs, a PULL), the handshake at
`tcp://127.0.0.1:PORT`, where PORT is `20000 + FNV-1a-64(PATH) % 10000`, as the reference
gateway derives it, so `vllm serve --headless --data-parallel-rpc-port PORT` pairs with it
without a side channel. The sockets carry no authentication, so their directory must be the
gateway user's own: created 0700 when missing, refused when another user owns it.

A socket path must lie under one of the directories the operator allowed (`--ipc-dir`; the
system temp dir by default, where engines such as vLLM put their own sockets): a worker URL
can name any path, and the gateway must not create directories, or bind sockets, wherever a
caller of the worker API says. Missing directories are created only below an allowed one,
never the allowed one itself. A socket file already at a path is removed only when nothing
listens on it (a connect is refused: a previous gateway's leftover); one that answers belongs to
a live process, and is never taken over.
"""

from __future__ import annotations

import errno
import os
import socket
import stat
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_LOOPBACK = "127.0.0.1"
DEFAULT_IPC_DIRS: tuple[str, ...] = (tempfile.gettempdir(),)


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


def _allowed_root(path: str, allowed_dirs: Sequence[str]) -> Path | None:
    """The allowed directory `path` lies under (symbolic links resolved), if any."""
    real = os.path.realpath(path)
    for root in allowed_dirs:
        base = os.path.realpath(root)
        if real != base and os.path.commonpath([real, base]) == base:
            return Path(base)
    return None


def socket_path_refusal(path: str, allowed_dirs: Sequence[str]) -> str | None:
    """Why `path` (an `ipc://` worker's) may not hold the gateway's sockets; None when it may."""
    if not os.path.isabs(path):
        return f"an ipc:// worker URL names an absolute path (ipc:///DIR/NAME), got {path!r}"
    if _allowed_root(path, allowed_dirs) is None:
        where = ", ".join(allowed_dirs) or "none"
        return f"ipc socket path {path} is outside the directories allowed for them (--ipc-dir: {where})"
    return None


def _listened_on(socket_path: Path) -> bool:
    """Whether a process accepts connections on the Unix socket at `socket_path` (a refused
    connect: a stale file; anything but a refusal counts as in use)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(socket_path))
        except (ConnectionRefusedError, FileNotFoundError):
            return False
        except OSError as exc:
            return exc.errno != errno.ECONNREFUSED
        return True


def _make_dirs(root: Path, directory: Path) -> None:
    """Create `directory` and its missing parents below `root`, each 0700 (`mkdir(parents=True)`
    would create the parents with the umask's mode)."""
    current = root
    for part in directory.relative_to(root).parts:
        current = current / part
        try:
            current.mkdir(mode=0o700)
        except FileExistsError:
            pass


def prepare_socket_dir(addresses: ZmqAddresses, allowed_dirs: Sequence[str] = DEFAULT_IPC_DIRS) -> None:
    """Create the sockets' directory (0700, below an allowed directory only) or check it is the
    gateway user's; remove socket files nothing listens on any more (ZMQ cannot bind over them).
    Raises ValueError, having created nothing, when the path is not allowed or a live process
    listens on one of the sockets."""
    refusal = socket_path_refusal(addresses.path, allowed_dirs)
    if refusal is not None:
        raise ValueError(refusal)
    root = _allowed_root(addresses.path, allowed_dirs)
    assert root is not None
    parent = Path(os.path.realpath(addresses.path)).parent
    try:
        info = os.lstat(parent)
    except FileNotFoundError:
        _make_dirs(root, parent)
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
        if _listened_on(socket_path):
            raise ValueError(f"{socket_path} is in use: another process listens on it; refusing to replace it")
        socket_path.unlink()
