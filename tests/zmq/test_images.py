"""A ZMQ pool serving a vision-typed model refuses images: its EngineCore requests carry no
multimodal features, so the gateway never sends an image it would silently drop."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import wait_for_events
from tests.zmq.conftest import FIXTURES, socket_dir, target_of, wait_ready
from tools.engine_control import EngineControl
from tools.spawn import spawn_gateway, spawn_zmq_engine

QWEN2VL = FIXTURES / "qwen2vl"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n").decode()


@pytest.fixture(scope="module")
def deployment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[httpx.Client, EngineControl, Path]]:
    directory = socket_dir()
    journal = tmp_path_factory.mktemp("zmq-images") / "journal.db"
    gateway = spawn_gateway(
        [f"ipc://{directory / 'w0'}"], journal=journal, extra=["--backend", "vllm", "--model-path", str(QWEN2VL)]
    )
    engine = None
    try:
        engine = spawn_zmq_engine(directory / "w0", QWEN2VL, [])
        control = EngineControl(target_of(engine.url))
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            wait_ready(client)
            yield client, control, journal
        control.close()
    finally:
        if engine is not None:
            engine.stop()
        gateway.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_images_on_a_zmq_pool_are_not_supported(deployment: tuple[httpx.Client, EngineControl, Path]) -> None:
    client, control, journal = deployment
    control.reset()
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}
    reply = client.post(
        "/v1/messages",
        json={
            "model": str(QWEN2VL),
            "max_tokens": 8,
            "messages": [{"role": "user", "content": [image, {"type": "text", "text": "?"}]}],
        },
    )
    assert reply.status_code == 400, reply.text
    assert reply.headers["x-smg-error-code"] == "multimodal_not_supported"
    assert reply.json()["type"] == "error"
    assert control.received() == []
    events = wait_for_events(journal, reply.headers["x-request-id"])
    assert [e.kind for e in events][-2:] == ["error", "completed"]
