"""Process helpers for tests and benchmarks: start a server, wait until it answers, stop it.

Every process runs in its own process group with its output in a log file, so ``stop`` and
``kill`` reach its children too and a failure can show what the process said. A process whose
``Spawned`` was never stopped is stopped at interpreter exit as a last resort.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO_ROOT = Path(__file__).resolve().parents[1]

_live: set[Spawned] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(eq=False)
class Spawned:
    """A started process, its base URL and its log file."""

    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path
    _stopped: bool = field(default=False, repr=False)

    def _signal_group(self, sig: signal.Signals) -> None:
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM the process group, wait up to ``timeout``, then SIGKILL. Idempotent."""
        if self._stopped:
            return
        self._stopped = True
        _live.discard(self)
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
        # Also reaches children that outlived the leader.
        self._signal_group(signal.SIGKILL)
        self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the process group now (simulates a crash); ``stop`` stays safe to call."""
        self._signal_group(signal.SIGKILL)
        self.proc.wait()

    def log(self) -> str:
        """The process's output so far."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> Spawned:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()


@atexit.register
def _stop_leftovers() -> None:
    for spawned in list(_live):
        spawned.stop(timeout=1.0)


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.splitlines()[-lines:])


def spawn(
    args: list[str],
    *,
    ready_url: str | None = None,
    url: str,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    log_dir: Path | None = None,
    ready_line: str | None = None,
    cwd: Path | None = None,
) -> Spawned:
    """Start ``args`` in the repository root and wait until ``ready_url`` answers below 500
    (or, for a server that speaks no HTTP, until its output has a line starting ``ready_line``).

    ``env`` entries are added to the current environment. Raises RuntimeError with the log's
    tail when the process exits or ``timeout`` passes first; the process is stopped then.
    """
    if (ready_url is None) == (ready_line is None):
        raise ValueError("give exactly one of ready_url and ready_line")
    log_dir = Path(log_dir) if log_dir is not None else Path(tempfile.mkdtemp(prefix="smg-spawn-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix="spawn-", suffix=".log", dir=log_dir)
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    with os.fdopen(fd, "wb") as log_file:
        proc = subprocess.Popen(
            args,
            cwd=cwd or REPO_ROOT,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    spawned = Spawned(proc, url.rstrip("/"), Path(name))
    _live.add(spawned)
    try:
        if ready_url is not None:
            _wait_ready(spawned, ready_url, timeout)
        else:
            _wait_printed(spawned, str(ready_line), timeout)
    except BaseException:
        spawned.stop(timeout=1.0)
        raise
    return spawned


def _wait_ready(spawned: Spawned, ready_url: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=1.0) as client:
        while True:
            code = spawned.proc.poll()
            if code is not None:
                tail = _tail(spawned.log())
                raise RuntimeError(f"exited with {code} before {ready_url} answered:\n{tail}")
            try:
                if client.get(ready_url).status_code < 500:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() >= deadline:
                raise RuntimeError(
                    f"{ready_url} did not answer within {timeout}s:\n{_tail(spawned.log())}"
                )
            time.sleep(0.05)


def _wait_printed(spawned: Spawned, ready_line: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        code = spawned.proc.poll()
        if any(line.startswith(ready_line) for line in spawned.log().splitlines()):
            return
        if code is not None:
            raise RuntimeError(f"exited with {code} before printing {ready_line!r}:\n{_tail(spawned.log())}")
        if time.monotonic() >= deadline:
            raise RuntimeError(f"did not print {ready_line!r} within {timeout}s:\n{_tail(spawned.log())}")
        time.sleep(0.05)


def _on_a_port(port: int | None, start: Callable[[int], Spawned]) -> Spawned:
    """`start` on `port`; without one, on a free port, picked again (three tries) when another
    process took it between the pick and the bind."""
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        try:
            return start(port if port is not None else free_port())
        except RuntimeError as exc:
            if attempt + 1 == attempts or "address already in use" not in str(exc).lower():
                raise
    raise AssertionError("unreachable")


def spawn_together(starts: list[Callable[[], Spawned]], at_once: int = 4) -> list[Spawned]:
    """Call several ``spawn_*`` thunks, ``at_once`` at a time, so their processes start side by
    side instead of each waiting for the one before (few enough that each still starts within
    its timeout on two busy cores); the results in the order given. If any fails, the ones that
    started are stopped and the first failure is raised.
    """
    if not starts:
        return []
    with ThreadPoolExecutor(max_workers=min(at_once, len(starts))) as pool:
        futures = [pool.submit(start) for start in starts]
    started = [f.result() for f in futures if f.exception() is None]
    failures = [exc for f in futures if (exc := f.exception()) is not None]
    if failures:
        for spawned in started:
            spawned.stop(timeout=1.0)
        raise failures[0]
    return started


def spawn_worker(
    port: int | None = None,
    *,
    models: list[str] | None = None,
    extra: list[str] | None = None,
    timeout: float = 30.0,
) -> Spawned:
    """Start ``tools.scripted_worker`` on 127.0.0.1 and wait for its ``/health``.

    Without ``port`` a free one is picked, and picked again if another process took it first.
    """

    def start(chosen: int) -> Spawned:
        args = [sys.executable, "-m", "tools.scripted_worker", "--host", "127.0.0.1", "--port", str(chosen)]
        if models:
            args += ["--models", ",".join(models)]
        args += extra or []
        url = f"http://127.0.0.1:{chosen}"
        return spawn(args, ready_url=f"{url}/health", url=url, timeout=timeout)

    return _on_a_port(port, start)


def spawn_gateway(
    worker_urls: list[str],
    *,
    journal: Path | None = None,
    extra: list[str] | None = None,
    port: int | None = None,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    root: Path | None = None,
) -> Spawned:
    """Start `smg launch` on 127.0.0.1 in front of ``worker_urls`` and wait for its ``/health``.

    ``root``: run the gateway of another checkout (a bench's "before"), by starting it there.

    The gateway discovers its workers before it serves, so once ``/health`` answers the
    model list is known; a tokenizer autoloaded from a gRPC worker may still be loading then
    (``/readiness`` says when it is). Without ``journal`` the gateway runs with ``--no-journal``.
    """
    port = port or free_port()
    url = f"http://127.0.0.1:{port}"
    args = [sys.executable, "-m", "smg", "launch", "--host", "127.0.0.1", "--port", str(port)]
    if worker_urls:
        args += ["--worker-urls", *worker_urls]
    args += ["--journal", str(journal)] if journal else ["--no-journal"]
    args += extra or []
    return spawn(args, ready_url=f"{url}/health", url=url, timeout=timeout, env=env, cwd=root)


def spawn_engine(
    runtime: str = "sglang",
    model_path: str | Path = REPO_ROOT / "tests" / "fixtures" / "qwen3",
    extra: list[str] | None = None,
    *,
    port: int | None = None,
    timeout: float = 30.0,
) -> Spawned:
    """Start ``tools.scripted_engine`` for ``runtime`` on 127.0.0.1 and wait until it serves.

    The returned ``url`` is ``grpc://127.0.0.1:PORT``. Without ``port`` a free one is picked,
    and picked again if another process took it first.
    """

    def start(chosen: int) -> Spawned:
        args = [
            sys.executable,
            "-m",
            "tools.scripted_engine",
            "--host",
            "127.0.0.1",
            "--port",
            str(chosen),
            "--runtime",
            runtime,
            "--model-path",
            str(model_path),
            *(extra or []),
        ]
        return spawn(args, ready_line="scripted engine ready", url=f"grpc://127.0.0.1:{chosen}", timeout=timeout)

    return _on_a_port(port, start)


def spawn_zmq_engine(
    path: str | Path,
    model_path: str | Path = REPO_ROOT / "tests" / "fixtures" / "qwen3",
    extra: list[str] | None = None,
    *,
    timeout: float = 30.0,
) -> Spawned:
    """Start ``tools.scripted_zmq_engine`` dialling the ZMQ worker ``ipc://PATH`` and wait until
    its control service serves (the gateway may come up before or after it).

    The returned ``url`` is the control service's ``grpc://127.0.0.1:PORT`` (for
    ``EngineControl``); the worker URL the gateway is given is ``ipc://PATH``.
    """

    def start(port: int) -> Spawned:
        args = [
            sys.executable,
            "-m",
            "tools.scripted_zmq_engine",
            "--path",
            str(path),
            "--model-path",
            str(model_path),
            "--control-port",
            str(port),
            *(extra or []),
        ]
        return spawn(args, ready_line="scripted zmq engine ready", url=f"grpc://127.0.0.1:{port}", timeout=timeout)

    return _on_a_port(None, start)
