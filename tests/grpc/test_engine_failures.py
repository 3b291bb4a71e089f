"""A gRPC vLLM engine that dies under a stream, over loopback: the broken gRPC stream ends the
client's SSE stream with an `error` event, journaled with its status and code. The engine is
the test's own, since the test ends it. How each engine failure is answered (a finish reason
"error", an engine gone before answering) is tested in process: `tests/server/test_app_playback.py`
and `tests/grpc/test_connector_playback.py`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import pytest

from tests.conftest import journaled_failure
from tests.grpc.conftest import MODEL, QWEN3, target_of
from tests.zmq.test_messages import sse_events, stream_text
from tools.engine_control import EngineControl
from tools.spawn import spawn_engine, spawn_gateway

USER = [{"role": "user", "content": "Say something."}]


class Deployment:
    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.engine = spawn_engine("vllm", model_path=QWEN3, extra=["--served-model-name", MODEL])
        try:
            self.gateway = spawn_gateway(
                [self.engine.url], journal=journal, extra=["--model-path", str(QWEN3), "--disable-retries"]
            )
        except BaseException:
            self.engine.stop()
            raise
        self.http = httpx.Client(base_url=self.gateway.url, timeout=30.0)
        self.control = EngineControl(target_of(self.engine.url))

    def stop(self) -> None:
        self.control.close()
        self.http.close()
        self.gateway.stop()
        self.engine.stop()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    deployed = Deployment(tmp_path / "j.db")
    try:
        yield deployed
    finally:
        deployed.stop()


def test_an_engine_that_dies_mid_stream_ends_it_with_an_error_event(deployment: Deployment) -> None:
    deployment.control.script({"text": "one two three four five", "hold_after": 2, "exit_after": 2})
    seen = threading.Event()
    result: list[tuple[httpx.Response, list[tuple[str, dict[str, Any]]]]] = []

    def read() -> None:
        body = {"model": MODEL, "messages": USER, "max_tokens": 16, "stream": True}
        with httpx.Client(base_url=deployment.gateway.url, timeout=30.0) as client:
            with client.stream("POST", "/v1/messages", json=body) as reply:
                text = []
                for chunk in reply.iter_text():
                    text.append(chunk)
                    if "content_block_delta" in chunk:
                        seen.set()
                result.append((reply, sse_events("".join(text))))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert seen.wait(15.0), "no text arrived"
    with contextlib.suppress(grpc.RpcError):  # the engine may be gone before it answers the Release
        deployment.control.release()  # it exits the moment it goes on
    reader.join(15.0)
    [(reply, events)] = result
    kinds = [k for k, _ in events]
    assert kinds[0] == "message_start" and kinds[-1] == "error", kinds
    assert "message_stop" not in kinds
    assert stream_text(events) and events[-1][1]["error"]["type"] == "api_error"
    journaled_failure(deployment.journal, reply.headers["x-request-id"], 500, "engine_stream_error", answered=200)
