"""`--log-json` over loopback: every line the gateway logs is one JSON object, and each request
leaves one `smg.access` line with its id, tenant, model, worker, status and durations."""

from __future__ import annotations

import time
from typing import Any

import httpx
import orjson

from tests.conftest import MODEL
from tools.spawn import Spawned, spawn_gateway

BODY = {"model": MODEL, "max_tokens": 8, "messages": [{"role": "user", "content": "log me"}]}


def _lines(gw: Spawned) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in gw.log().splitlines() if line.strip()]


def _access(gw: Spawned, count: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 10
    while True:
        found = [line for line in _lines(gw) if line["logger"] == "smg.access"]
        if len(found) >= count:
            return found
        assert time.monotonic() < deadline, f"{len(found)} access lines, expected {count}"
        time.sleep(0.05)


def test_json_lines_with_one_access_record_per_request(worker: Spawned) -> None:
    gw = spawn_gateway([worker.url], extra=["--log-json", "--api-key", "k", "--disable-retries"])
    try:
        with httpx.Client(base_url=gw.url, timeout=30.0, headers={"authorization": "Bearer k"}) as client:
            ok = client.post("/v1/messages", json=BODY)
            missing = client.post("/v1/messages", json={**BODY, "model": "nope"})
            refused = client.post("/v1/messages", json=BODY, headers={"authorization": "Bearer wrong"})
        assert (ok.status_code, missing.status_code, refused.status_code) == (200, 404, 401)
        served, unknown, unauthorized = _access(gw, 3)
    finally:
        gw.stop()
    lines = _lines(gw)  # every line parses, Sanic's own included
    assert {"ts", "level", "logger", "message"} <= set(lines[0])
    assert served["request_id"] == ok.headers["request-id"]
    assert (served["status"], served["model"], served["worker"], served["backend"]) == (200, MODEL, worker.url, "http")
    assert served["tenant"] and served["path"] == "/v1/messages" and served["attempts"] == 1
    assert served["duration_ms"] > 0 and served["ttft_ms"] is not None and served["ttft_ms"] <= served["duration_ms"]
    assert served["output_tokens"] > 0 and served["error_code"] is None
    assert (unknown["status"], unknown["error_code"], unknown["worker"]) == (404, "model_not_found", None)
    assert (unauthorized["status"], unauthorized["model"]) == (401, None)
    assert "Bearer" not in gw.log()  # no secret reaches the log
