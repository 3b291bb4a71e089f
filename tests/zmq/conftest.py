"""A scripted EngineCore on the real ZMQ wire and a gateway bound to it, as processes on loopback."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_gateway, spawn_zmq_engine

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN3 = FIXTURES / "qwen3"
MODEL = str(QWEN3)  # a ZMQ worker's model id is the --model-path string
ALIAS = "qwen-zmq"
WINDOW = 256


def target_of(url: str) -> str:
    return url.split("://", 1)[1]


def socket_dir() -> Path:
    # Unix socket paths are short (108 bytes): not under pytest's deep tmp_path.
    return Path(tempfile.mkdtemp(prefix="smg-zmq-"))


def start_gateway(path: Path, journal: Path | None = None) -> Spawned:
    return spawn_gateway(
        [f"ipc://{path}"],
        journal=journal,
        extra=["--backend", "vllm", "--model-path", MODEL, "--model-alias", f"{ALIAS}={MODEL}"],
    )


def start_engine(path: Path) -> Spawned:
    return spawn_zmq_engine(path, QWEN3, ["--max-model-len", str(WINDOW)])


@pytest.fixture(scope="module")
def sockets() -> Iterator[Path]:
    directory = socket_dir()
    try:
        yield directory / "w0"
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def zmq_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("zmq-journal") / "smg-journal.db"


@pytest.fixture(scope="module")
def zmq_gateway(sockets: Path, zmq_journal: Path) -> Iterator[Spawned]:
    proc = start_gateway(sockets, zmq_journal)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def zmq_engine(sockets: Path, zmq_gateway: Spawned) -> Iterator[Spawned]:
    proc = start_engine(sockets)
    try:
        yield proc
    finally:
        proc.stop()


def wait_ready(client: httpx.Client, timeout: float = 30.0) -> None:
    """Until the gateway's worker has registered and its tokenizer is loaded."""
    import time

    deadline = time.monotonic() + timeout
    while client.get("/readiness").status_code != 200:
        if time.monotonic() > deadline:
            raise AssertionError(f"the ZMQ worker never became ready: {client.get('/readiness').text}")
        time.sleep(0.1)


@pytest.fixture
def control(zmq_engine: Spawned) -> Iterator[EngineControl]:
    ctl = EngineControl(target_of(zmq_engine.url))
    ctl.reset()
    try:
        yield ctl
    finally:
        ctl.close()


@pytest.fixture
def http(zmq_gateway: Spawned, zmq_engine: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=zmq_gateway.url, timeout=30.0) as client:
        wait_ready(client)
        yield client
