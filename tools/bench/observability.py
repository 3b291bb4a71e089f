"""What metrics, tracing and JSON logs cost: the gateway's CPU time per request with each of them
on, against the same gateway with them off.

One worker (the scripted HTTP worker, or the scripted gRPC engine with `--grpc`) and one gateway
per configuration, one after the other; each gateway gets a warm-up, then `--requests` requests
one at a time (half streamed), and the figure is the gateway process's user+system CPU time
(`/proc/PID/stat`) over the measured stretch, divided by the requests. Spans go to a real OTLP
receiver in this process (its CPU is not the gateway's). The journal is off, so that its writer
thread does not blur the figure. Every process started here is stopped on the way out.

Run: ``python -m tools.bench.observability [--grpc] [--requests N] [--reps R] [--configs off,metrics]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import httpx

from tools.otlp_receiver import OtlpReceiver
from tools.spawn import REPO_ROOT, Spawned, free_port, spawn_engine, spawn_gateway, spawn_worker

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _configs(receiver: str) -> dict[str, list[str]]:
    metrics = ["--prometheus-host", "127.0.0.1", "--prometheus-port", str(free_port())]
    trace = ["--enable-trace", "--otlp-traces-endpoint", receiver]
    return {
        "off": [],
        "metrics": metrics,
        "tracing": trace,
        "metrics+tracing+log-json": [*metrics, *trace, "--log-json"],
    }


def _drive(url: str, body: dict[str, object], n: int) -> None:
    with httpx.Client(base_url=url, timeout=60.0) as client:
        for i in range(n):
            if i % 2:
                with client.stream("POST", "/v1/messages", json={**body, "stream": True}) as response:
                    response.read()
            else:
                response = client.post("/v1/messages", json=body)
            if response.status_code != 200:
                raise RuntimeError(f"request failed: {response.status_code} {response.text[:200]}")


def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {}
    with OtlpReceiver() as receiver:
        if args.grpc:
            model = "bench-model"
            upstream = spawn_engine(
                "sglang", model_path=REPO_ROOT / "tests" / "fixtures" / "qwen3", extra=["--served-model-name", model]
            )
            extra = ["--model-path", str(REPO_ROOT / "tests" / "fixtures" / "qwen3")]
        else:
            model = "bench-model"
            upstream = spawn_worker(models=[model])
            extra = []
        body: dict[str, object] = {
            "model": model,
            "max_tokens": 16,
            "messages": [{"role": "user", "content": "a short question about nothing in particular"}],
        }
        try:
            for _ in range(args.reps):
                for name, flags in _configs(receiver.endpoint).items():
                    if args.configs and name not in args.configs:
                        continue
                    gw: Spawned = spawn_gateway(
                        [upstream.url],
                        extra=["--disable-retries", *extra, *flags],
                        env={"OTEL_BSP_SCHEDULE_DELAY": "200"},
                    )
                    try:
                        _drive(gw.url, body, args.warmup)
                        before = cpu_seconds(gw.proc.pid)
                        _drive(gw.url, body, args.requests)
                        after = cpu_seconds(gw.proc.pid)
                    finally:
                        gw.stop()
                    results.setdefault(name, []).append((after - before) / args.requests * 1e6)
        finally:
            upstream.stop()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.observability", description=__doc__)
    parser.add_argument("--grpc", action="store_true", help="the scripted gRPC engine instead of the HTTP worker")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--configs", type=lambda v: v.split(","), default=None, help="e.g. off,metrics")
    args = parser.parse_args(argv)
    results = measure(args)
    base = statistics.median(results["off"])
    print(
        f"{'gRPC engine' if args.grpc else 'HTTP relay'}: gateway CPU per request, {args.requests} requests x "
        f"{args.reps} (half streamed, concurrency 1)"
    )
    for name, values in results.items():
        median = statistics.median(values)
        print(
            f"  {name:<26} {median:8.0f} us  ({median - base:+.0f} us, {100 * (median - base) / base:+.1f}%)"
            f"   runs: {', '.join(f'{v:.0f}' for v in values)}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
