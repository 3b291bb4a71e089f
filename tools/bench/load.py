"""The bench's load generator: closed-loop ``POST /v1/messages`` traffic at a fixed concurrency.

It runs in a process of its own (on aiohttp and, when installed, uvloop) so it shares no event
loop with the servers it measures. A job sends either a fixed number of requests or as many as fit
in a duration, from ``concurrency`` clients that each send their next request as soon as the last
one ends, and reports requests/s, latency percentiles (for streams: the full-stream time, plus the
time to the first body byte) and every error: a status other than 200, a body that is not a
message, a stream that ends without ``message_stop`` or carries an ``error`` event, a timeout or
a broken connection. Latency figures cover the successful requests; errors are counted apart.

Run once: ``python -m tools.bench.load --url URL [--stream] [--concurrency C]
[--requests N | --duration S] [--warmup S] [--cpu-pid PID ...]`` prints one JSON object;
``--cpu-pid`` adds the CPU time that process and its children spent per measured request and
their RSS (read from /proc). ``--serve`` reads jobs as JSON lines on stdin and answers each
with a JSON line, so a driver pays the start-up once.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import aiohttp
import orjson

from tools.bench.common import on_uvloop, serve_jobs

MODEL = "scripted-model"
_HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
_TAIL = 128  # bytes of a stream kept to find its closing event
_SAMPLES = 5  # error descriptions kept per job


@dataclass
class Job:
    """One measurement. With neither ``requests`` nor ``duration`` it runs for one second."""

    url: str
    stream: bool = False
    concurrency: int = 1
    requests: int | None = None
    duration: float | None = None
    model: str = MODEL
    prompt_words: int = 32
    timeout: float = 30.0
    warmup: float = 0.0
    watch_pids: list[int] = field(default_factory=list)

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Job:
        known = {f.name for f in fields(cls)}
        unknown = set(obj) - known
        if unknown:
            raise ValueError(f"unknown job keys: {sorted(unknown)}")
        return cls(**obj)


def request_body(model: str, stream: bool, prompt_words: int) -> bytes:
    """A small Messages request; the scripted worker echoes it, one stream event per word."""
    text = " ".join(f"word{i}" for i in range(prompt_words))
    body = {"model": model, "max_tokens": 256, "messages": [{"role": "user", "content": text}], "stream": stream}
    return orjson.dumps(body)


def percentiles(values: list[float], qs: tuple[float, ...] = (0.5, 0.9, 0.99)) -> dict[str, float]:
    """Nearest-rank percentiles of ``values`` (in seconds) as milliseconds, plus mean and max."""
    if not values:
        return {}
    ordered = sorted(values)
    n = len(ordered)
    out = {f"p{round(q * 100)}": ordered[max(0, math.ceil(q * n) - 1)] * 1000 for q in qs}
    out["mean"] = sum(ordered) / n * 1000
    out["max"] = ordered[-1] * 1000
    return {k: round(v, 3) for k, v in out.items()}


class _Tally:
    """What one job observed."""

    def __init__(self) -> None:
        self.latency: list[float] = []
        self.ttfb: list[float] = []
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] += 1
        if len(self.samples) < _SAMPLES:
            self.samples.append(f"{kind}: {detail}"[:300] if detail else kind)


async def _one(session: aiohttp.ClientSession, url: str, body: bytes, stream: bool, tally: _Tally) -> None:
    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body) as resp:
            if resp.status != 200:
                text = (await resp.read())[:200].decode("utf-8", "replace")
                tally.error(f"status {resp.status}", text)
                return
            if not stream:
                data = await resp.read()
                end = time.perf_counter()
                try:
                    ok = orjson.loads(data).get("type") == "message"
                except (orjson.JSONDecodeError, AttributeError):
                    ok = False
                if not ok:
                    tally.error("not a message", data[:200].decode("utf-8", "replace"))
                    return
                tally.latency.append(end - t0)
                return
            if not resp.headers.get("content-type", "").startswith("text/event-stream"):
                tally.error("not an event stream", resp.headers.get("content-type", ""))
                await resp.read()
                return
            first: float | None = None
            tail = b""
            failed = False
            async for chunk in resp.content.iter_any():
                if first is None:
                    first = time.perf_counter()
                failed = failed or b"event: error" in chunk
                tail = (tail + chunk)[-_TAIL:]
            end = time.perf_counter()
            if failed:
                tally.error("error event in stream", tail.decode("utf-8", "replace"))
            elif first is None or b"message_stop" not in tail:
                tally.error("broken stream", tail.decode("utf-8", "replace"))
            else:
                tally.ttfb.append(first - t0)
                tally.latency.append(end - t0)
    except TimeoutError:
        tally.error("timeout")
    except (aiohttp.ClientError, OSError) as exc:
        tally.error(type(exc).__name__, str(exc))


def _tree(pid: int) -> list[int]:
    """``pid`` and its live descendants (a gateway's helper processes count as the gateway)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        try:
            for task in os.listdir(f"/proc/{current}/task"):
                with open(f"/proc/{current}/task/{task}/children", "rb") as f:
                    todo.extend(int(child) for child in f.read().split())
        except OSError:
            continue
    return out


def _cpu_seconds(pid: int) -> float | None:
    """CPU time of process ``pid`` and its descendants, all their threads, from /proc; None
    elsewhere. The scheduler's nanosecond count per thread, so a short run on a gateway that
    spends a few hundred microseconds per request is not rounded to the 10 ms clock tick."""
    total = 0
    for index, member in enumerate(_tree(pid)):
        try:
            tasks = os.listdir(f"/proc/{member}/task")
        except OSError:
            if index == 0:
                return None
            continue
        for task in tasks:
            try:
                with open(f"/proc/{member}/task/{task}/schedstat", "rb") as f:
                    total += int(f.read().split()[0])
            except (OSError, ValueError, IndexError):
                continue
    return total / 1e9


def rss_mb(pid: int) -> float | None:
    """Resident memory of process ``pid`` plus what its descendants hold privately (pages a forked
    child still shares with its parent are counted once), in MB, from /proc; None elsewhere."""
    total = 0
    for index, member in enumerate(_tree(pid)):
        fields = ("VmRSS:",) if index == 0 else ("Private_Clean:", "Private_Dirty:")
        name = "status" if index == 0 else "smaps_rollup"
        try:
            with open(f"/proc/{member}/{name}", "rb") as f:
                total += sum(int(line.split()[1]) for line in f if line.decode().startswith(fields))
        except OSError:
            if index == 0:
                return None
    return round(total / 1024, 1)


async def _phase(
    session: aiohttp.ClientSession, job: Job, body: bytes, requests: int | None, duration: float | None
) -> tuple[_Tally, int, float]:
    """Send ``requests`` requests, or as many as start within ``duration``; return the tally,
    the number sent and the elapsed time (until the last one ended)."""
    url = job.url.rstrip("/") + "/v1/messages"
    tally = _Tally()
    started = 0
    t0 = time.perf_counter()
    deadline = t0 + duration if duration is not None else math.inf

    async def client() -> None:
        nonlocal started
        while (requests is None or started < requests) and time.perf_counter() < deadline:
            started += 1
            await _one(session, url, body, job.stream, tally)

    await asyncio.gather(*(client() for _ in range(job.concurrency)))
    return tally, started, time.perf_counter() - t0


def _summary(tally: _Tally, sent: int) -> dict[str, Any]:
    return {
        "requests": sent,
        "ok": len(tally.latency),
        "errors": sum(tally.errors.values()),
        "error_kinds": dict(tally.errors),
        "error_samples": tally.samples,
    }


async def run_job(job: Job) -> dict[str, Any]:
    """Warm up, then measure; return the figures as a JSON-able dict.

    Both phases share one client session, so the measured phase starts on warm connections.
    ``watch_pids`` processes' CPU time is read around the measured phase only.
    """
    if job.concurrency < 1:
        raise ValueError("concurrency must be at least 1")
    body = request_body(job.model, job.stream, job.prompt_words)
    duration = job.duration if job.duration is not None or job.requests is not None else 1.0
    connector = aiohttp.TCPConnector(limit=job.concurrency)
    session = aiohttp.ClientSession(
        connector=connector,
        headers=_HEADERS,
        timeout=aiohttp.ClientTimeout(total=job.timeout),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )
    async with session:
        warm = None
        if job.warmup > 0:
            warm_tally, warm_sent, _ = await _phase(session, job, body, None, job.warmup)
            warm = _summary(warm_tally, warm_sent)
        watched = {pid: _cpu_seconds(pid) for pid in job.watch_pids}
        cpu0 = time.process_time()
        tally, sent, elapsed = await _phase(session, job, body, job.requests, duration)
        cpu = time.process_time() - cpu0
        watched_after = {pid: _cpu_seconds(pid) for pid in job.watch_pids}
        rss = {str(pid): rss_mb(pid) for pid in job.watch_pids}  # connections still open
    ok = len(tally.latency)
    result: dict[str, Any] = {
        "job": asdict(job),
        **_summary(tally, sent),
        "elapsed_s": round(elapsed, 4),
        "rps": round(ok / elapsed, 2) if elapsed > 0 else 0.0,
        "latency_ms": percentiles(tally.latency),
        "generator_cpu": round(cpu / elapsed, 3) if elapsed > 0 else 0.0,
    }
    if job.stream:
        result["ttfb_ms"] = percentiles(tally.ttfb)
    if watched:
        result["cpu_us_per_request"] = {
            str(pid): _per_request(watched[pid], watched_after[pid], sent) for pid in watched
        }
        result["rss_mb"] = rss
    if warm is not None:
        result["warmup"] = warm
    return result


def _per_request(before: float | None, after: float | None, sent: int) -> float | None:
    """Microseconds of CPU per request sent, from two readings."""
    if before is None or after is None or not sent:
        return None
    return round((after - before) / sent * 1e6, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.load", description=__doc__)
    parser.add_argument("--serve", action="store_true", help="read jobs as JSON lines on stdin")
    parser.add_argument("--url", help="base URL of a gateway or worker")
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--concurrency", type=int, default=1)
    parser.add_argument("--requests", type=int, help="send this many requests")
    parser.add_argument("--duration", type=float, help="send requests for this many seconds (default 1)")
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds of warm-up first")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--prompt-words", type=int, default=32)
    parser.add_argument("--timeout", type=float, default=30.0, help="per-request timeout")
    parser.add_argument("--cpu-pid", type=int, action="append", help="report this process's CPU per request")
    args = parser.parse_args(argv)
    if args.serve:
        serve_jobs(lambda job: on_uvloop(run_job(Job.from_dict(job))))
        return
    if not args.url:
        parser.error("--url is required (or --serve)")
    job = Job(
        url=args.url,
        stream=args.stream,
        concurrency=args.concurrency,
        requests=args.requests,
        duration=args.duration,
        model=args.model,
        prompt_words=args.prompt_words,
        timeout=args.timeout,
        warmup=args.warmup,
        watch_pids=args.cpu_pid or [],
    )
    sys.stdout.buffer.write(orjson.dumps(on_uvloop(run_job(job)), option=orjson.OPT_INDENT_2) + b"\n")


if __name__ == "__main__":
    main()
