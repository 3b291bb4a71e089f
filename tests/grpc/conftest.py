"""A scripted SGLang engine and a gateway in front of it, as real processes on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tools.engine_control import EngineControl
from tools.spawn import Spawned, spawn_engine, spawn_gateway

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
QWEN3 = FIXTURES / "qwen3"
MODEL = "qwen3-fixture"
WINDOW = 4096


def target_of(url: str) -> str:
    return url.split("://", 1)[1]


@pytest.fixture(scope="session")
def engine() -> Iterator[Spawned]:
    proc = spawn_engine(
        "sglang",
        model_path=QWEN3,
        extra=["--served-model-name", MODEL, "--max-context-length", str(WINDOW)],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def control(engine: Spawned) -> Iterator[EngineControl]:
    ctl = EngineControl(target_of(engine.url))
    ctl.reset()
    try:
        yield ctl
    finally:
        ctl.close()


@pytest.fixture(scope="session")
def grpc_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("grpc-journal") / "smg-journal.db"


@pytest.fixture(scope="session")
def grpc_gateway(engine: Spawned, grpc_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway(
        [engine.url],
        journal=grpc_journal,
        extra=["--model-path", str(QWEN3), "--model-alias", f"qwen-alias={MODEL}"],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def http(grpc_gateway: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=grpc_gateway.url, timeout=30.0) as client:
        yield client
