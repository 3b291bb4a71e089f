"""The same requests through the gateway to one real vLLM engine, over gRPC and then over ZMQ.

For each wire it starts the engine and a gateway in front of it (gRPC: vLLM's gRPC server with
smg-grpc-servicer, the gateway dialling it; ZMQ: the gateway binding `ipc://…`, then `vllm serve
--headless` dialling its handshake port), waits for `/readiness`, sends a few warm-up requests,
then the measured ones: streamed `POST /v1/messages`, ``--max-tokens`` each, ``--concurrency`` at a
time, sampled by default (``--temperature 1``; greedy decoding of random weights repeats one
token). It reports per wire the time to the first token (to `message_start`, which the gateway
sends when the engine's first token arrives; p50, p90) and to the first text delta (p50), each
request's rate after `message_start` (p50) and the aggregate output tokens/s over the measured
stretch. The gateways run no tool or reasoning parser. One engine runs at a time; both are
stopped on the way out, on errors and Ctrl-C too.

On two cores the engine's worker takes one and everything else (its EngineCore process, the
gateway, this client) shares the other, so the gateway often gets the CPU only once the engine
pauses: a stream's tokens then reach the client in bursts, and the per-request rate after the
first token says little. The aggregate rate and the first-token time are the comparable figures.

A quick measurement, not a benchmark suite: on a shared machine expect ±20 %.

Run: ``python -m tools.bench.wires --vllm-python .venv-vllm/bin/python --model .cache/tiny-qwen3
[--requests 20] [--max-tokens 128] [--concurrency 1,4] [--wires grpc,zmq] [--temperature 1] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from smg.backends.zmq.addresses import zmq_addresses
from tools.spawn import REPO_ROOT, Spawned, free_port, spawn_gateway

WINDOW = 2048
START_TIMEOUT = 300.0
ALIAS = "tiny-qwen3"
PROMPT = [{"role": "user", "content": "Tell me something about foxes."}]


def _engine_env(scratch: Path) -> dict[str, str]:
    return {**os.environ, "TMPDIR": str(scratch), "VLLM_CACHE_ROOT": str(scratch / "vllm-cache"),
            "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}


def _popen(args: list[str], scratch: Path, name: str, url: str) -> Spawned:
    log_path = scratch / f"{name}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=_engine_env(scratch), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
    return Spawned(proc, url, log_path)


def _wait_ready(gateway: Spawned, engine: Spawned) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            if httpx.get(f"{gateway.url}/readiness", timeout=5.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if engine.proc.poll() is not None:
            raise RuntimeError(f"the engine exited with {engine.proc.returncode}:\n{engine.log()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"not ready within {START_TIMEOUT:g} s:\n{gateway.log()[-3000:]}")
        time.sleep(0.5)


@contextmanager
def deployment(wire: str, python: str, model: Path) -> Iterator[Spawned]:
    """A gateway in front of a fresh vLLM engine over `wire`; yields the gateway. No tool or
    reasoning parser: the model id says Qwen3, whose reasoning parser holds text until it knows
    whether a `</think>` follows, and the wire is what is measured."""
    parsers = ["--tool-call-parser", "passthrough", "--reasoning-parser", "passthrough"]
    scratch = Path(tempfile.mkdtemp(prefix=f"smg-bench-{wire}-"))
    serving = ["--max-model-len", str(WINDOW), "--enforce-eager", "--dtype", "bfloat16"]
    spawned: list[Spawned] = []
    try:
        if wire == "grpc":
            port = free_port()
            engine = _popen([python, "-m", "vllm.entrypoints.launchers.grpc_server", "--model", str(model), "--host",
                             "127.0.0.1", "--port", str(port), "--served-model-name", ALIAS, *serving],
                            scratch, "vllm-grpc", f"grpc://127.0.0.1:{port}")
            spawned.append(engine)
            gateway = spawn_gateway([engine.url], extra=["--backend", "vllm", "--model-path", str(model),
                                                          "--disable-retries", *parsers], timeout=60.0)
            spawned.append(gateway)
        else:
            url = f"ipc://{scratch}/zmq/w0"
            gateway = spawn_gateway([url], extra=["--backend", "vllm", "--model-path", str(model), "--model-alias",
                                                  f"{ALIAS}={model}", "--disable-retries", *parsers], timeout=60.0)
            spawned.append(gateway)
            port_text = zmq_addresses(url).handshake.rsplit(":", 1)[1]
            engine = _popen([python, str(Path(python).parent / "vllm"), "serve", str(model), "--headless",
                             "--data-parallel-size", "1", "--data-parallel-size-local", "1",
                             "--data-parallel-address", "127.0.0.1", "--data-parallel-rpc-port", port_text, *serving],
                            scratch, "vllm-zmq", url)
            spawned.append(engine)
        _wait_ready(gateway, engine)
        yield gateway
    finally:
        for proc in reversed(spawned):
            proc.stop(timeout=15.0)
        shutil.rmtree(scratch, ignore_errors=True)


def _one(client: httpx.Client, max_tokens: int, temperature: float) -> tuple[float, float, float, int]:
    """(seconds to `message_start`, which the gateway sends on the engine's first token; to the
    first text delta; from `message_start` to the end; output tokens)."""
    body = {"model": ALIAS, "max_tokens": max_tokens, "stream": True, "temperature": temperature, "messages": PROMPT}
    started = time.perf_counter()
    first_token: float | None = None
    first_text: float | None = None
    tokens = 0
    with client.stream("POST", "/v1/messages", json=body) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if first_token is None and line.startswith("event: message_start"):
                first_token = time.perf_counter()
            elif first_text is None and line.startswith("event: content_block_delta"):
                first_text = time.perf_counter()
            elif line.startswith("data: ") and '"message_delta"' in line:
                tokens = int(json.loads(line[6:])["usage"]["output_tokens"])
    ended = time.perf_counter()
    first_token = first_token if first_token is not None else ended
    first_text = first_text if first_text is not None else ended
    return first_token - started, first_text - started, ended - first_token, tokens


def measure(url: str, requests: int, max_tokens: int, concurrency: int, temperature: float) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=120.0) as client:
        for _ in range(3):
            _one(client, max_tokens, temperature)  # warm-up: templates, caches, the engine's first batches

    def run(_: int) -> tuple[float, float, float, int]:
        with httpx.Client(base_url=url, timeout=120.0) as own:
            return _one(own, max_tokens, temperature)

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(run, range(requests)))
    wall = time.perf_counter() - started
    ttft = sorted(r[0] * 1000 for r in results)
    text = sorted(r[1] * 1000 for r in results)
    rates = sorted(r[3] / r[2] for r in results if r[2] > 0 and r[3] > 1)
    total = sum(r[3] for r in results)
    return {
        "concurrency": concurrency,
        "requests": len(results),
        "output_tokens": total,
        "ttft_ms_p50": statistics.median(ttft),
        "ttft_ms_p90": ttft[min(len(ttft) - 1, int(len(ttft) * 0.9))],
        "first_text_ms_p50": statistics.median(text),
        "decode_tok_s_p50": statistics.median(rates) if rates else 0.0,
        "aggregate_tok_s": total / wall,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.wires", description=__doc__)
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--wires", default="grpc,zmq")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",") if c]
    rows: list[dict[str, Any]] = []
    for wire in [w for w in args.wires.split(",") if w]:
        with deployment(wire, args.vllm_python, args.model.resolve()) as gateway:
            for level in levels:
                measured = measure(gateway.url, args.requests, args.max_tokens, level, args.temperature)
                row = {"wire": wire, **measured}
                rows.append(row)
                print(
                    f"{wire:5} c={level:<3} n={row['requests']:<4} TTFT p50 {row['ttft_ms_p50']:7.1f} ms "
                    f"p90 {row['ttft_ms_p90']:7.1f} ms | first text p50 {row['first_text_ms_p50']:7.1f} ms | "
                    f"decode p50 {row['decode_tok_s_p50']:7.1f} tok/s | "
                    f"aggregate {row['aggregate_tok_s']:7.1f} tok/s",
                    flush=True,
                )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
