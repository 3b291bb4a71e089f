"""The real model behind the gateway: `smg engine llamacpp` serving SmolLM2-135M-Instruct and a
gateway in front of it over gRPC, one of each per test session, as real processes on loopback.

The model comes through the same `.cache/` fetch as `make demo` (`tools.real_model`). Every test
asserts structure (turns end, counts agree, streams equal their JSON), never the model's words.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

pytest.importorskip("xllamacpp", reason="the llama.cpp engine needs the llamacpp extra")

from smg_grpc_proto.generated import sglang_scheduler_pb2 as pb  # noqa: E402
from smg_grpc_proto.generated import sglang_scheduler_pb2_grpc as pb_grpc  # noqa: E402

from tools import real_model  # noqa: E402
from tools.spawn import Spawned, spawn_gateway  # noqa: E402

MODEL = real_model.MODEL_NAME
HELLO = "Say hello in one short sentence."


@pytest.fixture(scope="session")
def model_files() -> tuple[Path, Path]:
    """(the GGUF, its tokenizer directory)."""
    return real_model.ensure()


@pytest.fixture(scope="session")
def llamacpp(model_files: tuple[Path, Path]) -> Iterator[Spawned]:
    proc = real_model.spawn_engine()
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def real_journal(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("real-journal") / "smg-journal.db"


@pytest.fixture(scope="session")
def real_gateway(llamacpp: Spawned, model_files: tuple[Path, Path], real_journal: Path) -> Iterator[Spawned]:
    proc = spawn_gateway(
        [llamacpp.url],
        journal=real_journal,
        extra=["--backend", "sglang", "--model-path", str(model_files[1]), "--tool-call-parser", "qwen"],
    )
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture
def http(real_gateway: Spawned) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=real_gateway.url, timeout=60.0) as client:
        yield client


class Engine:
    """A raw SGLang scheduler stub on the engine, for what only the engine's side shows."""

    def __init__(self, url: str) -> None:
        self.channel = grpc.insecure_channel(url.split("://", 1)[1])
        self.stub = pb_grpc.SglangSchedulerStub(self.channel)

    def server_args(self) -> dict[str, Any]:
        from google.protobuf.json_format import MessageToDict

        info = self.stub.GetServerInfo(pb.GetServerInfoRequest(), timeout=10)
        return {**MessageToDict(info.server_args), **MessageToDict(info.scheduler_info)}

    def generating(self) -> int:
        return int(self.server_args()["generating"])

    def generated_tokens(self) -> int:
        return int(self.server_args()["generated_tokens"])

    def wait_idle(self, guard: float = 120.0) -> None:
        """Until no generation runs in llama.cpp (`guard` only keeps a broken engine from hanging the run)."""
        deadline = time.monotonic() + guard
        while self.generating():
            if time.monotonic() > deadline:
                raise AssertionError("the engine is still generating")
            time.sleep(0.05)


@pytest.fixture(scope="session")
def engine(llamacpp: Spawned) -> Iterator[Engine]:
    handle = Engine(llamacpp.url)
    try:
        yield handle
    finally:
        handle.channel.close()


def ask(text: str = HELLO, **extra: Any) -> dict[str, Any]:
    """A greedy Messages request body."""
    return {
        "model": MODEL,
        "max_tokens": 48,
        "temperature": 0,
        "messages": [{"role": "user", "content": text}],
        **extra,
    }
