"""`--zmq-engine-count 2`: two data-parallel engines dial one worker; it serves once both have
registered, and requests go to the engine with the fewest in flight."""

from __future__ import annotations

import shutil
import threading
import time

import httpx

from tests.zmq.conftest import MODEL, QWEN3, WINDOW, socket_dir, target_of
from tools.engine_control import EngineControl
from tools.spawn import spawn_gateway, spawn_zmq_engine

USER = [{"role": "user", "content": "Hello"}]


def test_two_engines_on_one_worker() -> None:
    directory = socket_dir()
    path = directory / "w0"
    gateway = spawn_gateway(
        [f"ipc://{path}"], extra=["--backend", "vllm", "--model-path", MODEL, "--zmq-engine-count", "2"]
    )
    engines = []
    try:
        engines.append(spawn_zmq_engine(path, QWEN3, ["--max-model-len", str(WINDOW), "--engine-index", "0"]))
        with httpx.Client(base_url=gateway.url, timeout=30.0) as http:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:  # one of two engines: the worker waits for the other
                assert http.get("/readiness").status_code == 503
                time.sleep(0.2)
            assert "1 of 2 engine(s) registered" in gateway.log()
            engines.append(spawn_zmq_engine(path, QWEN3, ["--max-model-len", str(WINDOW), "--engine-index", "1"]))
            deadline = time.monotonic() + 30.0
            while http.get("/readiness").status_code != 200:
                assert time.monotonic() < deadline, http.get("/readiness").text
                time.sleep(0.1)
            controls = [EngineControl(target_of(e.url)) for e in engines]
            try:
                for control in controls:
                    control.script(default={"text": "held", "hold_after": 1})
                body = {"model": MODEL, "max_tokens": 10, "messages": USER}
                replies: list[httpx.Response] = []
                threads = [
                    threading.Thread(target=lambda: replies.append(http.post("/v1/messages", json=body)))
                    for _ in range(2)
                ]
                for thread in threads:
                    thread.start()
                deadline = time.monotonic() + 10.0
                # Both held at once: the second request went to the engine with none in flight.
                while not all(c.received() for c in controls):
                    assert time.monotonic() < deadline, [len(c.received()) for c in controls]
                    time.sleep(0.05)
                for control in controls:
                    control.release()
                for thread in threads:
                    thread.join(10.0)
                assert [r.status_code for r in replies] == [200, 200]
            finally:
                for control in controls:
                    control.close()
    finally:
        gateway.stop()
        for engine in engines:
            engine.stop()
        shutil.rmtree(directory, ignore_errors=True)
