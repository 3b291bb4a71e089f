"""IGW: ZMQ workers join the model's pools beside gRPC and HTTP workers."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from journal.events import Routed
from tests.conftest import wait_for_events
from tests.zmq.conftest import MODEL, QWEN3, socket_dir, start_engine, wait_ready
from tools.spawn import spawn_engine, spawn_gateway, spawn_worker

USER = [{"role": "user", "content": "Hello"}]
BODY = {"model": MODEL, "max_tokens": 20, "messages": USER}


@pytest.fixture
def igw(tmp_path: Path) -> Iterator[dict[str, Any]]:
    directory = socket_dir()
    url = f"ipc://{directory}/w0"
    # The ZMQ worker's model id is --model-path: the gRPC engine serves the same name.
    grpc_engine = spawn_engine("vllm", model_path=QWEN3, extra=["--served-model-name", MODEL])
    http = spawn_worker(models=["http-only"])
    journal = tmp_path / "igw.db"
    gw = spawn_gateway(
        [grpc_engine.url, url, http.url],
        journal=journal,
        extra=["--enable-igw", "--backend", "vllm", "--model-path", MODEL, "--policy", "round_robin"],
    )
    zmq_engine = start_engine(directory / "w0")
    try:
        yield {"gw": gw, "journal": journal}
    finally:
        gw.stop()
        zmq_engine.stop()
        grpc_engine.stop()
        http.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _backend(journal: Path, response: httpx.Response) -> str:
    events = wait_for_events(journal, response.headers["x-request-id"])
    return next(e.backend for e in events if isinstance(e, Routed))


def test_zmq_and_grpc_pools_serve_one_model_and_the_gateway_answers_count_tokens(igw: dict[str, Any]) -> None:
    gw, journal = igw["gw"], igw["journal"]
    with httpx.Client(base_url=gw.url, timeout=30.0) as client:
        wait_ready(client)
        # Readiness needs only one healthy worker: wait until both engine pools serve the model.
        deadline = time.monotonic() + 30.0
        while sum(w["is_healthy"] for w in client.get("/workers").json()["workers"]) < 3:
            assert time.monotonic() < deadline, client.get("/workers").text
            time.sleep(0.1)
        backends = {_backend(journal, client.post("/v1/messages", json=BODY)) for _ in range(16)}
        assert backends == {"grpc", "zmq"}  # weighted by the pools' available workers
        counted = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER})
        assert counted.status_code == 200 and _backend(journal, counted) in ("grpc", "zmq")
        relayed = client.post("/v1/messages", json={**BODY, "model": "http-only"})
        assert relayed.status_code == 200 and _backend(journal, relayed) == "http"
        assert {m["id"] for m in client.get("/v1/models").json()["data"]} >= {MODEL, "http-only"}
