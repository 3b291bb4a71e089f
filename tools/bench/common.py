"""What every bench driver shares: argument parsing helpers, the machine's load, stopping
the processes a run started (keeping their logs when the run failed), and a driver's end (its
tables, its raw figures as JSON, its exit status); and a load generator process's loop."""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any

import orjson
from rich.console import Console

from tools.spawn import Spawned


def csv_ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def csv_list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def load_average() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"


def stop_all(started: Sequence[Spawned], workdir: Path, *, failed: bool, console: Console) -> None:
    """Stop what a run started, newest first; keep the logs when it failed, else delete them."""
    for spawned in reversed(started):
        spawned.stop()
    if failed:
        logs = [str(workdir)] + [str(s.log_path) for s in started]
        console.print(f"[yellow]bench failed; logs kept: {', '.join(logs)}[/]", highlight=False)
        return
    shutil.rmtree(workdir, ignore_errors=True)
    for spawned in started:  # spawn() gives each process a log directory of its own
        if spawned.log_path.parent.name.startswith("smg-spawn-"):
            shutil.rmtree(spawned.log_path.parent, ignore_errors=True)


Runs = list[dict[str, Any]]


def run_and_report(
    args: argparse.Namespace,
    console: Console,
    bench: Callable[[argparse.Namespace, Console], tuple[Runs, list[str]]],
    render: Callable[[Console, list[str], Runs], None],
    summary: Callable[[Runs], dict[str, Any]],
) -> int:
    """Run a bench, show its tables, write its raw figures where `--json` names a file, and
    the exit status: 1 when a run (or its warm-up) had errors, 130 when interrupted."""
    # SIGTERM unwinds like Ctrl-C, through the finally that stops every process.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    try:
        runs, header = bench(args, console)
    except KeyboardInterrupt:
        console.print("[yellow]interrupted; every process started was stopped[/]")
        return 130
    render(console, header, runs)
    if args.json:
        settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
        payload = {"header": header, "settings": settings, "runs": runs, "summary": summary(runs)}
        args.json.write_bytes(orjson.dumps(payload, option=orjson.OPT_INDENT_2))
        console.print(f"raw figures written to {args.json}", highlight=False)
    return 1 if any(r["errors"] or r.get("warmup", {}).get("errors") for r in runs) else 0


def on_uvloop(coro: Coroutine[Any, Any, dict[str, Any]]) -> dict[str, Any]:
    """Run a load generator's coroutine on uvloop where it is installed (aiohttp runs faster
    there), else on asyncio's own loop."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: dict[str, Any] = uvloop.run(coro)
    return result


def serve_jobs(run: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """A load generator process (`--serve`): answer each JSON job line on stdin with one JSON
    result line; stop at end of input."""
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            out = run(orjson.loads(line))
        except Exception as exc:  # a bad job is answered, never fatal to the driver
            out = {"fatal": f"{type(exc).__name__}: {exc}"}
        sys.stdout.buffer.write(orjson.dumps(out) + b"\n")
        sys.stdout.flush()
