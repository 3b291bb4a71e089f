"""One scripted engine per runtime for the whole session, started together, reset per test."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest

from smg.backends.grpc.engines import RUNTIMES, connect
from smg.backends.grpc.types import EngineClient
from tools.engine_control import EngineControl
from tools.spawn import REPO_ROOT, Spawned, spawn_engine

QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
# A vLLM engine with every optional flag, for what the default engines cannot show.
FLAGGED = "vllm-flagged"
FLAGGED_ARGS = [
    "--no-tokenizer-bundle",
    "--max-context-length",
    "16",
    "--eos-token-ids",
    "4000",
    "--default-sampling-params",
    '{"temperature": 0.6, "top_p": 0.95, "top_k": 20}',
]


@dataclass
class EngineUnderTest:
    runtime: str
    url: str
    control: EngineControl


def _start(name: str) -> Spawned:
    if name == FLAGGED:
        return spawn_engine("vllm", QWEN3, FLAGGED_ARGS)
    return spawn_engine(name, QWEN3, ["--served-model-name", f"tiny-{name}"])


@pytest.fixture(scope="session")
def engines() -> Iterator[dict[str, Spawned]]:
    if not (QWEN3 / "tokenizer.json").is_file():
        pytest.skip("tests/fixtures/qwen3 is not there yet")
    names = [*RUNTIMES, FLAGGED]
    started: dict[str, Spawned] = {}
    failure: BaseException | None = None
    with ThreadPoolExecutor(len(names)) as pool:
        futures = {name: pool.submit(_start, name) for name in names}
        for name, future in futures.items():
            try:
                started[name] = future.result()
            except BaseException as exc:  # stop the others before failing
                failure = failure or exc
    try:
        if failure is not None:
            raise failure
        yield started
    finally:
        for spawned in started.values():
            spawned.stop()


def _under_test(engines: dict[str, Spawned], name: str) -> Iterator[EngineUnderTest]:
    control = EngineControl(engines[name].url)
    control.reset()
    try:
        yield EngineUnderTest(name if name != FLAGGED else "vllm", engines[name].url, control)
    finally:
        control.reset()
        control.close()


@pytest.fixture(params=RUNTIMES)
def engine(request: pytest.FixtureRequest, engines: dict[str, Spawned]) -> Iterator[EngineUnderTest]:
    """Each runtime's engine in turn, its scripts and records cleared."""
    yield from _under_test(engines, request.param)


@pytest.fixture
def sglang(engines: dict[str, Spawned]) -> Iterator[EngineUnderTest]:
    yield from _under_test(engines, "sglang")


@pytest.fixture
def vllm(engines: dict[str, Spawned]) -> Iterator[EngineUnderTest]:
    yield from _under_test(engines, "vllm")


@pytest.fixture
def flagged(engines: dict[str, Spawned]) -> Iterator[EngineUnderTest]:
    yield from _under_test(engines, FLAGGED)


@pytest.fixture
async def engine_client(engine: EngineUnderTest) -> AsyncIterator[EngineClient]:
    # Every engine message a chunk of its own: these tests read each protocol's chunks.
    client = connect(engine.runtime, engine.url, merge_waiting=False)
    try:
        yield client
    finally:
        await client.close()


@pytest.fixture(scope="session")
def tokenizer() -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(QWEN3))
