"""Where an `ipc://` worker's sockets may go: a live process's socket is never removed (the
worker is refused, the listener keeps serving), a stale socket file is reclaimed, and a path
outside the allowed directories (`--ipc-dir`) is refused without creating anything."""

from __future__ import annotations

import os
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from smg.backends.zmq.addresses import prepare_socket_dir, zmq_addresses
from tests.zmq.conftest import MODEL, socket_dir, start_gateway
from tools.spawn import spawn_gateway


@pytest.fixture
def directory() -> Iterator[Path]:
    path = socket_dir()
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _listener(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    sock.listen(8)
    return sock


def _still_listening(listener: socket.socket, path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(path))
        conn, _ = listener.accept()
        conn.close()
    return True


def test_a_live_listeners_socket_is_never_removed(directory: Path) -> None:
    path = directory / "w0-in.sock"
    with _listener(path) as listener:
        inode = os.stat(path).st_ino
        with pytest.raises(ValueError, match="in use"):
            prepare_socket_dir(zmq_addresses(f"ipc://{directory}/w0"))
        assert os.stat(path).st_ino == inode
        assert _still_listening(listener, path)


def test_a_stale_socket_file_is_reclaimed(directory: Path) -> None:
    path = directory / "w0-out.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as gone:
        gone.bind(str(path))  # bound and closed, never unlinked: what a killed process leaves
    assert path.is_socket()
    prepare_socket_dir(zmq_addresses(f"ipc://{directory}/w0"))
    assert not path.exists()


def test_a_path_outside_the_allowed_directories_creates_nothing(directory: Path) -> None:
    allowed = directory / "allowed"
    allowed.mkdir()
    for url in (f"ipc://{directory}/other/sub/w0", f"ipc://{allowed}/../other/w0"):
        with pytest.raises(ValueError, match="outside the directories allowed"):
            prepare_socket_dir(zmq_addresses(url), [str(allowed)])
    assert not (directory / "other").exists()
    prepare_socket_dir(zmq_addresses(f"ipc://{allowed}/deep/er/w0"), [str(allowed)])
    assert all(os.stat(p).st_mode & 0o777 == 0o700 for p in (allowed / "deep", allowed / "deep" / "er"))


def test_a_gateway_refuses_an_ipc_worker_whose_socket_a_live_process_holds(directory: Path) -> None:
    path = directory / "w0-in.sock"
    with _listener(path) as listener:
        inode = os.stat(path).st_ino
        gw = start_gateway(directory / "w0")
        try:
            deadline = time.monotonic() + 15
            while True:
                (worker,) = httpx.get(gw.url + "/workers", timeout=10).json()["workers"]
                if "last_error" in worker:
                    break
                assert time.monotonic() < deadline, worker
                time.sleep(0.1)
            assert "in use" in worker["last_error"] and not worker["is_healthy"]
        finally:
            gw.stop()
        assert os.stat(path).st_ino == inode
        assert _still_listening(listener, path)


def test_the_worker_api_refuses_an_ipc_path_outside_the_allowed_directories(directory: Path) -> None:
    allowed = directory / "allowed"
    allowed.mkdir()
    gw = spawn_gateway(
        [], extra=["--enable-igw", "--backend", "vllm", "--model-path", MODEL, "--ipc-dir", str(allowed)]
    )
    try:
        with httpx.Client(base_url=gw.url, timeout=10) as client:
            for url in (f"ipc://{directory}/other/w0", "ipc://relative/w0", f"ipc://{allowed}/w0?x=1"):
                refused = client.post("/workers", json={"url": url})
                assert refused.status_code == 400, (url, refused.text)
                assert refused.json()["code"] in ("IPC_PATH_NOT_ALLOWED", "INVALID_WORKER_URL"), refused.json()
            assert client.get("/workers").json()["total"] == 0
            assert client.post("/workers", json={"url": f"ipc://{allowed}/sub/w0"}).status_code == 202
    finally:
        gw.stop()
    assert not (directory / "other").exists()
