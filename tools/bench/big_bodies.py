"""What one huge body costs the gateway: CPU seconds and peak resident memory, from /proc.

``prompt``: one gateway in front of the scripted gRPC engine (a 4,096-token window), and per
case one fresh gateway that is sent one request whose 20 MiB sit in one part of the prompt
(system, a tool description, ...): the gateway's CPU seconds for it and its peak RSS.

``relay``: one gateway in front of two scripted HTTP workers; rounds of N concurrent 20 MiB
bodies, the gateway's RSS and CPU after each round, and the latency of small requests sent
meanwhile to the other worker (median and p99) against their latency on the idle gateway, with
the ratio.

``count``: one gateway in front of the scripted gRPC engine; N concurrent count_tokens of a big
prompt, the gateway's CPU for them, and small requests meanwhile against their idle latency.

Run: ``python -m tools.bench.big_bodies prompt [--cases system,tool] [--mib 20] [--root DIR]``,
``python -m tools.bench.big_bodies count [--counts 3] [--mib 20] [--root DIR]``
or ``python -m tools.bench.big_bodies relay [--rounds 2] [--bodies 40] [--mib 20] [--settle S] [--root DIR]``
(``--root``: measure another checkout's gateway, e.g. a "before").
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson

from tools.bench.common import csv_list
from tools.spawn import REPO_ROOT, spawn_engine, spawn_gateway, spawn_worker

QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
MODEL = "qwen3-fixture"
HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}


def _cpu_split(pid: int) -> tuple[float, float]:
    """User and system CPU seconds of a process."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def _cpu_seconds(pid: int) -> float:
    return sum(_cpu_split(pid))


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]


def _figures(samples: list[float]) -> str:
    if not samples:
        return "none sent"
    return f"median {statistics.median(samples) * 1e3:7.1f} ms, p99 {_p99(samples) * 1e3:7.1f} ms ({len(samples)} sent)"


def _status_mb(pid: int, key: str) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def _prompt_body(case: str, text: str) -> dict[str, Any]:
    user: dict[str, Any] = {"role": "user", "content": "hi"}
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 8, "messages": [user]}
    if case == "system":
        body["system"] = text
    elif case == "tool":
        body["tools"] = [{"name": "t", "description": text, "input_schema": {"type": "object"}}]
    elif case == "schema":
        body["tools"] = [{"name": "t", "input_schema": {"type": "object", "description": text}}]
    elif case == "assistant":
        body["messages"] = [user, {"role": "assistant", "content": text}, {"role": "user", "content": "go on"}]
    elif case == "tool_use":
        use = {"type": "tool_use", "id": "toolu_1", "name": "t", "input": {"q": text}}
        body["messages"] = [user, {"role": "assistant", "content": [use]}, _result([{"type": "text", "text": "ok"}])]
    elif case == "tool_result":
        body["messages"] = [user, _use(), _result([{"type": "text", "text": text}])]
    elif case == "user":
        body["messages"] = [{"role": "user", "content": text}]
    else:
        raise SystemExit(f"unknown case {case}")
    return body


def _use() -> dict[str, Any]:
    return {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]}


def _result(content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": content}]}


def prompt(args: argparse.Namespace) -> None:
    text = "word " * ((args.mib << 20) // 5)
    engine = spawn_engine(
        "sglang", model_path=QWEN3, extra=["--served-model-name", MODEL, "--max-context-length", "4096"]
    )
    try:
        for case in csv_list(args.cases):
            raw = orjson.dumps(_prompt_body(case, text))
            with tempfile.TemporaryDirectory() as tmp:
                gateway = spawn_gateway(
                    [engine.url], journal=Path(tmp) / "j.db", extra=["--model-path", str(QWEN3)], root=args.root
                )
                try:
                    pid = gateway.proc.pid
                    rss0, cpu0, t0 = _status_mb(pid, "VmRSS"), _cpu_seconds(pid), time.perf_counter()
                    with httpx.Client(base_url=gateway.url, timeout=600) as client:
                        reply = client.post("/v1/messages", content=raw, headers=HEADERS)
                    wall, cpu = time.perf_counter() - t0, _cpu_seconds(pid) - cpu0
                    code = reply.headers.get("x-smg-error-code", "")
                    print(
                        f"{case:12} {reply.status_code} {code:24} wall {wall:6.2f} s  cpu {cpu:6.2f} s  "
                        f"rss before {rss0:7.1f} MB  peak {_status_mb(pid, 'VmHWM'):7.1f} MB",
                        flush=True,
                    )
                finally:
                    gateway.stop()
    finally:
        engine.stop()


def _timed(client: httpx.Client, raw: bytes) -> float:
    t0 = time.perf_counter()
    reply = client.post("/v1/messages", content=raw, headers=HEADERS)
    reply.raise_for_status()
    return time.perf_counter() - t0


def _probe(client: httpx.Client, raw: bytes, stop: threading.Event, into: list[float]) -> None:
    while not stop.is_set():
        into.append(_timed(client, raw))


def _send_bodies(bodies: int, mib: int, url: str) -> None:
    """The big bodies, sent from a process of their own: the probe's latency is the gateway's,
    not the wait of the benchmark's own threads for its GIL."""
    big = orjson.dumps(
        {"model": "big", "max_tokens": 8, "messages": [{"role": "user", "content": "word " * ((mib << 20) // 5)}]}
    )
    _concurrently(bodies, lambda c: _timed(c, big), url)


def relay(args: argparse.Namespace) -> None:
    small = orjson.dumps({"model": "small", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    # The small requests go to a worker of their own: what is measured is the gateway's delay,
    # not the big bodies' worker's.
    big_worker, small_worker = spawn_worker(models=["big"]), spawn_worker(models=["small"])
    gateway = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # Forty bodies of 20 MiB take longer than the default 30 s to arrive on a busy machine.
            slow = ["--header-read-timeout-secs", "600"]
            workers = [big_worker.url, small_worker.url]
            gateway = spawn_gateway(workers, journal=Path(tmp) / "j.db", extra=slow, root=args.root)
            pid = gateway.proc.pid
            with httpx.Client(base_url=gateway.url, timeout=600) as client:
                idle = [_timed(client, small) for _ in range(100)]
            print(f"idle small request:          {_figures(idle)}; rss {_status_mb(pid, 'VmRSS')} MB")
            for n in range(1, args.rounds + 1):
                busy: list[float] = []
                stop = threading.Event()
                with httpx.Client(base_url=gateway.url, timeout=600) as probe_client:
                    prober = threading.Thread(target=_probe, args=(probe_client, small, stop, busy))
                    prober.start()
                    (user0, sys0), t0 = _cpu_split(pid), time.perf_counter()
                    sender = multiprocessing.get_context("spawn").Process(
                        target=_send_bodies, args=(args.bodies, args.mib, gateway.url)
                    )
                    sender.start()
                    sender.join()
                    wall = time.perf_counter() - t0
                    stop.set()
                    prober.join()
                if sender.exitcode != 0:
                    raise SystemExit(f"the big bodies' sender failed ({sender.exitcode})")
                user1, sys1 = _cpu_split(pid)
                rss, peak = _status_mb(pid, "VmRSS"), _status_mb(pid, "VmHWM")
                print(
                    f"round {n}: {args.bodies} x {args.mib} MiB in {wall:.1f} s; gateway cpu "
                    f"user {user1 - user0:.1f} s, sys {sys1 - sys0:.1f} s; rss after {rss} MB, peak {peak} MB",
                    flush=True,
                )
                print(f"  small request meanwhile:   {_figures(busy)}")
                if busy:
                    ratio = statistics.median(busy) / statistics.median(idle)
                    print(f"  under load / idle:         median x{ratio:.1f}, p99 x{_p99(busy) / _p99(idle):.1f}")
                time.sleep(args.settle)  # the journal commits what it holds; freed memory is released
                print(f"  rss {args.settle:g} s later: {_status_mb(pid, 'VmRSS')} MB", flush=True)
    finally:
        if gateway is not None:
            gateway.stop()
        big_worker.stop()
        small_worker.stop()


def _concurrently(n: int, one: Callable[[httpx.Client], float], url: str) -> None:
    errors: list[BaseException] = []

    def run() -> None:
        try:
            with httpx.Client(base_url=url, timeout=600) as client:
                one(client)
        except BaseException as exc:  # reported below, after every thread ended
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]


def _send_counts(counts: int, mib: int, url: str) -> None:
    """The big count_tokens requests, from a process of their own (see `_send_bodies`)."""
    big = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "word " * ((mib << 20) // 5)}]})

    def one(client: httpx.Client) -> float:
        t0 = time.perf_counter()
        client.post("/v1/messages/count_tokens", content=big, headers=HEADERS).raise_for_status()
        return time.perf_counter() - t0

    _concurrently(counts, one, url)


def count(args: argparse.Namespace) -> None:
    """N concurrent count_tokens of a big prompt on one gateway in front of the scripted gRPC
    engine, and small Messages requests meanwhile against their latency on the idle gateway."""
    small = orjson.dumps({"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]})
    engine = spawn_engine("sglang", model_path=QWEN3, extra=["--served-model-name", MODEL])
    gateway = None
    try:
        with tempfile.TemporaryDirectory() as tmp:
            gateway = spawn_gateway(
                [engine.url],
                journal=Path(tmp) / "j.db",
                extra=["--model-path", str(QWEN3), "--header-read-timeout-secs", "600"],
                root=args.root,
            )
            pid = gateway.proc.pid
            with httpx.Client(base_url=gateway.url, timeout=600) as client:
                idle = [_timed(client, small) for _ in range(100)]
            print(f"idle small request:          {_figures(idle)}")
            busy: list[float] = []
            stop = threading.Event()
            with httpx.Client(base_url=gateway.url, timeout=600) as probe_client:
                prober = threading.Thread(target=_probe, args=(probe_client, small, stop, busy))
                prober.start()
                (user0, sys0), t0 = _cpu_split(pid), time.perf_counter()
                sender = multiprocessing.get_context("spawn").Process(
                    target=_send_counts, args=(args.counts, args.mib, gateway.url)
                )
                sender.start()
                sender.join()
                wall = time.perf_counter() - t0
                stop.set()
                prober.join()
            if sender.exitcode != 0:
                raise SystemExit(f"the count_tokens sender failed ({sender.exitcode})")
            user1, sys1 = _cpu_split(pid)
            print(
                f"{args.counts} x count_tokens of {args.mib} MiB in {wall:.1f} s; gateway cpu "
                f"user {user1 - user0:.1f} s, sys {sys1 - sys0:.1f} s; peak {_status_mb(pid, 'VmHWM')} MB"
            )
            print(f"  small request meanwhile:   {_figures(busy)}")
            if busy:
                ratio = statistics.median(busy) / statistics.median(idle)
                print(f"  under load / idle:         median x{ratio:.1f}, p99 x{_p99(busy) / _p99(idle):.1f}")
    finally:
        if gateway is not None:
            gateway.stop()
        engine.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="mode", required=True)
    p = sub.add_parser("prompt")
    p.add_argument("--cases", default="system,tool")
    p.add_argument("--mib", type=int, default=20)
    p.add_argument("--root", type=Path, default=None)
    r = sub.add_parser("relay")
    r.add_argument("--rounds", type=int, default=2)
    r.add_argument("--bodies", type=int, default=40)
    r.add_argument("--mib", type=int, default=20)
    r.add_argument("--settle", type=float, default=10.0)
    r.add_argument("--root", type=Path, default=None)
    c = sub.add_parser("count")
    c.add_argument("--counts", type=int, default=3)
    c.add_argument("--mib", type=int, default=20)
    c.add_argument("--root", type=Path, default=None)
    args = parser.parse_args()
    {"prompt": prompt, "relay": relay, "count": count}[args.mode](args)


if __name__ == "__main__":
    main()
