"""A gateway started without --backend asks each gRPC engine which protocol it speaks: engines of
different runtimes behind one gateway are each spoken to in their own, and one that comes up
after the gateway is detected when it does."""

from __future__ import annotations

import time
from pathlib import Path

import httpx

from tests.grpc.conftest import QWEN3, target_of
from tools.engine_control import EngineControl
from tools.spawn import Spawned, free_port, spawn_engine, spawn_gateway

USER = [{"role": "user", "content": "Hi"}]


def _wait_for_model(client: httpx.Client, model: str, gateway: Spawned) -> None:
    """Until the gateway lists `model` and is ready (its tokenizer loaded)."""
    deadline = time.monotonic() + 30.0
    while (
        model not in [m["id"] for m in client.get("/v1/models").json()["data"]]
        or client.get("/readiness").status_code != 200
    ):
        assert time.monotonic() < deadline, f"{model} never served:\n{gateway.log()[-3000:]}"
        time.sleep(0.2)


def test_engines_of_two_runtimes_are_each_spoken_to_in_theirs(tmp_path: Path) -> None:
    vllm = spawn_engine("vllm", model_path=QWEN3, extra=["--served-model-name", "on-vllm"])
    mlx = spawn_engine("mlx", model_path=QWEN3, extra=["--served-model-name", "on-mlx"])
    gateway = spawn_gateway([vllm.url, mlx.url], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3)])
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client, EngineControl(target_of(vllm.url)) as ctl:
            for model in ("on-vllm", "on-mlx"):
                _wait_for_model(client, model, gateway)
                reply = client.post("/v1/messages", json={"model": model, "max_tokens": 16, "messages": USER})
                assert reply.status_code == 200, reply.text
                assert reply.json()["content"][0]["text"]
            # vLLM takes stop strings itself; MLX has none, so the gateway refuses them for it.
            body = {"max_tokens": 16, "messages": USER, "stop_sequences": ["zebra"]}
            assert client.post("/v1/messages", json={**body, "model": "on-vllm"}).status_code == 200
            assert ctl.received()[-1]["sampling_params"]["stop"] == ["zebra"]
            refused = client.post("/v1/messages", json={**body, "model": "on-mlx"})
            assert refused.status_code == 400
            assert refused.headers["x-smg-error-code"] == "invalid_request_parameters"
        log = gateway.log()
        assert f"worker {vllm.url} speaks the vllm engine protocol" in log
        assert f"worker {mlx.url} speaks the mlx engine protocol" in log
    finally:
        gateway.stop()
        vllm.stop()
        mlx.stop()


def test_an_engine_that_starts_later_is_detected_then(tmp_path: Path) -> None:
    port = free_port()
    url = f"grpc://127.0.0.1:{port}"
    gateway = spawn_gateway([url], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3)])
    engine: Spawned | None = None
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            early = client.post("/v1/messages", json={"model": "late", "max_tokens": 8, "messages": USER})
            assert early.status_code == 503 and early.headers["x-smg-error-code"] == "no_available_workers"
            engine = spawn_engine("tokenspeed", model_path=QWEN3, extra=["--served-model-name", "late"], port=port)
            _wait_for_model(client, "late", gateway)
            reply = client.post("/v1/messages", json={"model": "late", "max_tokens": 8, "messages": USER})
            assert reply.status_code == 200, reply.text
        log = gateway.log()
        assert "runtime detection failed: nothing answers gRPC" in log
        assert f"worker {url} speaks the tokenspeed engine protocol" in log
    finally:
        gateway.stop()
        if engine is not None:
            engine.stop()
