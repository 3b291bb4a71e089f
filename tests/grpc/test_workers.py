"""gRPC workers that go away: an engine that is down is retried elsewhere before the first token,
taken out of rotation, and the gateway keeps answering from the engine that is left."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.grpc.conftest import MODEL, QWEN3
from tools.spawn import spawn_engine, spawn_gateway

USER = [{"role": "user", "content": "Hi"}]


def test_a_dead_engine_is_retried_on_the_other_and_taken_out(tmp_path: Path) -> None:
    engines = [spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", MODEL]) for _ in range(2)]
    gateway = spawn_gateway([e.url for e in engines], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3)])
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            body = {"model": MODEL, "max_tokens": 16, "messages": USER}
            assert all(client.post("/v1/messages", json=body).status_code == 200 for _ in range(2))
            engines[1].kill()
            for stream in (False, True, False, True):
                reply = client.post("/v1/messages", json={**body, "stream": stream})
                assert reply.status_code == 200, reply.text
                assert "event: message_stop" in reply.text if stream else reply.json()["content"][0]["text"]
            assert client.get("/readiness").status_code == 200
    finally:
        gateway.stop()
        for engine in engines:
            engine.stop()


def test_no_engine_left_is_an_error_response_not_a_hang(tmp_path: Path) -> None:
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", MODEL])
    gateway = spawn_gateway(
        [engine.url], journal=tmp_path / "j.db", extra=["--model-path", str(QWEN3), "--disable-retries"]
    )
    try:
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            engine.kill()
            first = client.post(
                "/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": USER, "stream": True}
            )
            assert first.status_code in (502, 503)
            assert first.headers["content-type"].startswith("application/json")
            assert first.json()["type"] == "error"
            second = client.post("/v1/messages", json={"model": MODEL, "max_tokens": 8, "messages": USER})
            assert second.status_code == 503 and second.headers["x-smg-error-code"] == "no_available_workers"
            # count_tokens needs no engine: the tokenizer is still here.
            counted = client.post("/v1/messages/count_tokens", json={"model": MODEL, "messages": USER})
            assert counted.status_code == 200
    finally:
        gateway.stop()
        engine.stop()
