"""The gRPC path bench: tokens/s through the gateway against the engine's own rate, in one run.

A scripted SGLang engine (the qwen3 fixture tokenizer) answers every Generate with the same long
answer (``--output-tokens`` ordinary tokens, one per chunk, no delay, cut at ``max_tokens`` so the
finish is "length"), so the gateway's per-token work (detokenizing, stop matching, SSE framing,
the journal) dominates. Two gateways run in front of it: journal on and ``--no-journal``.

Targets, measured round after round in each scenario (streaming or not, at each concurrency):
- ``direct``: a grpc.aio client (``smg.backends.grpc.engines.connect``) calling Generate on the
  engine with the very prompt ids and text the gateway sends (read back from the engine);
- ``gw+J`` / ``gw-J``: ``POST /v1/messages`` to a gateway, output tokens read from the final usage.

The load comes from this module run with ``--serve`` in a process of its own (aiohttp on uvloop for
the gateways; grpc.aio on the default asyncio loop for the engine, where it is faster). Per run it
reports output tokens/s, requests/s, latency, the time to the first SSE byte (TTFE) and to the
first text delta (for ``direct``: the first chunk), and the CPU time the gateway and the engine
spent per 1,000 output tokens, read from /proc around the measured stretch. Gateways run with
``--disable-retries``; a request that fails, or answers another number of tokens, is counted as
failed. Every process started here is stopped on the way out, on errors and Ctrl-C too.

Run: ``python -m tools.bench.grpc [--quick] [--duration S | --requests N] [--reps R]
[--concurrency 1,16,64] [--modes stream,json] [--output-tokens N] [--json PATH]``.
Exit status 1 when any request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich import box
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from rich.text import Text

from tools.bench import reference
from tools.bench.common import csv_ints, csv_list, load_average, on_uvloop, run_and_report, serve_jobs, stop_all
from tools.bench.load import _cpu_seconds, percentiles, rss_mb
from tools.bench.relay import Generator
from tools.engine_control import EngineControl
from tools.spawn import REPO_ROOT, Spawned, spawn_engine, spawn_gateway

QWEN3 = REPO_ROOT / "tests" / "fixtures" / "qwen3"
MODEL = "qwen3-fixture"
WINDOW = 4096
PROMPT = "Tell me a long story about a fox and a dog."
ANSWER = (
    "Once upon a time, a quick brown fox lived at the edge of a quiet village. Every morning she jumped over "
    "the lazy dog that slept by the old stone wall, and every evening the dog pretended not to notice. "
)
DEFAULTS: dict[str, Any] = {"duration": 2.0, "warmup": 0.5, "reps": 3, "output_tokens": 256, "concurrency": [1, 16, 64]}
QUICK: dict[str, Any] = {"duration": 0.2, "warmup": 0.05, "reps": 1, "output_tokens": 64, "concurrency": [1, 8]}
PARSERS = ("qwen", "qwen3")  # tool-call and reasoning parsers, the same for both gateways
_HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01"}
_TAIL = 1024  # bytes of a stream kept to read its closing message_delta
_SAMPLES = 5  # error descriptions kept per run


@dataclass(frozen=True)
class Target:
    """The engine itself or a gateway configuration."""

    key: str
    label: str
    journal: bool | None = None  # None: the engine directly (or the reference gateway)
    workers: int = 1  # gateway processes (`--workers`)
    reference: bool = False  # the reference gateway (Rust smg from PyPI), not this one


DIRECT = Target("direct", "a grpc.aio client on the engine itself")
REFERENCE = Target("ref", f"the reference gateway (Rust smg {reference.VERSION} from PyPI)", reference=True)
TARGETS = (
    DIRECT,
    REFERENCE,
    Target("gw+J", "gateway, journal on", True),
    Target("gw-J", "gateway, --no-journal", False),
    Target("gw+Jx2", "gateway, journal on, --workers 2", True, workers=2),
)
DEFAULT_TARGETS = ("direct", "gw+J", "gw-J")  # `--compare` adds ref and gw+Jx2


# --- the load generator (runs in its own process) ------------------------------------------------


@dataclass
class Job:
    """One measured run against one target."""

    kind: str  # "direct" | "gateway"
    url: str  # grpc://host:port or http://host:port
    stream: bool
    concurrency: int
    output_tokens: int
    prompt_ids: list[int]
    prompt_text: str = ""
    model: str = MODEL
    requests: int | None = None
    duration: float | None = None
    warmup: float = 0.0
    timeout: float = 60.0
    watch_pids: dict[str, list[int]] = field(default_factory=dict)  # name -> pids whose CPU time is summed

    @classmethod
    def from_dict(cls, obj: dict[str, Any]) -> Job:
        unknown = set(obj) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"unknown job keys: {sorted(unknown)}")
        return cls(**obj)


class _Tally:
    """What one phase of a job observed (times in seconds)."""

    def __init__(self, expected_tokens: int) -> None:
        self.expected = expected_tokens
        self.tokens = 0
        self.latency: list[float] = []
        self.first_event: list[float] = []
        self.first_token: list[float] = []
        self.errors: Counter[str] = Counter()
        self.samples: list[str] = []

    def error(self, kind: str, detail: str = "") -> None:
        self.errors[kind] += 1
        if len(self.samples) < _SAMPLES:
            self.samples.append(f"{kind}: {detail}"[:300] if detail else kind)

    def ok(self, tokens: int, latency: float, first_event: float | None, first_token: float | None) -> None:
        if tokens != self.expected:
            self.error("wrong token count", f"{tokens} output tokens, expected {self.expected}")
            return
        self.tokens += tokens
        self.latency.append(latency)
        if first_event is not None:
            self.first_event.append(first_event)
        if first_token is not None:
            self.first_token.append(first_token)


async def _direct_one(client: Any, job: Job, tally: _Tally) -> None:
    from smg.backends.grpc.types import EngineDone, EngineError, GenerateCall

    call = GenerateCall(
        request_id=f"bench-{uuid.uuid4().hex}",
        input_ids=job.prompt_ids,
        text=job.prompt_text,
        max_tokens=job.output_tokens,
        stream=job.stream,
    )
    t0 = time.perf_counter()
    first: float | None = None
    done: Any = None
    try:
        async with asyncio.timeout(job.timeout):
            async for event in client.generate(call):
                if first is None:
                    first = time.perf_counter()
                if isinstance(event, EngineDone):
                    done = event
    except TimeoutError:
        tally.error("timeout")
        return
    except EngineError as exc:
        tally.error(exc.code, exc.message)
        return
    end = time.perf_counter()
    if done is None or done.finish_reason not in ("length", "stop"):
        tally.error("finish " + (done.finish_reason if done else "missing"))
        return
    first_chunk = first - t0 if job.stream and first is not None else None
    tally.ok(done.completion_tokens, end - t0, None, first_chunk)


def _usage_tokens(tail: bytes) -> int | None:
    """`output_tokens` of the last `message_delta` event in a stream's tail."""
    at = tail.rfind(b"event: message_delta\ndata: ")
    if at < 0:
        return None
    line = tail[at:].split(b"\n", 2)[1][len(b"data: ") :]
    try:
        return int(orjson.loads(line)["usage"]["output_tokens"])
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        return None


async def _gateway_one(session: Any, url: str, body: bytes, job: Job, tally: _Tally) -> None:
    import aiohttp

    t0 = time.perf_counter()
    try:
        async with session.post(url, data=body) as resp:
            if resp.status != 200:
                tally.error(f"status {resp.status}", (await resp.read())[:200].decode("utf-8", "replace"))
                return
            if not job.stream:
                data = await resp.read()
                end = time.perf_counter()
                try:
                    message = orjson.loads(data)
                    tokens = int(message["usage"]["output_tokens"])
                except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                    tally.error("not a message", data[:200].decode("utf-8", "replace"))
                    return
                tally.ok(tokens, end - t0, None, None)
                return
            first: float | None = None
            first_text: float | None = None
            failed = False
            tail = b""
            async for chunk in resp.content.iter_any():
                now = time.perf_counter()
                if first is None:
                    first = now
                # A marker may straddle two reads: look at the end of the last one too.
                seen = tail[-32:] + chunk
                if first_text is None and b'"text_delta"' in seen:
                    first_text = now
                failed = failed or b"event: error" in seen
                tail = (tail + chunk)[-_TAIL:]
            end = time.perf_counter()
    except TimeoutError:
        tally.error("timeout")
        return
    except (aiohttp.ClientError, OSError) as exc:
        tally.error(type(exc).__name__, str(exc))
        return
    counted = _usage_tokens(tail)
    if failed:
        tally.error("error event in stream", tail[-300:].decode("utf-8", "replace"))
    elif first is None or b"event: message_stop" not in tail or counted is None:
        tally.error("broken stream", tail[-300:].decode("utf-8", "replace"))
    else:
        tally.ok(counted, end - t0, first - t0, first_text - t0 if first_text is not None else None)


async def _phase(
    one: Callable[[_Tally], Awaitable[None]], job: Job, requests: int | None, duration: float | None
) -> tuple[_Tally, int, float]:
    """``requests`` requests, or as many as start within ``duration``, from ``concurrency``
    closed-loop clients; the tally, the number sent and the time until the last one ended."""
    tally = _Tally(job.output_tokens)
    started = 0
    t0 = time.perf_counter()
    deadline = t0 + duration if duration is not None else math.inf

    async def client() -> None:
        nonlocal started
        while (requests is None or started < requests) and time.perf_counter() < deadline:
            started += 1
            await one(tally)

    await asyncio.gather(*(client() for _ in range(job.concurrency)))
    return tally, started, time.perf_counter() - t0


def _counts(tally: _Tally, sent: int) -> dict[str, Any]:
    return {
        "requests": sent,
        "ok": len(tally.latency),
        "errors": sum(tally.errors.values()),
        "error_kinds": dict(tally.errors),
        "error_samples": tally.samples,
    }


def _cpu_sum(pids: list[int]) -> float | None:
    values = [_cpu_seconds(pid) for pid in pids]
    return None if any(v is None for v in values) else sum(v for v in values if v is not None)


def _rss_mb(pids: list[int]) -> float | None:
    """Resident memory of `pids` and their children together, in MB, from /proc."""
    values = [rss_mb(pid) for pid in pids]
    return None if any(v is None for v in values) else round(sum(v for v in values if v is not None), 1)


async def _measure(job: Job, one: Callable[[_Tally], Awaitable[None]]) -> dict[str, Any]:
    """Warm up, then measure on the same connections; CPU times are read around the measured phase."""
    warm = None
    if job.warmup > 0:
        warm_tally, warm_sent, _ = await _phase(one, job, None, job.warmup)
        warm = _counts(warm_tally, warm_sent)
    duration = job.duration if job.duration is not None or job.requests is not None else 1.0
    before = {name: _cpu_sum(pids) for name, pids in job.watch_pids.items()}
    own0 = time.process_time()
    tally, sent, elapsed = await _phase(one, job, job.requests, duration)
    own = time.process_time() - own0
    after = {name: _cpu_sum(pids) for name, pids in job.watch_pids.items()}
    rss = {name: _rss_mb(pids) for name, pids in job.watch_pids.items()}
    cpu: dict[str, float | None] = {}
    for name in job.watch_pids:
        b, a = before[name], after[name]
        cpu[name] = round((a - b) * 1e6 / tally.tokens, 2) if a is not None and b is not None and tally.tokens else None
    result: dict[str, Any] = {
        **_counts(tally, sent),
        "elapsed_s": round(elapsed, 4),
        "tokens": tally.tokens,
        "tokens_per_s": round(tally.tokens / elapsed, 1) if elapsed > 0 else 0.0,
        "rps": round(len(tally.latency) / elapsed, 2) if elapsed > 0 else 0.0,
        "latency_ms": percentiles(tally.latency, (0.5, 0.95)),
        "cpu_ms_per_1k_tokens": cpu,
        "cpu_ms_per_request": {
            name: round(v * tally.tokens / 1000 / len(tally.latency), 3) if v is not None and tally.latency else None
            for name, v in cpu.items()
        },
        "rss_mb": rss,
        "generator_cpu": round(own / elapsed, 3) if elapsed > 0 else 0.0,
    }
    if job.stream:
        result["first_token_ms"] = percentiles(tally.first_token, (0.5, 0.95))
        if job.kind == "gateway":
            result["first_event_ms"] = percentiles(tally.first_event, (0.5, 0.95))
    if warm is not None:
        result["warmup"] = warm
    return result


async def run_direct(job: Job) -> dict[str, Any]:
    from smg.backends.grpc.engines import connect

    client = connect("sglang", job.url)
    try:
        return await _measure(job, lambda tally: _direct_one(client, job, tally))
    finally:
        await client.close()


async def run_gateway(job: Job) -> dict[str, Any]:
    import aiohttp

    body = orjson.dumps(
        {
            "model": job.model,
            "max_tokens": job.output_tokens,
            "messages": [{"role": "user", "content": PROMPT}],
            "stream": job.stream,
        }
    )
    url = job.url.rstrip("/") + "/v1/messages"
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=job.concurrency),
        headers=_HEADERS,
        timeout=aiohttp.ClientTimeout(total=job.timeout),
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )
    async with session:
        return await _measure(job, lambda tally: _gateway_one(session, url, body, job, tally))


def run_job(job: Job) -> dict[str, Any]:
    """One job on its best event loop: grpc.aio runs faster on asyncio's own, aiohttp on uvloop."""
    if job.concurrency < 1 or job.output_tokens < 1:
        raise ValueError("concurrency and output_tokens must be at least 1")
    if job.kind == "direct":
        return asyncio.run(run_direct(job))
    if job.kind != "gateway":
        raise ValueError(f"unknown job kind {job.kind!r}")
    return on_uvloop(run_gateway(job))


class GrpcGenerator(Generator):
    """This module's load generator process (``--serve``); jobs and answers as in the relay bench."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.bench.grpc", "--serve"],
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the driver only; it stops this process
            )


# --- the driver ----------------------------------------------------------------------------------


@dataclass
class Setup:
    """The started processes and what every job needs to know about them."""

    engine: Spawned
    gateways: dict[str, Spawned]
    script: dict[str, Any]
    prompt_ids: list[int]
    prompt_text: str


def answer_ids(count: int) -> list[int]:
    """``count`` ordinary token ids of a plain English answer (repeated as needed)."""
    from tokenizers import Tokenizer

    ids: list[int] = Tokenizer.from_file(str(QWEN3 / "tokenizer.json")).encode(ANSWER, add_special_tokens=False).ids
    return (ids * (count // len(ids) + 1))[:count]


def _start(args: argparse.Namespace, workdir: Path, started: list[Spawned]) -> Setup:
    """The engine, then both gateways in parallel; one priming request through each."""
    engine = spawn_engine(
        "sglang", QWEN3, ["--served-model-name", MODEL, "--max-context-length", str(WINDOW)], timeout=60.0
    )
    started.append(engine)
    script = {"token_ids": answer_ids(args.output_tokens), "eos": False, "chunk_size": 1}
    gateways: dict[str, Spawned] = {}

    def start(target: Target) -> Spawned:
        if target.reference:
            return reference.spawn_reference([engine.url], QWEN3, PARSERS)
        journal = workdir / f"journal-{target.key}.db" if target.journal else None
        extra = ["--model-path", str(QWEN3), "--disable-retries", "--log-level", "warning"]
        extra += ["--tool-call-parser", PARSERS[0], "--reasoning-parser", PARSERS[1]]
        if target.workers != 1:  # only then: a checkout from before --workers can be measured too
            extra += ["--workers", str(target.workers)]
        return spawn_gateway([engine.url], journal=journal, extra=extra, timeout=60.0, root=args.gateway_root)

    targets = [t for t in TARGETS if (t.journal is not None or t.reference) and t.key in args.targets]
    failure: BaseException | None = None
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        futures = {t.key: pool.submit(start, t) for t in targets}
        for key, future in futures.items():
            try:
                gateways[key] = future.result()
                started.append(gateways[key])
            except BaseException as exc:  # keep collecting so every started gateway gets stopped
                failure = failure or exc
    if failure is not None:
        raise failure
    with EngineControl(engine.url) as control:
        control.script(default=script)
        if not gateways:
            # The prompt the gateway would send, read back from one priming gateway.
            extra = ["--model-path", str(QWEN3), "--disable-retries"]
            with spawn_gateway([engine.url], extra=extra, timeout=60.0) as primer:
                return _prime(engine, {"primer": primer}, script, control)
        return _prime(engine, gateways, script, control)


def _prime(engine: Spawned, gateways: dict[str, Spawned], script: dict[str, Any], control: EngineControl) -> Setup:
    """One request through each gateway (it must answer in full); the prompt as the engine got it."""
    body = {"model": MODEL, "max_tokens": len(script["token_ids"]), "messages": [{"role": "user", "content": PROMPT}]}
    prompts: list[tuple[list[int], str]] = []
    reference_prompt: tuple[list[int], str] = ([], "")
    for key, gateway in gateways.items():
        response = httpx.post(f"{gateway.url}/v1/messages", json=body, timeout=30.0)
        if response.status_code != 200 or response.json()["usage"]["output_tokens"] != len(script["token_ids"]):
            raise RuntimeError(f"{key} answered the priming request with {response.status_code}: {response.text}")
        tokenized = control.received()[-1]["tokenized"]
        prompt = ([int(i) for i in tokenized["input_ids"]], tokenized.get("original_text", ""))
        if key == REFERENCE.key:
            reference_prompt = prompt  # its own rendering; only ours must agree with each other
        else:
            prompts.append(prompt)
    prompts = prompts or [reference_prompt]
    if any(p != prompts[0] for p in prompts):
        raise RuntimeError("the gateways sent the engine different prompts")
    ids, text = prompts[0]
    return Setup(engine, {k: g for k, g in gateways.items() if k != "primer"}, script, ids, text)


def _measure_all(args: argparse.Namespace, setup: Setup, generator: Generator) -> list[dict[str, Any]]:
    """Every scenario, round after round, each round running every target once."""
    targets = [t for t in TARGETS if t.key in args.targets]
    cells = [(m == "stream", c) for m in args.modes for c in args.concurrency]
    runs: list[dict[str, Any]] = []
    engine_pid = setup.engine.proc.pid
    with EngineControl(setup.engine.url) as control, Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench", total=len(cells) * args.reps * len(targets))
        for stream, conc in cells:
            for rep in range(args.reps):
                shift = rep % len(targets)  # rotate the order so no target always runs first
                for target in targets[shift:] + targets[:shift]:
                    progress.update(task, description=f"{scenario_name(stream, conc)} {target.key}")
                    gateway = setup.gateways.get(target.key)
                    pids = {"engine": [engine_pid]} | ({"gateway": _gateway_pids(gateway)} if gateway else {})
                    job = Job(
                        kind="gateway" if gateway else "direct",
                        url=gateway.url if gateway else setup.engine.url,
                        stream=stream,
                        concurrency=conc,
                        output_tokens=args.output_tokens,
                        prompt_ids=setup.prompt_ids,
                        prompt_text=setup.prompt_text,
                        requests=args.requests,
                        duration=None if args.requests else args.duration,
                        warmup=args.warmup,
                        watch_pids=pids,
                    )
                    result = generator.run(asdict(job))
                    runs.append({"stream": stream, "concurrency": conc, "target": target.key, "rep": rep, **result})
                    # The engine records every request: drop them so its memory (and work) stays flat.
                    control.reset()
                    control.script(default=setup.script)
                    progress.advance(task)
    for name, proc in [("engine", setup.engine), *setup.gateways.items()]:
        if proc.proc.poll() is not None:
            raise RuntimeError(f"{name} exited during the bench:\n{proc.log()[-2000:]}")
    return runs


def _gateway_pids(gateway: Spawned) -> list[int]:
    """The gateway's process and, with `--workers`, the processes it forked."""
    pid = gateway.proc.pid
    try:
        children = [int(x) for x in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        children = []
    return [pid, *children]


def _header(args: argparse.Namespace, setup: Setup, load_before: str) -> list[str]:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    span = f"{args.requests} requests" if args.requests else f"{args.duration:g} s"
    return [
        f"[bold]smg gRPC path bench[/] - {cores} cores ({usable} usable), {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, loopback; engine, gateways and load generator share the cores",
        f"load average 1/5/15 min: {load_before} before, {load_average()} after (other work shares the cores)",
        f"scripted SGLang engine (qwen3 fixture): {args.output_tokens} output tokens per request, 1 per chunk, no "
        f"delay; prompt {len(setup.prompt_ids)} tokens",
        f"each run: {args.warmup:g} s warm-up + {span} measured; {args.reps} interleaved run(s) per cell; "
        "medians, ± = half the min-max range",
    ]


LEGEND = (
    "targets: direct = grpc.aio client on the engine (same prompt ids, same scripted answer); gw+J = gateway, "
    "journal on; gw-J = gateway, --no-journal",
    "columns: tok/s = output tokens/s (gateways: from the final usage); x-direct = tok/s / direct's in the same "
    "round; ttfe = ms to the first SSE byte;",
    "  1st tok = ms to the first text delta (direct: the first chunk); lat = ms to the last byte; gwCPU, engCPU = "
    "CPU ms per 1,000 output tokens;",
    "  gen = load generator CPU (near 100%: the generator is the limit); err = failed requests",
    "ratios (x-direct, summary): the median of the round-by-round ratios, not the ratio of the medians",
)


def scenario_name(stream: bool, concurrency: int) -> str:
    return f"{'stream' if stream else 'json'} c={concurrency}"


def _figure(run: dict[str, Any], name: str) -> float | None:
    if name in ("tokens_per_s", "rps"):
        return float(run[name])
    group, _, key = name.partition(".")
    value = run.get(group, {}).get(key)
    return float(value) if value is not None else None


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def _cell(runs: list[dict[str, Any]], name: str) -> float | None:
    return _median([_figure(r, name) for r in runs])


def _spread(runs: list[dict[str, Any]], name: str) -> float | None:
    values = [v for r in runs if (v := _figure(r, name)) is not None]
    if len(values) < 2 or not statistics.median(values):
        return None
    return (max(values) - min(values)) / 2 / statistics.median(values)


def _ratio(by_target: dict[str, list[dict[str, Any]]], num: str, den: str, name: str) -> float | None:
    """Median of the run-by-run (same round) ratios num/den of a figure."""
    if num not in by_target or den not in by_target:
        return None
    by_rep = {r["rep"]: _figure(r, name) for r in by_target[den]}
    ratios = [
        a / b
        for r in by_target[num]
        if (a := _figure(r, name)) is not None and (b := by_rep.get(r["rep"])) not in (None, 0.0)
    ]
    return statistics.median(ratios) if ratios else None


def group(runs: list[dict[str, Any]]) -> dict[tuple[bool, int], dict[str, list[dict[str, Any]]]]:
    """Runs by scenario (stream, concurrency), then by target key, in the order they ran."""
    out: dict[tuple[bool, int], dict[str, list[dict[str, Any]]]] = {}
    for run in runs:
        out.setdefault((run["stream"], run["concurrency"]), {}).setdefault(run["target"], []).append(run)
    return out


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Aggregated figures and ratios per scenario, for the JSON file."""
    names = (
        "tokens_per_s",
        "rps",
        "latency_ms.p50",
        "latency_ms.p95",
        "first_event_ms.p50",
        "first_event_ms.p95",
        "first_token_ms.p50",
        "first_token_ms.p95",
        "cpu_ms_per_1k_tokens.gateway",
        "cpu_ms_per_1k_tokens.engine",
    )
    out: dict[str, Any] = {}
    for (stream, conc), by_target in group(runs).items():
        entry: dict[str, Any] = {"targets": {}, "ratios": {}}
        for key, cell in by_target.items():
            figures: dict[str, Any] = {n: _cell(cell, n) for n in names}
            figures["errors"] = sum(r["errors"] + r.get("warmup", {}).get("errors", 0) for r in cell)
            entry["targets"][key] = figures
        for key in ("gw+J", "gw-J"):
            entry["ratios"][f"{key}/direct tokens_per_s"] = _ratio(by_target, key, "direct", "tokens_per_s")
        entry["ratios"]["gw+J/gw-J gateway cpu"] = _ratio(by_target, "gw+J", "gw-J", "cpu_ms_per_1k_tokens.gateway")
        out[scenario_name(stream, conc)] = entry
    return out


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _table(first: str) -> Table:
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1), header_style="bold")
    table.add_column(first, no_wrap=True)
    return table


def scenario_table(stream: bool, concurrency: int, by_target: dict[str, list[dict[str, Any]]]) -> Table:
    """One scenario: a row per target."""
    table = _table(scenario_name(stream, concurrency))

    def tokens(runs: list[dict[str, Any]]) -> str:
        spread = _spread(runs, "tokens_per_s")
        return _num(_cell(runs, "tokens_per_s"), 0) + (f" ±{spread:.0%}" if spread is not None else "")

    def figure(name: str, digits: int = 2) -> Callable[[list[dict[str, Any]]], str]:
        return lambda runs: _num(_cell(runs, name), digits)

    def errors(runs: list[dict[str, Any]]) -> Text:
        measured = sum(r["errors"] for r in runs)
        warm = sum(r.get("warmup", {}).get("errors", 0) for r in runs)
        return Text(f"{measured}" + (f" (+{warm} warm)" if warm else ""), style="bold red" if measured + warm else "")

    columns: list[tuple[str, Callable[[list[dict[str, Any]]], str | Text]]] = [("tok/s", tokens)]
    columns.append(("x-direct", lambda runs: _num(_ratio(by_target, runs[0]["target"], "direct", "tokens_per_s"), 3)))
    columns.append(("req/s", figure("rps", 1)))
    if stream:
        columns += [(f"ttfe {q}", figure(f"first_event_ms.{q}")) for q in ("p50", "p95")]
        columns += [(f"1st tok {q}", figure(f"first_token_ms.{q}")) for q in ("p50", "p95")]
    columns += [(f"lat {q}", figure(f"latency_ms.{q}")) for q in ("p50", "p95")]
    columns += [
        ("gwCPU", figure("cpu_ms_per_1k_tokens.gateway", 1)),
        ("engCPU", figure("cpu_ms_per_1k_tokens.engine", 1)),
        ("gen", lambda runs: _num(_median([r["generator_cpu"] * 100 for r in runs]), 0) + "%"),
        ("err", errors),
    ]
    for title, _ in columns:
        table.add_column(title, justify="right")
    for target in TARGETS:
        if target.key in by_target:
            table.add_row(target.key, *(fn(by_target[target.key]) for _, fn in columns))
    return table


def summary_table(grouped: dict[tuple[bool, int], dict[str, list[dict[str, Any]]]]) -> Table:
    """The headline: tokens/s direct vs through the gateway, TTFE, gateway CPU per 1k tokens."""
    table = _table("summary")
    titles = (
        "direct tok/s",
        "gw+J tok/s",
        "+J/direct",
        "gw-J tok/s",
        "-J/direct",
        "ttfe p50 +J",
        "ttfe p50 -J",
        "direct 1st chunk p50",
        "gwCPU/1k +J",
        "gwCPU/1k -J",
        "CPU +J/-J",
    )
    for title in titles:
        table.add_column(title, justify="right")
    for (stream, conc), by_target in grouped.items():

        def cell(key: str, name: str, digits: int = 1, runs: dict[str, list[dict[str, Any]]] = by_target) -> str:
            return _num(_cell(runs[key], name), digits) if key in runs else "-"

        table.add_row(
            scenario_name(stream, conc),
            cell("direct", "tokens_per_s", 0),
            cell("gw+J", "tokens_per_s", 0),
            _num(_ratio(by_target, "gw+J", "direct", "tokens_per_s"), 3),
            cell("gw-J", "tokens_per_s", 0),
            _num(_ratio(by_target, "gw-J", "direct", "tokens_per_s"), 3),
            cell("gw+J", "first_event_ms.p50", 2),
            cell("gw-J", "first_event_ms.p50", 2),
            cell("direct", "first_token_ms.p50", 2),
            cell("gw+J", "cpu_ms_per_1k_tokens.gateway"),
            cell("gw-J", "cpu_ms_per_1k_tokens.gateway"),
            _num(_ratio(by_target, "gw+J", "gw-J", "cpu_ms_per_1k_tokens.gateway"), 2),
        )
    return table


def comparison_table(grouped: dict[tuple[bool, int], dict[str, list[dict[str, Any]]]]) -> Table:
    """This gateway against the reference (`--compare`): the ratios the performance goals name."""
    table = _table("vs reference")
    titles = (
        "ref CPU/req ms",
        "gw+J CPU/req ms",
        "gw+J/ref CPU",
        "gw-J/ref CPU",
        "gw+J/ref tok/s",
        "+J/-J tok/s",
        "x2/x1 tok/s",
        "ttfe ref",
        "ttfe gw+J",
        "RSS ref MB",
        "RSS gw+J MB",
        "RSS x2 MB",
    )
    for title in titles:
        table.add_column(title, justify="right")
    cpu = "cpu_ms_per_request.gateway"
    for (stream, conc), by_target in grouped.items():

        def cell(key: str, name: str, digits: int = 2, by_target: dict[str, list[dict[str, Any]]] = by_target) -> str:
            return _num(_cell(by_target[key], name), digits) if key in by_target else "-"

        def ratio(a: str, b: str, name: str, by_target: dict[str, list[dict[str, Any]]] = by_target) -> str:
            return _num(_ratio(by_target, a, b, name), 2) if a in by_target and b in by_target else "-"

        table.add_row(
            scenario_name(stream, conc),
            cell("ref", cpu, 3),
            cell("gw+J", cpu, 3),
            ratio("gw+J", "ref", cpu),
            ratio("gw-J", "ref", cpu),
            ratio("gw+J", "ref", "tokens_per_s"),
            ratio("gw+J", "gw-J", "tokens_per_s"),
            ratio("gw+Jx2", "gw+J", "tokens_per_s"),
            cell("ref", "first_event_ms.p50") if stream else "-",
            cell("gw+J", "first_event_ms.p50") if stream else "-",
            cell("ref", "rss_mb.gateway", 0),
            cell("gw+J", "rss_mb.gateway", 0),
            cell("gw+Jx2", "rss_mb.gateway", 0),
        )
    return table


def journal_bytes(workdir: Path) -> list[str]:
    """Bytes on disk per output token of each journal a gateway wrote (pages in use, WAL included)."""
    lines = []
    for path in sorted(workdir.glob("journal-*.db")):
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)
        try:
            pages = conn.execute("PRAGMA page_count").fetchone()[0]
            pages -= conn.execute("PRAGMA freelist_count").fetchone()[0]
            used = pages * conn.execute("PRAGMA page_size").fetchone()[0]
            tokens = conn.execute("SELECT sum(output_tokens), count(*) FROM requests").fetchone()
        finally:
            conn.close()
        if tokens[0]:
            key = path.stem.removeprefix("journal-")
            lines.append(
                f"journal of {key}: {used / tokens[0]:.1f} B per output token ({used:,} B, {tokens[1]:,} requests,"
                f" {tokens[0]:,} output tokens)"
            )
    return lines


def render(console: Console, header: list[str], runs: list[dict[str, Any]]) -> None:
    for line in header:
        console.print(line, highlight=False)
    for line in LEGEND:
        console.print(line, highlight=False, markup=False)
    grouped = group(runs)
    for (stream, conc), by_target in grouped.items():
        console.print(scenario_table(stream, conc, by_target))
    console.print(summary_table(grouped))
    if any("ref" in by_target for by_target in grouped.values()):
        console.print(comparison_table(grouped))
    for run in runs:
        warm = run.get("warmup", {})
        if run["errors"] or warm.get("errors"):
            console.print(
                f"[bold red]errors[/] {scenario_name(run['stream'], run['concurrency'])}, {run['target']} "
                f"(run {run['rep'] + 1}): {run['error_kinds']} warm-up {warm.get('error_kinds', {})}",
                highlight=False,
            )
            for sample in (run["error_samples"] + warm.get("error_samples", []))[:3]:
                console.print(f"    {sample}", highlight=False, markup=False)


def run_bench(args: argparse.Namespace, console: Console) -> tuple[list[dict[str, Any]], list[str]]:
    """Start everything, measure, stop everything (also on errors and Ctrl-C); logs stay after an error."""
    started: list[Spawned] = []
    generator: Generator | None = None
    workdir = Path(tempfile.mkdtemp(prefix="smg-bench-grpc-"))
    failed = False
    load_before = load_average()
    try:
        generator = GrpcGenerator(workdir / "load.log")
        setup = _start(args, workdir, started)
        runs = _measure_all(args, setup, generator)
        return runs, _header(args, setup, load_before) + journal_bytes(workdir)
    except BaseException:
        failed = True
        raise
    finally:
        if generator is not None:
            generator.stop()
        stop_all(started, workdir, failed=failed, console=console)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.grpc", description=__doc__)
    parser.add_argument("--serve", action="store_true", help="be the load generator: JSON job lines on stdin")
    parser.add_argument("--quick", action="store_true", help="short runs, one round, 64 tokens, c=1,8 (a few s)")
    parser.add_argument("--duration", type=float, help=f"seconds measured per run (default {DEFAULTS['duration']})")
    parser.add_argument("--requests", type=int, help="requests measured per run, instead of a duration")
    parser.add_argument("--warmup", type=float, help=f"seconds of warm-up per run (default {DEFAULTS['warmup']})")
    parser.add_argument("--reps", type=int, help=f"interleaved runs per cell (default {DEFAULTS['reps']})")
    parser.add_argument("--concurrency", type=csv_ints, help="comma-separated (default 1,16,64)")
    parser.add_argument("--modes", type=csv_list, default=["stream", "json"], help="stream,json")
    parser.add_argument("--output-tokens", type=int, help=f"tokens per answer (default {DEFAULTS['output_tokens']})")
    parser.add_argument(
        "--targets",
        type=csv_list,
        default=list(DEFAULT_TARGETS),
        help="comma-separated from: " + ", ".join(f"{t.key} ({t.label})" for t in TARGETS),
    )
    parser.add_argument("--json", type=Path, help="write the raw runs and the summary here")
    parser.add_argument("--gateway-root", type=Path, help="run the gateway of this checkout (a 'before' figure)")
    parser.add_argument(
        "--compare",
        action="store_true",
        help="measure the reference gateway (installed on demand) and --workers 2 beside this one",
    )
    args = parser.parse_args(argv)
    if args.serve:
        return args
    if args.compare:
        args.targets = list(dict.fromkeys([*args.targets, REFERENCE.key, "gw+Jx2"]))
    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    unknown = set(args.targets) - {t.key for t in TARGETS}
    if unknown or not args.targets:
        parser.error(f"--targets: unknown {sorted(unknown)}; choose from {[t.key for t in TARGETS]}")
    if set(args.modes) - {"json", "stream"} or not args.modes:
        parser.error("--modes: stream and/or json")
    if not args.concurrency or min(args.concurrency) < 1 or args.reps < 1 or args.output_tokens < 1:
        parser.error("--concurrency, --reps and --output-tokens need positive values")
    if args.output_tokens >= WINDOW - 64:
        parser.error(f"--output-tokens must leave room for the prompt in the {WINDOW}-token window")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve:
        serve_jobs(lambda job: run_job(Job.from_dict(job)))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 180)
    return run_and_report(args, console, run_bench, render, summary)


if __name__ == "__main__":
    sys.exit(main())
