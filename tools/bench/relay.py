"""The relay bench: the gateway's added latency and its throughput against the worker itself.

One scripted worker, the floor (``tools.bench.floor``: a bare relay on the gateway's own stack)
and one gateway per configuration (journal on/off x upstream transport aiohttp, and httpx on
request) start once; then, per scenario (streaming or not, at each concurrency), every
target runs in turn, round after round, so each gateway figure has a direct-to-worker baseline
measured moments before or after it. The load comes from ``tools.bench.load`` in a process of
its own; a run is a warm-up then a measured stretch on the same connections. Gateways run with
``--disable-retries``, so a failure is counted, never retried away. Every process started here
is stopped on the way out, on errors and Ctrl-C too.

Run: ``python -m tools.bench.relay [--quick] [--duration S | --requests N] [--reps R]
[--concurrency 1,16,64] [--targets direct,httpx+J,...] [--json PATH] [--pin]``.
Exit status 1 when any request failed.
"""

from __future__ import annotations

import argparse
import os
import platform
import signal
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import orjson
from rich.console import Console
from rich.progress import Progress

from tools.bench import reference
from tools.bench.common import csv_ints, csv_list, load_average, run_and_report, stop_all
from tools.bench.report import DIRECT, REFERENCE, TARGETS, Run, Target, render, scenario_name, summary
from tools.spawn import REPO_ROOT, Spawned, free_port, spawn, spawn_gateway, spawn_worker

DEFAULTS = {"duration": 1.0, "warmup": 0.3, "reps": 3}
QUICK = {"duration": 0.3, "warmup": 0.1, "reps": 1}


class Generator:
    """The load generator process (``tools.bench.load --serve``): one job line in, one result out."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tools.bench.load", "--serve"],
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # Ctrl-C reaches the driver only; it stops this process
            )

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(orjson.dumps(job) + b"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"load generator exited ({self.proc.poll()}):\n{self.log_path.read_text()[-2000:]}")
        result: dict[str, Any] = orjson.loads(line)
        if "fatal" in result:
            raise RuntimeError(f"load generator refused a job: {result['fatal']}")
        return result

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()  # end of input: it exits after the current job
            except OSError:
                pass
            try:
                self.proc.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def _gateway_args(target: Target) -> list[str]:
    return ["--disable-retries", "--upstream-transport", target.transport or "httpx"]


def _start_servers(
    targets: list[Target], workdir: Path, started: list[Spawned], root: Path | None = None
) -> dict[str, Spawned]:
    """Start the worker, then the gateways in parallel; every started process lands in ``started``."""
    worker = spawn_worker()
    started.append(worker)
    servers = {DIRECT.key: worker}
    gateways = [t for t in targets if t.journal is not None or t.reference or t.floor]

    def start(target: Target) -> Spawned:
        if target.reference:
            return reference.spawn_reference([worker.url])
        if target.floor:
            port = free_port()
            args = [sys.executable, "-m", "tools.bench.floor", "--port", str(port), "--worker-url", worker.url]
            args += ["--httpx"] if target.transport == "httpx" else []
            return spawn(args, ready_url=f"http://127.0.0.1:{port}/health", url=f"http://127.0.0.1:{port}")
        journal = workdir / f"journal-{target.key}.db" if target.journal else None
        return spawn_gateway([worker.url], journal=journal, extra=_gateway_args(target), root=root)

    with ThreadPoolExecutor(max_workers=max(1, len(gateways))) as pool:
        futures = {t.key: pool.submit(start, t) for t in gateways}
        failure: BaseException | None = None
        for key, future in futures.items():
            try:
                servers[key] = future.result()
                started.append(servers[key])
            except BaseException as exc:  # keep collecting so every started gateway gets stopped
                failure = failure or exc
    if failure is not None:
        raise failure
    return servers


def _pin(cpus: set[int]) -> None:
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cpus)


def _start_all(
    args: argparse.Namespace, targets: list[Target], workdir: Path, started: list[Spawned]
) -> tuple[Generator, dict[str, Spawned], str]:
    """The load generator, the worker and the gateways; with ``--pin`` on separate cpus."""
    all_cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    if not (args.pin and len(all_cpus) >= 2):
        servers = _start_servers(targets, workdir, started, getattr(args, "gateway_root", None))
        return Generator(workdir / "load.log"), servers, "unpinned"
    gen_cpus, server_cpus = {max(all_cpus)}, all_cpus - {max(all_cpus)}
    try:
        # A child inherits the cpu mask of the thread that starts it, threads that of their creator.
        _pin(gen_cpus)
        generator = Generator(workdir / "load.log")
        _pin(server_cpus)
        servers = _start_servers(targets, workdir, started, getattr(args, "gateway_root", None))
    finally:
        _pin(all_cpus)
    return generator, servers, f"pinned to cpu {max(all_cpus)}, servers to cpus {sorted(server_cpus)}"


def _measure_all(
    args: argparse.Namespace, targets: list[Target], generator: Generator, servers: dict[str, Spawned]
) -> list[Run]:
    """Every scenario, round after round, each round running every target once."""
    worker = servers[DIRECT.key]
    cells = [(m == "stream", c) for m in args.modes for c in args.concurrency]
    runs: list[Run] = []
    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("bench", total=len(cells) * args.reps * len(targets))
        for stream, conc in cells:
            for rep in range(args.reps):
                shift = rep % len(targets)  # rotate the order so no target always runs first
                for target in targets[shift:] + targets[:shift]:
                    progress.update(task, description=f"{scenario_name(stream, conc)} {target.key}")
                    server = servers[target.key]
                    job = {
                        "url": server.url,
                        "stream": stream,
                        "concurrency": conc,
                        "requests": args.requests,
                        "duration": None if args.requests else args.duration,
                        "warmup": args.warmup,
                        "prompt_words": args.prompt_words,
                        "watch_pids": sorted({server.proc.pid, worker.proc.pid}),
                    }
                    result = generator.run(job)
                    runs.append(
                        {
                            "stream": stream,
                            "concurrency": conc,
                            "target": target.key,
                            "rep": rep,
                            "gateway_pid": server.proc.pid if target.key != DIRECT.key else None,
                            "worker_pid": worker.proc.pid,
                            **result,
                        }
                    )
                    # The worker records every request; drop them so its memory stays flat.
                    httpx.delete(f"{worker.url}/_received", timeout=10.0).raise_for_status()
                    progress.advance(task)
    for key, server in servers.items():
        if server.proc.poll() is not None:
            raise RuntimeError(f"{key} exited during the bench:\n{server.log()[-2000:]}")
    return runs


def _header(args: argparse.Namespace, pinned: str, load_before: str) -> list[str]:
    cores = os.cpu_count()
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else cores
    span = f"{args.requests} requests" if args.requests else f"{args.duration:g} s"
    return [
        f"[bold]smg relay bench[/] - {cores} cores ({usable} usable), {platform.system()} {platform.machine()}, "
        f"Python {platform.python_version()}, loopback; load generator: aiohttp, own process, {pinned}",
        f"load average 1/5/15 min: {load_before} before, {load_average()} after (other work shares the cores)",
        f"each run: {args.warmup:g} s warm-up + {span} measured; {args.reps} interleaved run(s) per cell; "
        "medians, ± = half the min-max range",
        f"echo of a {args.prompt_words}-word prompt (streams: ~{args.prompt_words + 7} SSE events); "
        "gateways run with --disable-retries",
    ]


def run_bench(args: argparse.Namespace, console: Console) -> tuple[list[Run], list[str]]:
    """Start everything, measure, stop everything (also on errors and Ctrl-C); logs stay after an error."""
    targets = [t for t in TARGETS if t.key in args.targets]
    started: list[Spawned] = []
    generator: Generator | None = None
    workdir = Path(tempfile.mkdtemp(prefix="smg-bench-"))
    failed = False
    load_before = load_average()
    try:
        generator, servers, pinned = _start_all(args, targets, workdir, started)
        return _measure_all(args, targets, generator, servers), _header(args, pinned, load_before)
    except Exception:
        failed = True
        raise
    finally:
        if generator is not None:
            generator.stop()
        stop_all(started, workdir, failed=failed, console=console)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m tools.bench.relay", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short runs, one round (~20 s)")
    parser.add_argument("--duration", type=float, help=f"seconds measured per run (default {DEFAULTS['duration']})")
    parser.add_argument("--requests", type=int, help="requests measured per run, instead of a duration")
    parser.add_argument("--warmup", type=float, help=f"seconds of warm-up per run (default {DEFAULTS['warmup']})")
    parser.add_argument("--reps", type=int, help=f"interleaved runs per cell (default {DEFAULTS['reps']})")
    parser.add_argument("--concurrency", type=csv_ints, default=[1, 16, 64], help="comma-separated")
    parser.add_argument("--modes", type=csv_list, default=["json", "stream"], help="json,stream")
    parser.add_argument(
        "--targets",
        type=csv_list,
        default=[t.key for t in TARGETS if not t.reference and t.transport != "httpx"],
        help="comma-separated from: " + ", ".join(f"{t.key} ({t.label})" for t in TARGETS),
    )
    parser.add_argument("--prompt-words", type=int, default=32, help="the echo streams one event per word")
    parser.add_argument("--pin", action="store_true", help="load generator on the last cpu, servers on the rest")
    parser.add_argument("--json", type=Path, help="write the raw runs and the summary here")
    parser.add_argument("--gateway-root", type=Path, help="run the gateway of this checkout (a 'before' figure)")
    parser.add_argument("--compare", action="store_true", help="measure the reference gateway beside this one")
    args = parser.parse_args(argv)
    preset = QUICK if args.quick else DEFAULTS
    for name, value in preset.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.compare and REFERENCE.key not in args.targets:
        args.targets.append(REFERENCE.key)
    unknown = set(args.targets) - {t.key for t in TARGETS}
    if unknown or not args.targets:
        parser.error(f"--targets: unknown {sorted(unknown)}; choose from {[t.key for t in TARGETS]}")
    if set(args.modes) - {"json", "stream"} or not args.modes:
        parser.error("--modes: json and/or stream")
    if not args.concurrency or min(args.concurrency) < 1 or args.reps < 1:
        parser.error("--concurrency and --reps need positive values")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(width=None if sys.stdout.isatty() else 140)
    return run_and_report(args, console, run_bench, render, summary)


if __name__ == "__main__":
    sys.exit(main())
