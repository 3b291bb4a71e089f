"""A real Redis server for tests: `redis-server` in a temporary directory on a free loopback
port, stopped by PID (its process group) even when the test fails.

`stop()` then `start()` restarts it on the same port (an outage, and the server coming back);
with `appendonly=True` it keeps its data across that restart, as a persisting production
server does. Nothing here is a fake: the gateway under test speaks to this process over TCP.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tools.spawn import Spawned, _live, free_port

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """One redis-server process; `url` names its database 0."""

    def __init__(self, root: Path | None = None, *, appendonly: bool = False, port: int | None = None) -> None:
        self.dir = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="smg-redis-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.appendonly = appendonly
        self._proc: Spawned | None = None
        self._runs = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.proc.poll() is None

    def start(self, timeout: float = 10.0) -> RedisServer:
        if self.running:
            return self
        if not Path(REDIS_SERVER).exists():
            raise RuntimeError("redis-server is not installed (Debian: apt-get install -y redis-server)")
        self._runs += 1
        log_path = self.dir / f"redis-{self._runs}.log"
        args = [
            REDIS_SERVER,
            "--port", str(self.port),
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--save", "",
            "--appendonly", "yes" if self.appendonly else "no",
            "--appendfsync", "always",
            "--protected-mode", "no",
            "--daemonize", "no",
            "--logfile", "",
        ]  # fmt: skip
        with open(log_path, "wb") as log_file:
            proc = subprocess.Popen(
                args, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        self._proc = Spawned(proc, self.url, log_path)
        _live.add(self._proc)
        deadline = time.monotonic() + timeout
        while not _answers(self.port):
            if proc.poll() is not None or time.monotonic() > deadline:
                output = self._proc.log()
                self._proc.stop(timeout=1.0)
                raise RuntimeError(f"redis-server on port {self.port} did not start:\n{output[-2000:]}")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """SIGTERM (it exits at once with `--save ""`), then SIGKILL; idempotent."""
        if self._proc is not None:
            self._proc.stop(timeout=5.0)
            self._proc = None

    def kill(self) -> None:
        """SIGKILL now: the server vanishes as in a crash."""
        if self._proc is not None:
            self._proc.kill()
            self._proc.stop()
            self._proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def freeze(self) -> None:
        """SIGSTOP: the server keeps its connections and answers nothing (a stalled server);
        what clients send meanwhile it runs at `thaw()`."""
        if self._proc is not None:
            os.kill(self._proc.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        if self._proc is not None:
            os.kill(self._proc.proc.pid, signal.SIGCONT)

    def log(self) -> str:
        return self._proc.log() if self._proc is not None else ""

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


class Unanswering:
    """A loopback listener that accepts connections and never answers a byte: a Redis server
    that is blackholed (a dead host behind a live route, a stalled process), as a client sees
    it. `accepted` counts the connections made to it; `close()` drops them all."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self.accepted = 0
        self._held: list[socket.socket] = []
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="unanswering-redis", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._held.append(conn)
            self.accepted += 1

    def close(self) -> None:
        self._stopping.set()
        self._thread.join(timeout=2)
        self._sock.close()
        for conn in self._held:
            conn.close()

    def __enter__(self) -> Unanswering:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class SilencingProxy:
    """A loopback TCP proxy in front of a server. `silence()` makes the connections open now
    go quiet both ways without closing them (a NAT or load balancer that dropped an idle
    connection: half-open, neither end told); connections made afterwards pass as before."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(64)
        self._sock.settimeout(0.1)
        self.port = self._sock.getsockname()[1]
        self._pairs: list[tuple[socket.socket, socket.socket, threading.Event]] = []
        self._stopping = threading.Event()
        threading.Thread(target=self._accept, name="silencing-proxy", daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            quiet = threading.Event()
            self._pairs.append((client, upstream, quiet))
            for src, dst in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(src, dst, quiet), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, quiet: threading.Event) -> None:
        try:
            while data := src.recv(65536):
                if not quiet.is_set():
                    dst.sendall(data)
        except OSError:
            pass

    def silence(self) -> None:
        for _, _, quiet in self._pairs:
            quiet.set()

    def close(self) -> None:
        self._stopping.set()
        self._sock.close()
        for client, upstream, _ in self._pairs:
            client.close()
            upstream.close()

    def __enter__(self) -> SilencingProxy:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()
