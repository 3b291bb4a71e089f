"""Smoke tests for the benches: the load generator against a real scripted worker, one tiny relay
bench and one quick gRPC path bench end to end. They check counts and errors, never timings."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tools.spawn import REPO_ROOT, Spawned, spawn_worker


@pytest.fixture(scope="module")
def worker() -> Iterator[Spawned]:
    spawned = spawn_worker()
    try:
        yield spawned
    finally:
        spawned.stop()


@pytest.fixture
def fresh(worker: Spawned) -> Spawned:
    httpx.post(f"{worker.url}/_reset").raise_for_status()
    return worker


def _load(*args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.load", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()
    result: dict[str, Any] = orjson.loads(done.stdout)
    return result


def _received(worker: Spawned) -> int:
    return len(httpx.get(f"{worker.url}/_received").json()["requests"])


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_load_reports_every_request_it_made(fresh: Spawned, stream: bool) -> None:
    args = ["--url", fresh.url, "--concurrency", "4", "--duration", "1.5", "--warmup", "0.2"]
    result = _load(*args, *(["--stream"] if stream else []), "--cpu-pid", str(fresh.proc.pid))

    assert result["errors"] == 0, result["error_samples"]
    assert result["warmup"]["errors"] == 0, result["warmup"]["error_samples"]
    assert result["requests"] == result["ok"] > 0
    assert _received(fresh) == result["requests"] + result["warmup"]["requests"]
    assert result["rps"] > 0
    assert set(result["latency_ms"]) >= {"p50", "p90", "p99"}
    assert ("ttfb_ms" in result) is stream
    assert result["cpu_us_per_request"][str(fresh.proc.pid)] is not None


def test_load_counts_failures(fresh: Spawned) -> None:
    answers = [{"status": 503}, {"stream_echo": True, "drop_after": 3}]
    httpx.post(f"{fresh.url}/_script", json={"path": "/v1/messages", "answers": answers}).raise_for_status()

    result = _load("--url", fresh.url, "--stream", "--requests", "6")

    assert result["requests"] == 6
    assert result["ok"] == 4
    assert result["errors"] == 2
    assert result["error_kinds"].get("status 503") == 1
    assert len(result["error_samples"]) == 2


def test_relay_bench_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    args = ["--quick", "--concurrency", "4", "--targets", "direct,aiohttp-J", "--duration", "0.2", "--json", str(out)]
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.relay", *args], cwd=REPO_ROOT, capture_output=True, timeout=60
    )

    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    runs = orjson.loads(out.read_bytes())["runs"]
    assert sorted((r["stream"], r["target"]) for r in runs) == [
        (False, "aiohttp-J"),
        (False, "direct"),
        (True, "aiohttp-J"),
        (True, "direct"),
    ]
    assert all(r["errors"] == 0 and r["ok"] > 0 for r in runs)
    assert b"stream c=4" in done.stdout and b"x-direct" in done.stdout


def test_grpc_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "grpc-bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "tools.bench.grpc", "--quick", "--json", str(out)],
        cwd=REPO_ROOT,
        capture_output=True,
        timeout=120,
    )

    assert done.returncode == 0, done.stdout.decode() + done.stderr.decode()
    runs = orjson.loads(out.read_bytes())["runs"]
    assert {r["target"] for r in runs} == {"direct", "gw+J", "gw-J"}
    assert {r["stream"] for r in runs} == {False, True}
    assert all(r["errors"] == 0 and r["warmup"]["errors"] == 0 and r["ok"] > 0 for r in runs)
    assert all(r["tokens"] == r["ok"] * 64 for r in runs)  # --quick answers 64 tokens each
    assert all(r["cpu_ms_per_1k_tokens"]["gateway"] is not None for r in runs if r["target"] != "direct")
    for text in (b"stream c=1", b"json c=8", b"summary", b"x-direct", b"gwCPU/1k +J"):
        assert text in done.stdout


def test_routing_bench_runs_and_no_request_fails_when_a_worker_is_killed() -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tools.bench.routing",
            "--requests",
            "60",
            "--concurrency",
            "4",
            "--policies",
            "round_robin,least_load",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "round_robin" in done.stdout and "least_load" in done.stdout
