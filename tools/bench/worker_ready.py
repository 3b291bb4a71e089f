"""How long a gRPC worker added with `POST /workers` takes to answer its first request.

A gateway starts with no worker; an engine is started beside it (the scripted vLLM engine by
default, or a real one named with ``--engine-url``); then, per round, the worker is added with
``POST /workers`` and ``POST /v1/messages`` (``max_tokens`` 1) is sent in a loop, each request
right after the previous answer, until one answers 200. The figure is the time from
`POST /workers` returning to that 200, and how many answers were not 200 before it. The scripted
engine reports a model path the gateway cannot read, so the tokenizer is fetched with
`GetTokenizer` and loaded, as for an engine on another machine. Each round has its own gateway
and its own empty tokenizer cache (`XDG_CACHE_HOME`), so every round is a cold start; the worker
is added ``--settle`` seconds after the gateway started (a running gateway; 0: at once).

Run: ``python -m tools.bench.worker_ready [--rounds N] [--engine-url grpc://H:P --model NAME]
[--root DIR] [--settle S]`` (``--root``: the gateway of another checkout, e.g. the code before a change).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import httpx
from rich.console import Console

from tools.bench.common import load_average, stop_all
from tools.spawn import REPO_ROOT, Spawned, spawn_engine, spawn_gateway

MODEL = "qwen3-bench"
QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
USER = [{"role": "user", "content": "Hi"}]


def one_round(
    engine_url: str, model: str, root: Path | None, workdir: Path, settle: float
) -> tuple[float, int, dict[str, int]]:
    """Seconds from `POST /workers` returning to the first 200, and the refusals before it."""
    cache = Path(tempfile.mkdtemp(prefix="cache-", dir=workdir))
    env = {"XDG_CACHE_HOME": str(cache), **({"PYTHONPATH": str(root)} if root is not None else {})}
    gateway = spawn_gateway([], extra=["--enable-igw"], env=env, root=root, timeout=60.0)
    try:
        time.sleep(settle)  # a gateway that has been running a while, as when an operator adds a worker
        with httpx.Client(base_url=gateway.url, timeout=30.0) as client:
            body = {"model": model, "max_tokens": 1, "messages": USER}
            added = client.post("/workers", json={"url": engine_url})
            start = time.perf_counter()
            assert added.status_code in (200, 201, 202), added.text
            refusals: dict[str, int] = {}
            while True:
                reply = client.post("/v1/messages", json=body)
                if reply.status_code == 200:
                    return time.perf_counter() - start, sum(refusals.values()), refusals
                key = f"{reply.status_code} {reply.headers.get('x-smg-error-code', '')}".strip()
                refusals[key] = refusals.get(key, 0) + 1
                if time.perf_counter() - start > 60.0:
                    raise RuntimeError(f"no 200 within 60 s: {reply.status_code} {reply.text}")
    finally:
        gateway.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.worker_ready", description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--engine-url", default=None, help="a running engine (default: a scripted vLLM engine)")
    parser.add_argument("--model", default=MODEL, help="the model the engine serves (with --engine-url)")
    parser.add_argument("--root", type=Path, default=None, help="run the gateway of this checkout")
    parser.add_argument("--settle", type=float, default=5.0, help="seconds from the gateway start to POST /workers")
    args = parser.parse_args(argv)
    console = Console()
    workdir = Path(tempfile.mkdtemp(prefix="smg-bench-ready-"))
    started: list[Spawned] = []
    failed = True
    try:
        engine_url, model = args.engine_url, args.model
        if engine_url is None:
            engine = spawn_engine(
                "vllm",
                model_path=QWEN3,
                extra=["--served-model-name", MODEL, "--reported-model-path", "/nonexistent/qwen3"],
            )
            started.append(engine)
            engine_url, model = engine.url, MODEL
        times: list[float] = []
        for index in range(args.rounds):
            seconds, refused, kinds = one_round(engine_url, model, args.root, workdir, args.settle)
            times.append(seconds)
            console.print(f"round {index + 1}: first 200 after {seconds * 1000:.0f} ms, {refused} refused {kinds}")
        console.print(
            f"POST /workers → first 200: median {statistics.median(times) * 1000:.0f} ms, "
            f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms over {len(times)} rounds "
            f"(load {load_average()})"
        )
        failed = False
    finally:
        stop_all(started, workdir, failed=failed, console=console)


if __name__ == "__main__":
    main()
